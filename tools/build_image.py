"""Build the chatfleet image with no container daemon and no registry: `make image`.

Usage: .venv/bin/python tools/build_image.py [--out out/image] [--work build/image]
           [--mirror URL] [--suite bookworm] [--force] [--json]

As root (mmdebstrap's root mode, chroot), in a git checkout, with network to a Debian mirror and
to pip's index. Each step prints its time (all of it takes a few minutes the first time):

1. The base layer: a Debian root file system built from packages by mmdebstrap (variant
   essential, plus python3): no apt, no compilers, no documentation; the user chatfleet (uid
   10001) added.
2. The application layer: /opt/chatfleet, built by deploy/image/build-venv.sh (the script the
   Containerfile's build stage runs) inside a throwaway Debian build root that has python3-dev
   and gcc for the same python3 as the base: chatfleet's wheel, its runtime dependencies at the
   versions of requirements.lock (the wheels fetched here by pip, resolved for Debian's
   python3), and the compiled core built by mypyc. Only /opt/chatfleet leaves the build root.
3. The image: both layers and the configuration (entrypoint, user, port, labels:
   chatfleet.deploy.image) put together by umoci, and written as the OCI archive
   OUT/chatfleet-TAG.oci.tar, named chatfleet:TAG inside, with OUT/chatfleet-TAG.json beside it
   (the digests, the sizes, the inputs' keys and the steps' times).

TAG is the version and the commit (chatfleet.deploy.image.tag). The timestamps inside the
archive are the commit's time (SOURCE_DATE_EPOCH), so the same commit, mirror state and
wheels give the same layers. Each layer is cached under WORK/cache by a hash of what goes into
it: the base by its recipe, the application by its recipe and every file the build copies from
the checkout (tracked or new, not ignored). A build with nothing changed only assembles the
archive (seconds); a source change rebuilds the application layer only. The cache keeps the
newest layer of each kind, OUT keeps the newest archive. The Debian packages are what the
mirror has on the day: --force rebuilds both layers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from chatfleet import __version__  # noqa: E402
from chatfleet.deploy import image  # noqa: E402

SUITE = "bookworm"  # its python3 is 3.11, the project's Python
MIRROR = "http://deb.debian.org/debian"
# what the build copies from the checkout into the build root (tracked or new, not ignored)
INPUTS = ("pyproject.toml", "README.md", "requirements.lock", "src", "tools/build_native.py",
          "deploy/image")
# no manuals, no documentation but the copyright files, no translations (as debian:*-slim)
DPKG_OPTS = ("path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
             "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/info/*",
             "path-exclude=/usr/share/locale/*", "path-exclude=/usr/share/lintian/*")
# libstdc++6: the C++ runtime that manylinux wheels (tokenizers) expect of the system
BASE_PACKAGES = ("python3", "libstdc++6", "usr-is-merged")
# the essential set pulls usrmerge and with it perl (init-system-helpers takes the first of
# "usrmerge | usr-is-merged"); the file system is merged already, so both go
BASE_PURGE = ("usrmerge", "libfile-find-rule-perl", "libnumber-compare-perl",
              "libtext-glob-perl", "perl", "libperl5.36", "perl-modules-5.36")
BUILD_PACKAGES = ("python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "binutils")
# the interpreter the wheels are resolved for: the host's Debian python3, the image's version
RESOLVE_PYTHON = "/usr/bin/python3"
RECIPE_VERSION = 1  # bump when this script changes what a layer holds
TOOLS = ("mmdebstrap", "umoci", "git")


LOG = sys.stdout  # the progress, and what the tools print; stderr with --json


class BuildError(Exception):
    """What stops the build, in one line."""


class Progress:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.steps: dict[str, float] = {}

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.0f} s] {text}", file=LOG, flush=True)

    def timed(self, name: str, t: float) -> None:
        self.steps[name] = round(time.monotonic() - t, 1)


def run(argv: Sequence[str], **kw: Any) -> None:
    try:
        subprocess.run(list(argv), check=True, stdout=LOG, **kw)
    except subprocess.CalledProcessError as exc:
        raise BuildError(f"{argv[0]} failed (exit {exc.returncode}): "
                         f"{shlex.join(argv)[:300]}") from None


def digest_of(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- inputs ------------------------------------------------------------------------------------
def input_files() -> list[str]:
    """The files the build copies: tracked or new, not ignored, under INPUTS."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard", "--", *INPUTS],
                         capture_output=True, check=True).stdout.decode()
    return sorted({p for p in out.split("\0") if p and (ROOT / p).is_file()})


def inputs_digest(files: Sequence[str]) -> str:
    return digest_of([(f, os.access(ROOT / f, os.X_OK), file_digest(ROOT / f)) for f in files])


def stage_inputs(files: Sequence[str], dest: Path) -> None:
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, target)


def base_recipe(suite: str, mirror: str) -> dict[str, Any]:
    return {"v": RECIPE_VERSION, "suite": suite, "mirror": mirror, "variant": "essential",
            "include": BASE_PACKAGES, "purge": BASE_PURGE, "dpkg": DPKG_OPTS,
            "user": [image.USER, image.UID]}


def app_recipe(suite: str, mirror: str, inputs: str) -> dict[str, Any]:
    return {"v": RECIPE_VERSION, "suite": suite, "mirror": mirror, "include": BUILD_PACKAGES,
            "venv": image.VENV, "inputs": inputs}


# --- mmdebstrap --------------------------------------------------------------------------------
def mmdebstrap(args: argparse.Namespace, include: Sequence[str], fmt: str, target: str,
               hooks: Sequence[tuple[str, str]], env: dict[str, str]) -> None:
    """mmdebstrap in root mode, with the .debs kept in WORK/debs between builds (apt checks
    each against the mirror's index before it uses it)."""
    debs = args.work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    argv = ["mmdebstrap", "--mode=root", "--variant=essential", f"--format={fmt}",
            f"--include={','.join(include)}",
            *(f"--dpkgopt={o}" for o in DPKG_OPTS),
            "--skip=download/empty",
            "--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/",
            f"--setup-hook=sync-in {debs} /var/cache/apt/archives/",
            f"--customize-hook=sync-out /var/cache/apt/archives {debs}"]
    argv += [f"--{kind}-hook={cmd}" for kind, cmd in hooks]
    argv += [args.suite, target, args.mirror]
    run(argv, env={**os.environ, **env}, cwd=args.work)


def build_base(args: argparse.Namespace, out: Path, env: dict[str, str]) -> None:
    user = f"{image.USER}:x:{image.UID}:{image.UID}:{image.USER}:/nonexistent:/usr/sbin/nologin"
    hooks = [
        ("customize", f"chroot \"$1\" dpkg --purge {' '.join(BASE_PURGE)}"),
        # a container runtime mounts its own; without them the layer is the same on every host
        ("customize", "rm -f \"$1/etc/resolv.conf\" \"$1/etc/hostname\""),
        ("customize", f"echo '{user}' >> \"$1/etc/passwd\"; "
                      f"echo '{image.USER}:x:{image.UID}:' >> \"$1/etc/group\""),
    ]
    tmp = out.with_suffix(".part")
    mmdebstrap(args, BASE_PACKAGES, "tar", str(tmp), hooks, env)
    tmp.replace(out)


def build_app(args: argparse.Namespace, files: Sequence[str], out: Path,
              env: dict[str, str], progress: Progress) -> None:
    with tempfile.TemporaryDirectory(prefix="app-", dir=args.work) as tmp_s:
        tmp = Path(tmp_s)
        stage = tmp / "src"
        wheels = tmp / "wheels"
        stage_inputs(files, stage)
        t = time.monotonic()
        progress.say(f"the wheels: chatfleet and its pinned dependencies for {RESOLVE_PYTHON} "
                     "(pip)")
        if not Path(RESOLVE_PYTHON).exists():
            raise BuildError(f"{RESOLVE_PYTHON} is missing: the wheels are resolved for "
                             "Debian's python3 (apt-get install python3)")
        run([sys.executable, "-m", "pip", "--python", RESOLVE_PYTHON, "wheel", "-qq",
             "--disable-pip-version-check", "-w", str(wheels),
             "-c", str(stage / "requirements.lock"),
             "-c", str(stage / "deploy/image/constraints.txt"),
             "-r", str(stage / "deploy/image/build-requirements.txt"), str(stage)])
        progress.timed("wheels", t)
        t = time.monotonic()
        progress.say("the build root (mmdebstrap: python3-dev, gcc) and in it "
                     "deploy/image/build-venv.sh")
        inner = shlex.join(["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
                            f"SOURCE_DATE_EPOCH={env['SOURCE_DATE_EPOCH']}", "sh",
                            "/build/src/deploy/image/build-venv.sh", "/build/src",
                            "/build/wheels"])
        hooks = [("customize", "mkdir -p \"$1/build\""),
                 ("customize", f"copy-in {stage} {wheels} /build"),
                 ("customize", f"chroot \"$1\" {inner}"),
                 ("customize", f"copy-out {image.VENV} {tmp}")]
        mmdebstrap(args, BUILD_PACKAGES, "null", "/dev/null", hooks, env)
        progress.timed("build_root", t)
        venv = tmp / Path(image.VENV).name
        if not (venv / "bin" / "chatfleet").exists():
            raise BuildError(f"the build root gave no {image.VENV}/bin/chatfleet")
        write_layer(venv, image.VENV, out, int(env["SOURCE_DATE_EPOCH"]))


def write_layer(src: Path, at: str, out: Path, epoch: int) -> None:
    """`src` as the layer tar of the folder `at`: each folder's entries by name, owned by
    root, timestamps at the commit's time, so that the same files give the same bytes."""

    def entries() -> Iterator[tuple[Path, str]]:
        parts = Path(at).relative_to("/").parts
        for i in range(1, len(parts)):
            yield Path("/" + "/".join(parts[:i])), "/".join(parts[:i])
        yield src, "/".join(parts)
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames.sort()
            rel = Path(dirpath).relative_to(src)
            for name in sorted(dirnames + filenames):
                yield Path(dirpath) / name, "/".join(parts + (rel / name).parts)

    write_tar(entries(), out, epoch)


def write_tar(entries: Iterable[tuple[Path, str]], out: Path, epoch: int,
              fixed_modes: bool = False) -> None:
    """A tar of (path, name) entries in the order given, owned by root, timestamps at
    `epoch` (modes 755 for folders and 644 for files with `fixed_modes`), so that the same
    files give the same bytes; written beside `out` and moved there whole."""
    tmp = out.with_suffix(".part")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path, name in entries:
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = epoch
            if fixed_modes:
                info.mode = 0o755 if info.isdir() else 0o644
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    tmp.replace(out)


# --- the image ---------------------------------------------------------------------------------
def iso(epoch: int) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def labels(rev: image.Revision, epoch: int) -> dict[str, str]:
    return {"org.opencontainers.image.title": image.NAME,
            "org.opencontainers.image.description": "The chatfleet gateway and CLI "
            "(docs/deploy.md)",
            "org.opencontainers.image.version": __version__,
            "org.opencontainers.image.revision": rev.commit,
            "org.opencontainers.image.created": iso(epoch),
            "org.opencontainers.image.licenses": "Apache-2.0",
            "io.chatfleet.health": f"http://127.0.0.1:{image.PORT}{image.HEALTH_PATH}"}


def assemble(layers: Sequence[tuple[Path, str]], ref: str, rev: image.Revision, epoch: int,
             layout: Path) -> None:
    """umoci: an empty image, the layers, the configuration; then the one name in the index."""
    created = iso(epoch)
    img = f"{layout}:build"
    run(["umoci", "init", "--layout", str(layout)])
    run(["umoci", "new", "--image", img])
    for path, what in layers:
        run(["umoci", "raw", "add-layer", "--image", img, "--history.created", created,
             "--history.created_by", what, str(path)])
    config = ["umoci", "config", "--image", img, "--created", created, "--no-history",
              "--author", "chatfleet (tools/build_image.py)",
              "--config.user", f"{image.UID}:{image.UID}", "--config.workingdir", "/",
              "--config.exposedports", f"{image.PORT}/tcp",
              "--config.stopsignal", image.STOP_SIGNAL]
    config += [a for e in image.ENTRYPOINT for a in ("--config.entrypoint", e)]
    config += [a for c in image.CMD for a in ("--config.cmd", c)]
    config += [a for k, v in image.ENV for a in ("--config.env", f"{k}={v}")]
    config += [a for k, v in labels(rev, epoch).items() for a in ("--config.label", f"{k}={v}")]
    run(config)
    run(["umoci", "gc", "--layout", str(layout)])
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text())
    (entry,) = index["manifests"]
    # podman and skopeo name the image by ref.name; containerd (kind) by its own annotation,
    # with the name fully qualified as a pod's `image: chatfleet:TAG` means it
    entry["annotations"] = {"org.opencontainers.image.ref.name": ref,
                            "io.containerd.image.name": f"docker.io/library/{ref}",
                            "org.opencontainers.image.revision": rev.commit}
    index_path.write_text(json.dumps(index, sort_keys=True, separators=(",", ":")))


def write_archive(layout: Path, out: Path, epoch: int) -> None:
    write_tar(((path, str(path.relative_to(layout))) for path in sorted(layout.rglob("*"))),
              out, epoch, fixed_modes=True)


def describe(layout: Path) -> dict[str, Any]:
    """The digests and sizes of what the layout holds."""
    blobs = layout / "blobs" / "sha256"
    (entry,) = json.loads((layout / "index.json").read_text())["manifests"]
    manifest = json.loads((blobs / entry["digest"].split(":")[1]).read_text())
    config = json.loads((blobs / manifest["config"]["digest"].split(":")[1]).read_text())
    layers = []
    for desc, diff_id, hist in zip(manifest["layers"], config["rootfs"]["diff_ids"],
                                   config["history"], strict=True):
        layers.append({"digest": desc["digest"], "bytes": desc["size"], "diff_id": diff_id,
                       "what": hist.get("created_by", "")})
    return {"digest": entry["digest"], "config_digest": manifest["config"]["digest"],
            "layers": layers}


# --- the build ---------------------------------------------------------------------------------
def check_machine() -> None:
    if os.geteuid() != 0:
        raise BuildError("make image runs as root (mmdebstrap --mode=root, chroot): sudo make "
                         "image, or build with the Containerfile (docs/deploy.md#the-image)")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise BuildError(f"missing: {' '.join(missing)} (apt-get install mmdebstrap umoci git; "
                         "make system-deps installs them as root)")


def keep_newest(folder: Path, pattern: str, keep: Path) -> None:
    for old in folder.glob(pattern):
        if old != keep:
            old.unlink()


def build(args: argparse.Namespace) -> dict[str, Any]:
    check_machine()
    progress = Progress()
    rev = image.checkout_revision(ROOT)
    if rev is None:
        raise BuildError(f"{ROOT} is not a git checkout (or git fails there): the tag names "
                         "the commit")
    ref = image.reference(__version__, rev)
    tag = ref.split(":", 1)[1]
    epoch = int(subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct"],
                               capture_output=True, text=True, check=True).stdout)
    env = {"SOURCE_DATE_EPOCH": str(epoch)}
    files = input_files()
    keys = {"base": digest_of(base_recipe(args.suite, args.mirror)),
            "app": digest_of(app_recipe(args.suite, args.mirror, inputs_digest(files)))}
    args.out.mkdir(parents=True, exist_ok=True)
    archive = args.out / f"{image.NAME}-{tag}.oci.tar"
    meta_path = archive.with_name(f"{image.NAME}-{tag}.json")
    if not args.force and archive.exists() and meta_path.exists():
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        if meta.get("keys") == keys and meta.get("archive_bytes") == archive.stat().st_size:
            progress.say(f"{ref} is up to date: {archive}")
            return meta
    progress.say(f"building {ref} (commit {rev.commit[:12]}{', dirty' if rev.dirty else ''}"
                 f", {len(files)} input files, Debian {args.suite} from {args.mirror})")
    cache = args.work / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    base = cache / f"base-{keys['base'][:16]}.tar"
    app = cache / f"app-{keys['app'][:16]}.tar"
    if args.force or not base.exists():
        t = time.monotonic()
        progress.say(f"base layer: Debian {args.suite} essential + {', '.join(BASE_PACKAGES)} "
                     "(mmdebstrap)")
        build_base(args, base, env)
        progress.timed("base", t)
        keep_newest(cache, "base-*.tar", base)
    else:
        progress.say(f"base layer: cached ({base.name})")
    if args.force or not app.exists():
        t = time.monotonic()
        progress.say(f"application layer: {image.VENV}")
        build_app(args, files, app, env, progress)
        progress.timed("app", t)
        keep_newest(cache, "app-*.tar", app)
    else:
        progress.say(f"application layer: cached ({app.name})")
    t = time.monotonic()
    progress.say("the image: layers and configuration (umoci), the OCI archive")
    with tempfile.TemporaryDirectory(prefix="layout-", dir=args.work) as tmp:
        layout = Path(tmp) / "oci"
        assemble([(base, f"mmdebstrap {args.suite} essential + {' '.join(BASE_PACKAGES)}"),
                  (app, f"deploy/image/build-venv.sh: {image.VENV}")], ref, rev, epoch, layout)
        write_archive(layout, archive, epoch)
        described = describe(layout)
    progress.timed("assemble", t)
    keep_newest(args.out, f"{image.NAME}-*.oci.tar", archive)
    keep_newest(args.out, f"{image.NAME}-*.json", meta_path)
    meta = {"reference": ref, "tag": tag, "archive": str(archive), "version": __version__,
            "commit": rev.commit, "dirty": rev.dirty, "created": iso(epoch),
            "suite": args.suite, "mirror": args.mirror, **described,
            "archive_bytes": archive.stat().st_size,
            "layers_bytes": sum(p.stat().st_size for p in (base, app)),
            "keys": keys, "steps_s": progress.steps,
            "built_s": round(time.monotonic() - progress.t0, 1)}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    progress.say(f"{ref}: {archive} ({meta['archive_bytes'] / 1e6:.0f} MB; "
                 f"{meta['layers_bytes'] / 1e6:.0f} MB unpacked), digest {meta['digest']}")
    return meta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "image",
                    help="where the OCI archive goes")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "image",
                    help="the cache and the build's scratch space")
    ap.add_argument("--suite", default=SUITE, help="the Debian release")
    ap.add_argument("--mirror", default=MIRROR, help="the Debian mirror")
    ap.add_argument("--force", action="store_true", help="rebuild both layers")
    ap.add_argument("--json", action="store_true", help="print the image's description")
    args = ap.parse_args()
    if args.json:
        global LOG
        LOG = sys.stderr
    args.out = args.out.resolve()
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    with (args.work / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time in a work folder
        try:
            meta = build(args)
        except BuildError as exc:
            print(f"make image: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(meta, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
