"""The compiled twin core (chatfleet/_native.py, tools/build_native.py): a stale or partial build
never runs, and the compiled modules give what their sources give, to the last bit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import chatfleet
from chatfleet import _native
from chatfleet._native import (
    EXT_SUFFIX,
    MANIFEST,
    NATIVE_MODULES,
    check_build,
    digest,
    extension_of,
    native_sources,
)

ROOT = Path(__file__).resolve().parents[1]

# A point and a fleet point with every engine feature the plan uses: FP8, mixed lengths,
# the thermal model, decode runs cut by arrivals, the gateway's admission in front.
RUN = r"""
import dataclasses, json, sys
import chatfleet
from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.fleet import FleetConfig, run_fleet_point
from chatfleet.twin.run import run_point
spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"),
                  thermal=True)
wcfg = WorkloadConfig(lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm"))
one = run_point(spec, wcfg, ClosedLoad(48), duration_s=120.0, warmup_s=10.0)
fleet = run_fleet_point(spec, wcfg, ClosedLoad(60), FleetConfig(2, 12, queue_depth=12,
                        hop_s=0.002), duration_s=120.0, warmup_s=10.0)
def rows(run):
    return [[getattr(r, f.name) if f.name != "token_times" else list(r.token_times)
             for f in dataclasses.fields(r)] for r in run.records]
print(json.dumps({"compiled": chatfleet.NATIVE.compiled,
                  "file": sys.modules["chatfleet.core.engine.scheduler"].__file__,
                  "points": [one.point.to_json(), fleet.point.to_json()],
                  "records": [rows(one), rows(fleet)]}))
"""


def run_child(native: bool) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "CHATFLEET_NATIVE"}
    if not native:
        env["CHATFLEET_NATIVE"] = "0"
    out = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    doc: dict[str, object] = json.loads(out.stdout)
    return doc


@pytest.mark.slow
@pytest.mark.skipif(not chatfleet.NATIVE.compiled,
                    reason=f"the compiled core is not in use: {chatfleet.NATIVE.reason}")
def test_the_compiled_core_gives_what_its_sources_give() -> None:
    compiled, source = run_child(True), run_child(False)
    assert compiled["compiled"] is True and str(compiled["file"]).endswith(".so")
    assert source["compiled"] is False and str(source["file"]).endswith(".py")
    assert compiled["points"] == source["points"]
    assert compiled["records"] == source["records"]


@pytest.mark.skipif(os.environ.get("CHATFLEET_REQUIRE_NATIVE") != "1",
                    reason="CI sets CHATFLEET_REQUIRE_NATIVE=1: there the build must work")
def test_ci_runs_the_compiled_core() -> None:
    assert chatfleet.NATIVE.compiled, chatfleet.NATIVE.reason


def fake_build(root: Path) -> None:
    """The compiled modules' sources under `root`, each with an (empty) extension file beside
    it, and the manifest a build of them writes."""
    pkg = ROOT / "src" / "chatfleet"
    for src in native_sources(pkg):
        dst = root / src.relative_to(pkg)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        extension_of(dst).write_bytes(b"")
    (root / MANIFEST).write_text(json.dumps({
        "ext_suffix": EXT_SUFFIX,
        "sources": {str(f.relative_to(root)): digest(f) for f in native_sources(root)}}))


def test_a_build_is_used_only_while_every_source_is_the_one_it_was_built_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHATFLEET_NATIVE", raising=False)
    assert check_build(tmp_path).reason.startswith("not built")
    fake_build(tmp_path)
    assert check_build(tmp_path).compiled
    monkeypatch.setenv("CHATFLEET_NATIVE", "0")
    assert check_build(tmp_path).reason == "off (CHATFLEET_NATIVE=0)"
    monkeypatch.delenv("CHATFLEET_NATIVE")
    edited = tmp_path / "core" / "engine" / "radix.py"
    edited.write_text(edited.read_text() + "\n# an edit\n")
    status = check_build(tmp_path)
    assert not status.compiled and "core/engine/radix.py changed" in status.reason


def test_a_partial_or_foreign_build_is_not_used(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHATFLEET_NATIVE", raising=False)
    fake_build(tmp_path)
    extension_of(tmp_path / "core" / "records.py").unlink()
    assert "core/records.py: its compiled module is missing" in check_build(tmp_path).reason
    fake_build(tmp_path)
    doc = json.loads((tmp_path / MANIFEST).read_text())
    (tmp_path / MANIFEST).write_text(json.dumps({**doc, "ext_suffix": ".cpython-39.so"}))
    assert "another Python" in check_build(tmp_path).reason
    (tmp_path / MANIFEST).write_text("{not json")
    assert "unreadable build manifest" in check_build(tmp_path).reason
    (tmp_path / MANIFEST).write_text("[1, 2]")  # JSON, but no manifest: no AttributeError
    assert "unreadable build manifest" in check_build(tmp_path).reason


def test_an_extension_the_build_does_not_list_makes_the_build_stale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module dropped from NATIVE_MODULES keeps its extension until a build removes it:
    the build is not used, and that module loads from its source as the listed ones do."""
    monkeypatch.delenv("CHATFLEET_NATIVE", raising=False)
    fake_build(tmp_path)
    dropped = tmp_path / "core" / "engine" / "build.py"
    dropped.write_text("# once compiled\n")
    extension_of(dropped).write_bytes(b"")
    status = check_build(tmp_path)
    assert not status.compiled
    assert status.reason.startswith("core/engine/build.") and "does not list" in status.reason
    assert dropped in _native.sources_to_load(tmp_path)
    assert _native.source_of(extension_of(dropped)) == dropped
    plain = tmp_path / "core" / "plan.so"  # the plainest suffix loads too
    extension_of(dropped).unlink()
    plain.write_bytes(b"")
    assert check_build(tmp_path).reason.startswith("core/plan.so")
    assert _native.source_of(plain) == tmp_path / "core" / "plan.py"
    plain.unlink()
    assert check_build(tmp_path).compiled


def test_a_fallback_says_so_once_per_process_tree(tmp_path: Path) -> None:
    """A process that runs the sources while a build is there prints one line on stderr, and
    the processes it starts stay quiet; CHATFLEET_NATIVE=0 asked for it and stays quiet."""
    status = _native.NativeStatus(False, "core/engine/radix.py changed since the build")
    assert _native.fallback_note(status).count("\n") == 0
    assert "radix.py changed" in _native.fallback_note(status)
    script = ("import os, sys, subprocess\n"
              "from chatfleet import _native\n"
              "_native.check_build = lambda root=None: _native.NativeStatus(False, 'stale')\n"
              "_native.compiled_files = lambda root=None: ['x.so']\n"
              "_native.sources_to_load = lambda root=None: []\n"
              "_native.install()\n"
              "_native.install()\n"
              "if len(sys.argv) == 1:\n"
              "    subprocess.run([sys.executable, __file__, 'child'], check=True)\n")
    path = tmp_path / "note.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items()
           if k not in ("CHATFLEET_NATIVE", _native.NOTED_ENV)}
    out = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    lines = out.stderr.splitlines()
    # `import chatfleet` itself may have said it already (a stale build here): one line all told
    assert len([line for line in lines if line.startswith("chatfleet: ")]) == 1, out.stderr
    quiet = subprocess.run([sys.executable, str(path)], env={**env, "CHATFLEET_NATIVE": "0"},
                           capture_output=True, text=True, timeout=60, check=True)
    assert quiet.stderr == ""


def test_a_stale_build_loads_every_compiled_module_from_source(tmp_path: Path) -> None:
    """The finder a stale build installs returns each listed module's .py (a package's with
    its folder to search), and nothing for any other module."""
    fake_build(tmp_path)
    finder = _native.SourceFirst(native_sources(tmp_path), tmp_path)
    spec = finder.find_spec("chatfleet.core.engine.radix")
    assert spec is not None and spec.origin == str(tmp_path / "core/engine/radix.py")
    assert finder.find_spec("chatfleet.core.engine.build") is None  # not compiled
    assert finder.find_spec("chatfleet.core.plan") is None


def test_every_module_the_build_compiles_exists() -> None:
    missing = [m for m in NATIVE_MODULES if not (ROOT / "src" / "chatfleet" / m).is_file()]
    assert missing == []


def test_version_says_whether_the_compiled_core_is_in_use() -> None:
    from typer.testing import CliRunner

    from chatfleet.cli import app

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0
    want = "compiled (mypyc)" if chatfleet.NATIVE.compiled else chatfleet.NATIVE.reason
    assert f"twin core: {'' if chatfleet.NATIVE.compiled else 'Python: '}{want}" in res.output
