"""Compile the twin's hot core with mypyc (`make install` runs this).

Usage: .venv/bin/python tools/build_native.py [--if-stale | --clean]

Compiles the modules `chatfleet._native` lists into extension modules beside their sources
(src/chatfleet/...*.so, with mypyc's shared library src/chatfleet_native__mypyc*.so), then
writes src/chatfleet/_native_build.json with the hashes of the sources it compiled. Until that
manifest matches the sources, `import chatfleet` runs all of them as Python (chatfleet/_native.py
says why), so an edit takes effect at once and a failed or interrupted build is harmless.
--if-stale builds only when the build in place is not current (`make` runs it so); --clean
removes the build and exits. Without a C compiler the build fails with a note and the
exit status 0: chatfleet runs as Python, only slower.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))

from chatfleet._native import (  # noqa: E402
    EXT_SUFFIX,
    GROUP,
    MANIFEST,
    PACKAGE_DIR,
    check_build,
    compiled_files,
    digest,
    extension_of,
    native_sources,
)


def clean() -> int:
    """Remove the manifest first (so a half-removed build is never used), then every extension
    module in the package: the listed ones, and any a module dropped from the list left."""
    (PACKAGE_DIR / MANIFEST).unlink(missing_ok=True)
    removed = 0
    for ext in compiled_files():
        ext.unlink()
        removed += 1
    for lib in SRC.glob(f"{GROUP}__mypyc*"):
        lib.unlink()
        removed += 1
    return removed


def build() -> None:
    from mypyc.build import mypycify
    from setuptools import setup

    files = native_sources()
    rel = [str(f.relative_to(SRC)) for f in files]
    print(f"compiling {len(rel)} modules of the twin's core with mypyc (about a minute; "
          "chatfleet runs as Python until it is done)", flush=True)
    t = time.perf_counter()
    os.environ["MYPY_CACHE_DIR"] = str(ROOT / "build" / "mypyc-cache")  # not under src/
    os.chdir(SRC)
    with tempfile.TemporaryDirectory(prefix="chatfleet-mypyc-") as tmp:
        # the generated C is kept in build/ (gitignored): a profiler (callgrind_annotate)
        # reads it to show where the compiled code spends its time
        exts = mypycify(rel, opt_level="3", target_dir=str(ROOT / "build" / "mypyc-c"),
                        group_name=GROUP)
        setup(name="chatfleet-native", ext_modules=exts, script_args=[
            "--quiet", "build_ext", "--inplace", "--build-temp", os.path.join(tmp, "temp"),
            "--build-lib", os.path.join(tmp, "lib")])
    missing = [r for r, f in zip(rel, files, strict=True) if not extension_of(f).exists()]
    if missing:
        raise RuntimeError(f"mypyc built no module for {', '.join(missing)}")
    manifest = {"ext_suffix": EXT_SUFFIX,
                "sources": {str(f.relative_to(PACKAGE_DIR)): digest(f) for f in files}}
    tmp_manifest = PACKAGE_DIR / (MANIFEST + ".tmp")
    tmp_manifest.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n",
                            encoding="utf-8")
    tmp_manifest.replace(PACKAGE_DIR / MANIFEST)
    print(f"compiled in {time.perf_counter() - t:.0f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--if-stale", action="store_true",
                     help="build only when the build in place is not current")
    how.add_argument("--clean", action="store_true", help="remove the build and exit")
    args = ap.parse_args()
    os.environ.pop("CHATFLEET_NATIVE", None)  # what is built, not what this process runs
    if args.if_stale and check_build().compiled:
        return 0
    removed = clean()
    if args.clean:
        print(f"removed {removed} compiled files")
        return 0
    if shutil.which(os.environ.get("CC", "cc")) is None:
        print("no C compiler (cc): chatfleet runs as Python, slower (docs/twin.md#speed)")
        return 0
    try:
        build()
    except (Exception, SystemExit) as exc:  # setup() exits on a compiler error
        clean()
        print(f"the mypyc build failed ({exc}): chatfleet runs as Python, slower "
              "(docs/twin.md#speed)", file=sys.stderr)
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
