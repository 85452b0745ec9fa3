"""The chatfleet image: its name, its tag and what it declares (docs/deploy.md#the-image).

Two builds make it: the Containerfile (Docker or Podman) and `make image` (tools/build_image.py:
a Debian root file system from packages plus the project's wheel, written as an OCI archive with
no container daemon). Both read what the image declares from here or say the same (a test
compares the Containerfile with these constants), and `chatfleet deploy k8s` names the image
that `make image` tags in the checkout it runs from.

The tag is the version and the commit: `chatfleet:0.1.0-<12 hex digits of the commit>`, with
`-dirty` when the checkout has changes that are not committed (tracked or new files: what the
build copies), or plain `chatfleet:0.1.0` when the checkout is clean at the release tag
`v0.1.0`. Outside a git checkout (chatfleet installed from a wheel) the name is the version's.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from chatfleet import __version__

NAME = "chatfleet"
USER = "chatfleet"
UID = 10001  # numeric, so that Kubernetes' runAsNonRoot can verify it
VENV = "/opt/chatfleet"
PORT = 8080
HEALTH_PATH = "/health"
CONFIG_PATH = "/etc/chatfleet/gateway.yaml"
ENTRYPOINT = ("chatfleet", "gateway")
# the gateway's config as the Kubernetes manifests mount it, on every address of the container
CMD = ("--config", CONFIG_PATH, "--host", "0.0.0.0", "--port", str(PORT))
ENV = (("PATH", f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
       ("PYTHONDONTWRITEBYTECODE", "1"),  # the file system is read-only to the user
       ("PYTHONUNBUFFERED", "1"))  # log lines reach the container's log as they are written
STOP_SIGNAL = "SIGTERM"  # what Kubernetes sends; the gateway drains and exits 0 on it
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # .../chatfleet
GIT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Revision:
    """Where a checkout stands: its commit, whether anything differs from it, and whether the
    commit is the release tag of `version`."""

    commit: str  # 40 hex digits
    dirty: bool
    release: bool


def tag(version: str, rev: Revision | None) -> str:
    """The image's tag: the version alone for a clean release (or with no checkout), else the
    version and the commit."""
    if rev is None or (rev.release and not rev.dirty):
        return version
    return f"{version}-{rev.commit[:12]}" + ("-dirty" if rev.dirty else "")


def reference(version: str = __version__, rev: Revision | None = None) -> str:
    return f"{NAME}:{tag(version, rev)}"


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def checkout_revision(root: Path, version: str = __version__) -> Revision | None:
    """The revision of the git checkout at `root` (its top level), or None where `root` is not
    one or git is missing."""
    commit = _git(root, "rev-parse", "--verify", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=normal")
    tags = _git(root, "tag", "--points-at", "HEAD")
    if commit is None or status is None or tags is None:
        return None
    return Revision(commit.strip(), bool(status.strip()), f"v{version}" in tags.split())


def own_checkout() -> Path | None:
    """The checkout this chatfleet runs from (its sources under src/), or None when it runs
    from an installed wheel: a virtual environment inside a checkout is not that checkout."""
    top = _git(PACKAGE_ROOT, "rev-parse", "--show-toplevel")
    if top is None:
        return None
    root = Path(top.strip())
    return root if (root / "src" / NAME).resolve() == PACKAGE_ROOT else None


def default_reference() -> str:
    """The image `make image` tags in the checkout this chatfleet runs from; `chatfleet:VERSION`
    where it runs from no checkout."""
    root = own_checkout()
    return reference(__version__, checkout_revision(root) if root is not None else None)
