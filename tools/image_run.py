"""Run the image `make image` builds (tools/build_image.py) on this machine, with no daemon:
`PodmanRunner` loads the OCI archive into a podman store of its own (under a work folder,
removed by `close`) and runs it with the first OCI runtime that works here (crun, else runc);
`ChrootRunner` is the fallback that needs only root: the archive unpacked by umoci (the
runtime bundle a container runtime would get: root file system and process spec), then chroot
into it as the image's user with the image's environment, entrypoint and command. Both share
the host's network (the gateway binds 127.0.0.1), and both stop a container the way Kubernetes
does: its stop signal (SIGTERM), then SIGKILL after the grace period.

Used by tests/deploy/test_image.py and benchmarks/image_start.py; `archive_config` reads an
archive's index, manifest and configuration without unpacking it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STOP_TIMEOUT_PAD_S = 30.0  # how long after the grace period a stop may take to report


@dataclass(frozen=True)
class ArchiveView:
    index: dict[str, Any]
    manifest: dict[str, Any]
    config: dict[str, Any]

    @property
    def name(self) -> str:
        (entry,) = self.index["manifests"]
        return str(entry["annotations"]["org.opencontainers.image.ref.name"])


def archive_config(archive: Path) -> ArchiveView:
    """The index, the manifest and the image configuration of a one-image OCI archive."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> dict[str, Any]:
            f = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert f is not None, digest
            doc: dict[str, Any] = json.load(f)
            return doc

        f = tar.extractfile("index.json")
        assert f is not None
        index = json.load(f)
        (entry,) = index["manifests"]
        manifest = blob(entry["digest"])
        return ArchiveView(index, manifest, blob(manifest["config"]["digest"]))


def layer_members(archive: Path) -> list[list[tarfile.TarInfo]]:
    """The entries of each layer of the archive, in order."""
    view = archive_config(archive)
    out = []
    with tarfile.open(archive) as outer:
        for desc in view.manifest["layers"]:
            f = outer.extractfile(f"blobs/sha256/{desc['digest'].split(':', 1)[1]}")
            assert f is not None
            with tarfile.open(fileobj=f, mode="r|gz") as layer:
                out.append(list(layer))
    return out


@dataclass
class Container:
    """One run of the image: `proc` is the process whose stdout is the container's."""

    runner: Runner
    name: str
    proc: subprocess.Popen[bytes]
    started: float  # time.monotonic() when it was started

    def pid(self) -> int:
        """The pid (on this machine) of the container's first process."""
        return self.runner.pid_of(self)

    def stop(self, grace_s: float) -> tuple[int, float]:
        """The stop signal, then SIGKILL after `grace_s`: the exit status and the seconds
        from the signal to the exit."""
        return self.runner.stop(self, grace_s)


class Runner:
    kind = "?"

    def start(self, args: Sequence[str] | None = None,
              files: Mapping[str, bytes] | None = None,
              entrypoint: Sequence[str] | None = None) -> Container:
        raise NotImplementedError

    def pid_of(self, c: Container) -> int:
        raise NotImplementedError

    def stop(self, c: Container, grace_s: float) -> tuple[int, float]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class PodmanRunner(Runner):
    """podman with a store of its own (vfs: no mounts left behind), host
    network, and the open-file and process limits set explicitly (some sandboxes refuse
    podman's defaults)."""

    kind = "podman"

    def __init__(self, archive: Path) -> None:
        # in /tmp: podman refuses a run root path over 50 characters (pytest's temporary
        # folders under xdist are longer); close() removes it
        self.work = Path(tempfile.mkdtemp(prefix="cfpod-", dir="/tmp"))
        self.base = ["podman", "--root", str(self.work / "root"),
                     "--runroot", str(self.work / "run"), "--tmpdir", str(self.work / "tmp"),
                     "--storage-driver", "vfs",
                     "--events-backend", "file", "--cgroup-manager", "cgroupfs"]
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.limits = ["--ulimit", f"nofile={nofile[0]}:{nofile[1]}",
                       "--ulimit", "nproc=4096:4096"]
        self.archive = archive
        self.image = ""
        self.runtime = ""
        self.names: list[str] = []

    def podman(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.base, *args], capture_output=True, text=True,
                              timeout=timeout, check=False)

    def load(self) -> str:
        done = self.podman("load", "-i", str(self.archive))
        if done.returncode != 0:
            raise RuntimeError(f"podman load failed: {done.stderr.strip()[-500:]}")
        self.image = next(line.split(":", 1)[1].strip() for line in done.stdout.splitlines()
                          if line.startswith("Loaded image"))
        return self.image

    def probe(self) -> str | None:
        """Load the image and find an OCI runtime that runs it; None when one does, else
        why none does."""
        try:
            self.load()
        except (RuntimeError, OSError, subprocess.TimeoutExpired, StopIteration) as exc:
            return f"podman cannot load the archive here: {exc}"
        why = []
        for runtime in ("crun", "runc"):
            if shutil.which(runtime) is None:
                why.append(f"{runtime}: not installed")
                continue
            done = self.podman("run", "--rm", "--runtime", runtime, "--network", "host",
                               *self.limits, "--entrypoint", "chatfleet", self.image,
                               "--version", timeout=120)
            if done.returncode == 0:
                self.runtime = runtime
                return None
            why.append(f"{runtime}: {(done.stderr.strip() or done.stdout.strip())[-300:]}")
        return "podman runs no container here (" + "; ".join(why) + ")"

    def start(self, args: Sequence[str] | None = None,
              files: Mapping[str, bytes] | None = None,
              entrypoint: Sequence[str] | None = None) -> Container:
        name = f"chatfleet-test-{uuid.uuid4().hex[:8]}"
        mounts: list[str] = []
        for i, (path, data) in enumerate(sorted((files or {}).items())):
            host = self.work / "files" / name / str(i)
            host.parent.mkdir(parents=True, exist_ok=True)
            host.write_bytes(data)
            host.chmod(0o644)
            mounts += ["-v", f"{host}:{path}:ro"]
        create = ["create", "--name", name, "--runtime", self.runtime, "--network", "host",
                  *self.limits, *mounts]
        if entrypoint is not None:
            create += ["--entrypoint", json.dumps(list(entrypoint))]
        done = self.podman(*create, self.image, *(args or ()))
        if done.returncode != 0:
            raise RuntimeError(f"podman create failed: {done.stderr.strip()[-500:]}")
        self.names.append(name)
        t = time.monotonic()
        proc = subprocess.Popen([*self.base, "start", "--attach", name],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return Container(self, name, proc, t)

    def pid_of(self, c: Container) -> int:
        done = self.podman("inspect", "--format", "{{.State.Pid}}", c.name)
        return int(done.stdout.strip() or 0)

    def stop(self, c: Container, grace_s: float) -> tuple[int, float]:
        t = time.monotonic()
        subprocess.run([*self.base, "stop", "--time", str(int(grace_s)), c.name],
                       capture_output=True, timeout=grace_s + STOP_TIMEOUT_PAD_S, check=False)
        code = c.proc.wait(STOP_TIMEOUT_PAD_S)
        took = time.monotonic() - t
        done = self.podman("inspect", "--format", "{{.State.ExitCode}}", c.name)
        if done.returncode == 0 and done.stdout.strip():
            code = int(done.stdout.strip())
        return code, took

    def close(self) -> None:
        for name in self.names:
            self.podman("rm", "--force", "--time", "0", name)
        self.podman("rmi", "--all", "--force")
        shutil.rmtree(self.work, ignore_errors=True)


class ChrootRunner(Runner):
    """chroot into the archive's root file system, unpacked by umoci, as the image's user."""

    kind = "chroot"

    def __init__(self, archive: Path, work: Path) -> None:
        self.work = work
        self.archive = archive
        self.bundle = work / "bundle"
        self.spec: dict[str, Any] = {}

    def probe(self) -> str | None:
        missing = [t for t in ("umoci", "chroot") if shutil.which(t) is None]
        if missing:
            return f"missing: {' '.join(missing)}"
        if os.geteuid() != 0:
            return "chroot needs root"
        layout = self.work / "layout"
        layout.mkdir(parents=True, exist_ok=True)
        with tarfile.open(self.archive) as tar:
            tar.extractall(layout, filter="tar")
        # umoci takes a plain tag, not the name:tag the index carries
        index = json.loads((layout / "index.json").read_text())
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] = "run"
        (layout / "index.json").write_text(json.dumps(index))
        done = subprocess.run(["umoci", "unpack", "--image", f"{layout}:run",
                               str(self.bundle)], capture_output=True, text=True, check=False)
        shutil.rmtree(layout, ignore_errors=True)
        if done.returncode != 0:
            return f"umoci unpack failed: {done.stderr.strip()[-300:]}"
        self.spec = json.loads((self.bundle / "config.json").read_text())
        return None

    def argv(self, args: Sequence[str] | None, entrypoint: Sequence[str] | None) -> list[str]:
        process = self.spec["process"]
        user = process["user"]
        env = list(process.get("env", []))
        if args is None and entrypoint is None:
            cmd = list(process["args"])  # the image's entrypoint and command
        else:
            # as docker and podman do: a new entrypoint drops the image's command
            config = archive_config(self.archive).config["config"]
            first = list(entrypoint) if entrypoint is not None else config["Entrypoint"]
            rest = args if args is not None else [] if entrypoint is not None else config["Cmd"]
            cmd = first + list(rest)
        return ["chroot", f"--userspec={user['uid']}:{user['gid']}", "--groups=",
                str(self.bundle / "rootfs"), "env", "-i", *env, *cmd]

    def start(self, args: Sequence[str] | None = None,
              files: Mapping[str, bytes] | None = None,
              entrypoint: Sequence[str] | None = None) -> Container:
        rootfs = self.bundle / "rootfs"
        for path, data in (files or {}).items():
            target = rootfs / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o644)
        t = time.monotonic()
        proc = subprocess.Popen(self.argv(args, entrypoint), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=rootfs)
        return Container(self, f"chroot-{proc.pid}", proc, t)

    def pid_of(self, c: Container) -> int:
        return c.proc.pid  # chroot and env exec: the entrypoint keeps the pid

    def stop(self, c: Container, grace_s: float) -> tuple[int, float]:
        t = time.monotonic()
        sig = self.spec.get("annotations", {}).get("org.opencontainers.image.stopSignal",
                                                   "SIGTERM")
        c.proc.send_signal(getattr(signal, sig, signal.SIGTERM))
        try:
            code = c.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            c.proc.kill()
            code = c.proc.wait(STOP_TIMEOUT_PAD_S)
        return code, time.monotonic() - t

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def runner(kind: str, archive: Path, work: Path) -> tuple[Runner | None, str | None]:
    """A runner of `kind` ready to start the image, or None and why it cannot run here;
    `work` is the chroot runner's folder (the podman runner makes a short one of its own)."""
    r: PodmanRunner | ChrootRunner
    if kind == "podman":
        if shutil.which("podman") is None:
            return None, "podman is not installed"
        r = PodmanRunner(archive)
    elif kind == "chroot":
        r = ChrootRunner(archive, work)
    else:
        raise ValueError(kind)
    why = r.probe()
    if why is not None:
        r.close()
        return None, why
    return r, None
