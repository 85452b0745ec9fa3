"""The image's files, fast (no build: tests/deploy/test_image.py builds and runs it): the
Containerfile says what chatfleet.deploy.image declares and builds /opt/chatfleet with the same
script as `make image`; the tag names the version and the commit; `chatfleet deploy k8s` names
the checkout's image by default; the build copies what git would commit and writes a layer
whose bytes depend on the files alone; and it refuses a machine it cannot build on, in one
line."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from tools import build_image
from typer.testing import CliRunner

from chatfleet import __version__
from chatfleet.cli import app
from chatfleet.deploy import image

ROOT = Path(__file__).parents[2]
CONTAINERFILE = ROOT / "Containerfile"


def instructions() -> list[tuple[str, str]]:
    """The Containerfile's instructions (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def last(word: str, stage: list[tuple[str, str]]) -> str:
    return [rest for w, rest in stage if w == word][-1]


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for w, rest in instructions():
        if w == "FROM":
            found.append([])
        if found:
            found[-1].append((w, rest))
    return found


def test_the_containerfile_declares_what_the_image_module_does() -> None:
    build, final = stages()
    assert build[0] == ("FROM", "${DEBIAN} AS build") and final[0] == ("FROM", "${DEBIAN}")
    assert ("ARG", f"DEBIAN=debian:{build_image.SUITE}-slim") in instructions()
    assert json.loads(last("ENTRYPOINT", final)) == list(image.ENTRYPOINT)
    assert json.loads(last("CMD", final)) == list(image.CMD)
    assert last("USER", final) == f"{image.UID}:{image.UID}"
    assert last("EXPOSE", final) == str(image.PORT)
    assert last("STOPSIGNAL", final) == image.STOP_SIGNAL
    env = dict(re.findall(r"(\w+)=(\S+)", last("ENV", final)))
    assert env == dict(image.ENV)
    assert f"http://127.0.0.1:{image.PORT}{image.HEALTH_PATH}" in last("HEALTHCHECK", final)
    assert f"--uid {image.UID}" in last("RUN", final) and image.USER in last("RUN", final)
    assert f"org.opencontainers.image.version=\"{__version__}\"" in last("LABEL", final)
    assert last("COPY", final) == f"--from=build {image.VENV} {image.VENV}"


def test_the_containerfile_builds_with_make_images_packages_and_script() -> None:
    build, final = stages()
    installed = re.search(r"--no-install-recommends ([^&]+)&&", last("RUN", build[:3]))
    assert installed is not None
    assert set(installed.group(1).split()) == set(build_image.BUILD_PACKAGES)
    assert last("RUN", build) == "sh deploy/image/build-venv.sh /build/src"
    copied = {src.rstrip("/") for w, rest in build if w == "COPY" for src in rest.split()[:-1]}
    assert copied == set(build_image.INPUTS)  # what make image copies into its build root
    runtime = re.search(r"--no-install-recommends (\S+)", last("RUN", final))
    assert runtime is not None and runtime.group(1) == "python3"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "build", "out", "**/*.so", "src/chatfleet/_native_build.json"} <= set(
        ignored)


@pytest.mark.parametrize(("rev", "tag"), [
    (None, "0.1.0"),
    (image.Revision("ab" * 20, dirty=False, release=False), "0.1.0-abababababab"),
    (image.Revision("ab" * 20, dirty=True, release=False), "0.1.0-abababababab-dirty"),
    (image.Revision("ab" * 20, dirty=False, release=True), "0.1.0"),
    (image.Revision("ab" * 20, dirty=True, release=True), "0.1.0-abababababab-dirty"),
])
def test_the_tag_is_the_version_and_the_commit_but_for_a_clean_release(
        rev: image.Revision | None, tag: str) -> None:
    assert image.tag("0.1.0", rev) == tag
    assert image.reference("0.1.0", rev) == f"chatfleet:{tag}"


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True, env=env).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("*.so\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "one")
    return tmp_path


def test_the_revision_of_a_checkout(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    head = git(repo, "rev-parse", "HEAD").strip()
    assert image.checkout_revision(repo, "0.1.0") == image.Revision(head, False, False)
    git(repo, "tag", "v0.1.0")
    assert image.checkout_revision(repo, "0.1.0") == image.Revision(head, False, True)
    assert image.checkout_revision(repo, "0.2.0") == image.Revision(head, False, False)
    (repo / "src" / "new.py").write_text("")  # new, not ignored: the build would copy it
    assert image.checkout_revision(repo, "0.1.0") == image.Revision(head, True, True)
    (repo / "src" / "new.py").unlink()
    (repo / "src" / "core.so").write_text("")  # ignored: not part of the build
    assert image.checkout_revision(repo, "0.1.0") == image.Revision(head, False, True)
    assert image.checkout_revision(tmp_path_factory.mktemp("plain")) is None


def test_the_build_copies_what_git_would_commit(repo: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (repo / "src" / "new.py").write_text("b = 2\n")
    (repo / "src" / "core.so").write_text("")
    (repo / "README.md").write_text("not an input of this repo's build\n")
    monkeypatch.setattr(build_image, "ROOT", repo)
    monkeypatch.setattr(build_image, "INPUTS", ("src",))
    files = build_image.input_files()
    assert files == ["src/a.py", "src/new.py"]
    before = build_image.inputs_digest(files)
    (repo / "src" / "new.py").write_text("b = 3\n")
    assert build_image.inputs_digest(files) != before


def test_deploy_k8s_names_the_checkouts_image_unless_told(tmp_path: Path) -> None:
    def gateway_image(*args: str) -> str:
        out = tmp_path / str(len(args))
        res = CliRunner().invoke(app, ["deploy", "k8s", "--cap", "4", "--weights", "fp8",
                                       "--kv-cache", "fp8", "--out", str(out), *args])
        assert res.exit_code == 0, res.output
        (dep,) = [d for d in yaml.safe_load_all((out / "30-gateway.yaml").read_text())
                  if d and d["kind"] == "Deployment"]
        return str(dep["spec"]["template"]["spec"]["containers"][0]["image"])

    rev = image.checkout_revision(ROOT)
    assert rev is not None and image.own_checkout() == ROOT
    assert gateway_image() == image.default_reference() == image.reference(__version__, rev)
    assert gateway_image("--image-chatfleet", "registry.example/chatfleet:1") == (
        "registry.example/chatfleet:1")


def tree(root: Path, mtime: int) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_text("#!/bin/sh\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "lib").mkdir()
    (root / "lib" / "b.py").write_text("b\n")
    (root / "lib" / "a.py").write_text("a\n")
    (root / "bin" / "python").symlink_to("/usr/bin/python3")
    for p in [root, *root.rglob("*")]:
        os.utime(p, (mtime, mtime), follow_symlinks=False)
    return root


def test_a_layer_depends_on_the_files_alone(tmp_path: Path) -> None:
    one = tmp_path / "one.tar"
    two = tmp_path / "two.tar"
    build_image.write_layer(tree(tmp_path / "a" / "venv", 1_000), "/opt/venv", one, 5)
    build_image.write_layer(tree(tmp_path / "b" / "venv", 2_000), "/opt/venv", two, 5)
    assert one.read_bytes() == two.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(one.read_bytes())) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["opt", "opt/venv", "opt/venv/bin", "opt/venv/lib",
                                         "opt/venv/bin/python", "opt/venv/bin/tool",
                                         "opt/venv/lib/a.py", "opt/venv/lib/b.py"]
    assert {(m.uid, m.gid, m.uname, m.mtime) for m in members} == {(0, 0, "", 5)}
    assert members[4].issym() and members[4].linkname == "/usr/bin/python3"
    assert members[5].mode & 0o111


def test_make_image_refuses_a_machine_it_cannot_build_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(build_image.BuildError, match="runs as root"):
        build_image.check_machine()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which",
                        lambda t: None if t == "umoci" else f"/usr/bin/{t}")
    with pytest.raises(build_image.BuildError, match="missing: umoci"):
        build_image.check_machine()
