"""The compiled core's writing rules (chatfleet/_native.py), as checks: an
`@dataclass(init=False)`'s hand-written `__init__` agrees with its fields and `replace()`
works on it; every worker task round-trips through pickle; the hot heap entries have a named
shape, no `tuple[object, ...]` and no cast. Each runs against the modules this process loaded:
compiled where the build is current (as in CI), the sources otherwise."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import chatfleet
from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine import base_scheduler, eviction
from chatfleet.core.engine.block_pool import Block
from chatfleet.core.engine.kv_cache_manager import VLLMRequest
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.fleet.request import FleetRequest
from chatfleet.core.fleet.session import SessionEntry
from chatfleet.core.fleet.waiting import Waiting
from chatfleet.core.records import RequestRecord
from chatfleet.core.specs import builtin_model, get_gpu
from chatfleet.core.workload.sessions import RequestSpec, Session
from chatfleet.jobs.plan import PlanRequest, engine_spec, sweep_task
from chatfleet.jobs.plan_tasks import FleetRun
from chatfleet.twin import loop
from chatfleet.twin.fleet import FleetConfig
from chatfleet.twin.fleet import _Attempt as Attempt

SRC = Path(chatfleet.__file__).resolve().parent
MODE = "compiled" if chatfleet.NATIVE.compiled else "sources"


def is_init_false_dataclass(deco: ast.expr) -> bool:
    return (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Name)
            and deco.func.id == "dataclass"
            and any(k.arg == "init" and isinstance(k.value, ast.Constant)
                    and k.value.value is False for k in deco.keywords))


def field_init(value: ast.expr | None) -> bool:
    """Whether a field's default marks it `field(init=False)`."""
    return not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id == "field"
                and any(k.arg == "init" and isinstance(k.value, ast.Constant)
                        and k.value.value is False for k in value.keywords))


class Written:
    """One `@dataclass(init=False)` class as its source writes it."""

    def __init__(self, path: Path, node: ast.ClassDef) -> None:
        self.where = f"{path.relative_to(SRC)}:{node.lineno} {node.name}"
        self.module = ".".join(("chatfleet", *path.relative_to(SRC).with_suffix("").parts))
        self.name = node.name
        self.fields: dict[str, bool] = {}  # name -> an __init__ argument
        self.params: list[str] = []
        self.assigned: list[str] = []
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                self.fields[stmt.target.id] = field_init(stmt.value)
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                args = stmt.args
                self.params = [a.arg for a in [*args.posonlyargs, *args.args,
                                               *args.kwonlyargs][1:]]
                for sub in ast.walk(stmt):
                    targets = (sub.targets if isinstance(sub, ast.Assign)
                               else [sub.target] if isinstance(sub, ast.AnnAssign) else [])
                    for t in targets:
                        for leaf in ast.walk(t):
                            if (isinstance(leaf, ast.Attribute)
                                    and isinstance(leaf.value, ast.Name)
                                    and leaf.value.id == "self"):
                                self.assigned.append(leaf.attr)


def written_classes() -> list[Written]:
    out: list[Written] = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                    is_init_false_dataclass(d) for d in node.decorator_list):
                out.append(Written(path, node))
    return out


WRITTEN = written_classes()


def test_the_scan_finds_the_classes_the_rule_is_for() -> None:
    assert {w.name for w in WRITTEN} >= {"Waiting", "_Attempt", "VLLMRequest", "RequestRecord",
                                         "RequestSpec", "Block", "Session", "SessionEntry"}


@pytest.mark.parametrize("cls", WRITTEN, ids=lambda w: w.name)
def test_a_written_init_sets_exactly_its_fields_and_takes_the_init_fields(cls: Written) -> None:
    assert cls.params, f"{cls.where}: no __init__ of its own"
    assert sorted(cls.assigned) == sorted(cls.fields), \
        f"{cls.where}: __init__ sets {sorted(cls.assigned)}, the fields are {sorted(cls.fields)}"
    init_fields = [name for name, init in cls.fields.items() if init]
    assert cls.params == init_fields, (
        f"{cls.where}: __init__ takes {cls.params}; the fields it does not take must be "
        "field(init=False), in the order of the arguments")
    loaded = getattr(importlib.import_module(cls.module), cls.name)
    assert [f.name for f in dataclasses.fields(loaded) if f.init] == init_fields  # as loaded


def attempt() -> Attempt:
    spec = RequestSpec("r1", "s1", 3, 0, 1, ((1, 4),), ((9, 3),), 3)
    a = Attempt(spec, 0)
    a.replica, a.offered = 1, 2.5  # progress that a new attempt starts afresh
    return a


def vllm_request() -> VLLMRequest:
    seq = VLLMRequest(EngineRequest("r1", [1, 2, 3], [4, 5], 2), b"\x01" * 40, 0.25)
    seq.num_computed, seq.mode = 3, "decode"
    return seq


# an instance of each class, and a change replace() must carry (with what it derives)
SAMPLES: dict[str, tuple[Callable[[], Any], dict[str, Any], dict[str, Any]]] = {
    "Waiting": (lambda: Waiting(FleetRequest("r1", "s", 1.0), 0, 7, 2.0, None),
                {"avoid": "http://r1"}, {"key": (0, 0, 7), "seq": 7}),
    "_Attempt": (attempt, {"attempt": 1}, {"replica": None, "offered": 0.0}),
    "VLLMRequest": (vllm_request, {"ready": 1.0}, {"num_computed": 0, "mode": "waiting"}),
    "RequestRecord": (lambda: RequestRecord("r1", "s1", 2, token_times=[1.0, 1.5]),
                      {"outcome": "shed"}, {"token_times": [1.0, 1.5], "turn": 2}),
    "RequestSpec": (lambda: RequestSpec("r1", "s1", 3, 0, 1, ((1, 4),), ((9, 3),), 3),
                    {"turn": 1}, {"prompt_len": 4}),
    "Block": (lambda: Block(11, 1), {"ref_cnt": 2}, {"key": 11}),
    "Session": (lambda: Session("s1", 3, 1, [(1, 4)]), {"turn": 2}, {"history": [(1, 4)]}),
    "SessionEntry": (lambda: SessionEntry("http://r1", 1.0, 100, 50), {"last_seen": 2.0},
                     {"cached_tokens": 50}),
}


@pytest.mark.parametrize("cls", WRITTEN, ids=lambda w: w.name)
def test_replace_works_on_every_written_class(cls: Written) -> None:
    assert cls.name in SAMPLES, f"{cls.where}: add a sample to SAMPLES"
    make, change, then = SAMPLES[cls.name]
    obj = make()
    assert type(obj).__name__ == cls.name
    new = dataclasses.replace(obj, **change)
    for name, value in {**change, **then}.items():
        assert getattr(new, name) == value, name
    same = dataclasses.replace(obj)
    for f in dataclasses.fields(obj):
        if f.init:
            assert getattr(same, f.name) == getattr(obj, f.name), f.name


def worker_tasks() -> list[Any]:
    """Every kind of task the plan hands its worker processes, with settings off their
    defaults: each engine model's sweep, one at an edge of the error band, and fleet runs."""
    tasks: list[Any] = []
    for engine in ("sglang", "vllm"):
        req = PlanRequest(get_gpu("l4"), builtin_model("qwen3-8b"), users=40, grid=(1, 4),
                          rates=(0.5,), duration_s=10.0, warmup_s=2.0, engine_model=engine)
        tasks += [sweep_task(req, "fp8", "fp8"), sweep_task(req, "bf16", "bf16", 1.14)]
        for thermal, fleet in (
                (False, FleetConfig(2, 4, queue_depth=3, hop_s=0.002)),
                (True, FleetConfig(2, 4, queue_depth=5, ttft_budget_s=0.9,
                                   prefill_reserve_s=0.05, affinity=False, hop_s=0.001,
                                   learn_reserve=False, spill="never"))):
            spec = engine_spec(req, "fp8", "fp8", thermal=thermal, max_running_requests=4)
            tasks.append(FleetRun(spec, req.profile.workload(), ClosedLoad(12), fleet,
                                  duration_s=20.0, seed=5, slo=req.slo))
    return tasks


def test_every_worker_task_round_trips_through_pickle() -> None:
    for task in worker_tasks():
        again = pickle.loads(pickle.dumps(task))
        assert again == task, f"{type(task).__name__} ({MODE})"


def test_a_fleet_run_gives_in_a_worker_what_it_gives_here() -> None:
    task = worker_tasks()[-1]
    assert isinstance(task, FleetRun) and task.fleet.spill == "never" and task.spec.thermal
    sent = pickle.loads(pickle.dumps(task))
    assert sent.point().to_json() == task.point().to_json()


def test_the_hot_heap_entries_have_a_named_shape() -> None:
    """No heap of the twin's hot path holds `tuple[object, ...]` or is read through a cast."""
    hot = ["core/engine/eviction.py", "core/engine/base_scheduler.py", "twin/loop.py",
           "core/engine/radix.py", "core/engine/host_tier.py"]
    for rel in hot:
        text = (SRC / rel).read_text(encoding="utf-8")
        assert "tuple[object, ..." not in text and "cast(" not in text, rel
    assert eviction.LeafEntry.__args__[-1].__name__ == "TreeNode"  # type: ignore[attr-defined]
    assert base_scheduler.FinishEntry.__args__[-1] is EngineRequest  # type: ignore[attr-defined]
    assert len(loop.Event.__args__) == 4  # type: ignore[attr-defined]
