"""The compiled twin core: which modules `make install` compiles with mypyc, and whether this
process may use them.

The twin spends its time in a few pure packages (the engine model, the workload, the fleet
core, the measurements). `tools/build_native.py` compiles them with mypyc into extension
modules beside their sources and writes a manifest of the sources' hashes. Python loads an
extension module before a source file of the same name, so a stale build would run old code:
at `import chatfleet` this module checks the manifest, and unless every compiled module's
source is the one it was built from, every extension is there and no other extension lies in
the package (a module dropped from the list keeps its old one until a build removes it), it
makes every module with an extension beside it load from source, together: compiled modules
call each other directly, so a mix of the two is not safe. Such a fallback says so in one line
on stderr, once per process tree (`NOTED_ENV` tells the processes it starts), so that a
developer who edited a compiled module knows the twin runs slower until `make native`; pytest's
header shows the mode too (tests/conftest.py). `CHATFLEET_NATIVE=0` asks for the sources,
silently. Both paths give the same results (a test compares them); the compiled one is faster
(docs/twin.md#speed).

Writing for the compiled modules (tests/test_compiled_rules.py checks the first three):
- A dataclass there is built by the `__init__` that the dataclasses module writes at import,
  which runs interpreted (0.25-1 us an instance, 1.1 us a frozen one), where a written-out
  `__init__` runs natively (0.07 us). So the classes made per request, per step or per
  decision either write their `__init__` out or are plain classes with slots. An
  `@dataclass(init=False)` keeps the dataclass's eq, repr and fields; its `__init__` takes
  exactly the fields that are not `field(init=False)` (the state it derives or starts empty
  is), the defaults live in the `__init__` alone, and it sets every field. So
  `dataclasses.replace()` works: it passes the init fields and the `__init__` derives the
  rest.
- A frozen dataclass that travels to a worker process by pickle needs a `__reduce__` (the
  compiled form refuses pickle's default way, which sets each field on a bare object); the
  plan's worker tasks are round-tripped compiled.
- A NamedTuple's `__new__` runs interpreted too: the hot tuples (the twin's events, the radix
  tree's leaf heap, the schedulers' finish heap) are plain tuples, with a type alias that
  names their parts where they are declared and one place that builds them.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

PACKAGE_DIR = Path(__file__).resolve().parent
# What the build compiles, relative to the chatfleet package: the modules a twin run spends its
# time in. Left out on purpose: modules whose frozen dataclasses travel to worker processes by
# pickle (core/engine/build.py's EngineSpec, core/workload/config.py, core/slo.py: a compiled
# frozen dataclass refuses pickle's default way; twin/fleet.py's FleetConfig has a __reduce__
# instead), modules that check untrusted input through their constructors' types
# (core/fleet/prompt.py, core/fleet/request.py: compiled code would raise TypeError first), and
# the once-per-point ones (the validity rule, the knee, the point's summary: nothing to gain,
# and compiled code turns an int into a float where a float is annotated, which the knee's
# loads are).
NATIVE_MODULES = (
    "core/engine/base_scheduler.py", "core/engine/block_pool.py", "core/engine/decode_run.py",
    "core/engine/eviction.py", "core/engine/handover.py", "core/engine/host_tier.py",
    "core/engine/kv_cache_manager.py",
    "core/engine/kv_pool.py", "core/engine/mixed_step.py", "core/engine/prefill_adder.py",
    "core/engine/radix.py", "core/engine/request.py", "core/engine/scheduler.py",
    "core/engine/step.py", "core/engine/step_time.py", "core/engine/steplog.py",
    "core/engine/thermal.py", "core/engine/tree_node.py", "core/engine/vllm_scheduler.py",
    "core/workload/lengths.py", "core/workload/load.py", "core/workload/sessions.py",
    "core/fleet/admission.py", "core/fleet/drain.py", "core/fleet/fairshare.py",
    "core/fleet/fleet.py", "core/fleet/health.py", "core/fleet/reserve.py",
    "core/fleet/routing.py", "core/fleet/session.py", "core/fleet/waiting.py",
    "core/measure/itl.py", "core/measure/percentiles.py", "core/measure/request.py",
    "core/records.py", "core/traffic/replay.py", "twin/events.py", "twin/loop.py",
    "twin/fleet.py",
)
MANIFEST = "_native_build.json"
NOTED_ENV = "CHATFLEET_NATIVE_NOTED"  # set once a process said that it runs the sources
GROUP = "chatfleet_native"  # the name of mypyc's shared library (chatfleet_native__mypyc)
EXT_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]  # what this interpreter loads first


class NativeStatus(NamedTuple):
    compiled: bool  # this process runs the compiled modules
    reason: str  # why not, or "compiled"


def native_sources(root: Path = PACKAGE_DIR) -> list[Path]:
    """The source files the build compiles."""
    return [root / m for m in NATIVE_MODULES]


def module_name(path: Path, root: Path = PACKAGE_DIR) -> str:
    return ".".join(("chatfleet", *path.relative_to(root).with_suffix("").parts))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extension_of(path: Path) -> Path:
    """Where this interpreter looks for the compiled form of `path`."""
    return path.with_name(path.stem + EXT_SUFFIX)


def compiled_files(root: Path = PACKAGE_DIR) -> list[Path]:
    """Every extension module in the package, listed or not, for any suffix this interpreter
    loads (a `radix.so` would load as surely as a `radix.cpython-311-...so`)."""
    return sorted(p for p in root.rglob("*.so")
                  if any(p.name.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES))


def source_of(extension: Path) -> Path:
    """The .py file an extension module stands in for."""
    name = extension.name
    suffix = max((s for s in importlib.machinery.EXTENSION_SUFFIXES if name.endswith(s)),
                 key=len)
    return extension.with_name(name[: -len(suffix)] + ".py")


def check_build(root: Path = PACKAGE_DIR) -> NativeStatus:
    """Whether the compiled modules under `root` are all there, built from these sources, and
    the only extensions in the package."""
    if os.environ.get("CHATFLEET_NATIVE", "") == "0":
        return NativeStatus(False, "off (CHATFLEET_NATIVE=0)")
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return NativeStatus(False, "not built (make install builds it)")
    except (OSError, ValueError) as exc:
        return NativeStatus(False, f"unreadable build manifest ({exc})")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("sources"), dict):
        return NativeStatus(False, "unreadable build manifest (not a manifest object)")
    built = manifest["sources"]
    if manifest.get("ext_suffix") != EXT_SUFFIX:
        return NativeStatus(False, "built for another Python (make install rebuilds it)")
    for path in native_sources(root):
        rel = str(path.relative_to(root))
        if built.get(rel) != digest(path):
            return NativeStatus(False, f"{rel} changed since the build (make install "
                                       "rebuilds it)")
        if not extension_of(path).exists():
            return NativeStatus(False, f"{rel}: its compiled module is missing")
    if set(built) != {str(p.relative_to(root)) for p in native_sources(root)}:
        return NativeStatus(False, "the build covers other modules (make install rebuilds it)")
    listed = {extension_of(p) for p in native_sources(root)}
    for ext in compiled_files(root):
        if ext not in listed:
            return NativeStatus(False, f"{ext.relative_to(root)}: a compiled module the build "
                                       "does not list (make install rebuilds it)")
    return NativeStatus(True, "compiled")


class SourceFirst:
    """A meta path finder (importlib.abc.MetaPathFinder's protocol; that module is slow to
    import) that loads the listed modules from their .py files, whatever extension lies beside
    them."""

    def __init__(self, files: Sequence[Path], root: Path = PACKAGE_DIR) -> None:
        self.files = {module_name(f, root): f for f in files}

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        return importlib.util.spec_from_file_location(fullname, file)


def sources_to_load(root: Path = PACKAGE_DIR) -> list[Path]:
    """The sources to load instead of an extension: every listed module's, and every other
    module's that has an extension beside it."""
    found = {source_of(ext) for ext in compiled_files(root)}
    return sorted({*native_sources(root), *(f for f in found if f.exists())})


def fallback_note(status: NativeStatus) -> str:
    """The one line a process prints when a build is there but not used."""
    return f"chatfleet: the twin core runs as Python, slower: {status.reason}"


def install() -> NativeStatus:
    """Run at `import chatfleet`: keep a stale or partial build out of this process, and say so
    on stderr (once per process tree; not when CHATFLEET_NATIVE=0 asked for it)."""
    status = check_build()
    if not status.compiled and compiled_files():
        sys.meta_path.insert(0, SourceFirst(sources_to_load()))
        if os.environ.get("CHATFLEET_NATIVE", "") != "0" and not os.environ.get(NOTED_ENV):
            os.environ[NOTED_ENV] = "1"
            print(fallback_note(status), file=sys.stderr)
    return status
