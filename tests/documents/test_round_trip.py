"""The typed documents keep the files byte for byte: chatfleet.sweep/1 (a live sweep measured
on an H200, the twin's sweeps), chatfleet.plan/1 and chatfleet.cache/1.

- load -> typed -> dump gives the same bytes (with the project's own `dumps`);
- the twin's outputs, made now by the public CLI, are the bytes the code wrote before the
  documents were typed (tests/documents/data: fixtures.py says which and how);
- a key a newer version added survives a round trip, in every object of a document.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from chatfleet.core.documents.cache import CacheDoc
from chatfleet.core.documents.fields import DocumentError
from chatfleet.core.documents.plan import Plan
from chatfleet.core.documents.sweep import (
    ClosedLoad,
    OpenLoad,
    SweepDoc,
    SweepPoint,
    load_from_json,
)
from chatfleet.io import dumps
from tests.documents.fixtures import RUNS, make

DATA = Path(__file__).parent / "data"
H200 = Path(__file__).parents[2] / "docs" / "device" / "h200-sweep.json"
SWEEPS = sorted(n for n in RUNS if "sweep" in n)
PLANS = sorted(n for n in RUNS if n.startswith("plan"))
TYPES: dict[str, type[SweepDoc] | type[Plan] | type[CacheDoc]] = {
    **dict.fromkeys(SWEEPS, SweepDoc), **dict.fromkeys(PLANS, Plan), "cache.json": CacheDoc}


def typed(name: str, raw: bytes) -> SweepDoc | Plan | CacheDoc:
    return TYPES[name].from_json(orjson.loads(raw))


def test_the_h200_live_sweep_round_trips_byte_for_byte() -> None:
    raw = H200.read_bytes()
    doc = SweepDoc.from_json(orjson.loads(raw))
    assert dumps(doc.to_json()) == raw
    # and it was read, not carried: the live run's blocks are typed
    p = doc.points[0]
    assert p.live is not None and p.live.cooldown is not None and p.gpu.sampled is not None
    assert (p.load, p.live.run_index, p.gpu.sampled.source) == (ClosedLoad(1), 0, "nvml:0")
    assert p.requests.finished_in_window is None  # absent in that file: stays absent


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_twins_outputs_round_trip_byte_for_byte(name: str) -> None:
    raw = (DATA / name).read_bytes()
    assert dumps(typed(name, raw).to_json()) == raw


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_twins_outputs_are_the_bytes_the_untyped_code_wrote(name: str,
                                                                 tmp_path: Path) -> None:
    assert make(name, tmp_path).read_bytes() == (DATA / name).read_bytes()


# objects that map names to records (a plan's precisions, its sweeps, an entry's launch
# commands by engine): a newer version adds entries there, not keys
MAPS = (".by_precision", ".sweeps", ".launch")


def _add_unknown_keys(node: Any, path: str = "") -> Any:
    """Every JSON object of the document gets a key no version of chatfleet knows."""
    if isinstance(node, dict):
        out = {k: _add_unknown_keys(v, f"{path}.{k}") for k, v in node.items()}
        if not path.endswith(MAPS):
            out["x_from_a_newer_version"] = path or "/"
        return out
    if isinstance(node, list):
        return [_add_unknown_keys(v, f"{path}[{i}]") for i, v in enumerate(node)]
    return node


def _keys(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _keys(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_keys(v) for v in node]
    return node


@pytest.mark.parametrize("name", ["twin-sweep.json", "twin-fleet-sweep.json", "plan.json",
                                  "cache.json", "h200"])
def test_unknown_keys_survive_a_round_trip(name: str) -> None:
    raw = H200.read_bytes() if name == "h200" else (DATA / name).read_bytes()
    kind = SweepDoc if name == "h200" else TYPES[name]
    newer = _add_unknown_keys(orjson.loads(raw))
    back = kind.from_json(copy.deepcopy(newer)).to_json()
    # the same content, every unknown key included (an unknown key is written after the
    # known keys of its object, so the order may differ from the newer version's)
    assert _keys(back) == _keys(newer)
    assert back == newer


def test_a_hand_made_point_reads_with_the_contracts_defaults() -> None:
    p = SweepPoint.from_json({"load": {"mode": "open", "rate_rps": 2}, "attainment": 1,
                              "valid": True})
    assert p.load == OpenLoad(2) and p.attainment == 1 and p.valid
    assert p.engine.max_running == 0 and p.gpu.sm_clock_mhz.p50 == 0 and p.live is None
    out = p.to_json()
    assert out["load"] == {"mode": "open", "rate_rps": 2}  # the int stays an int
    assert out["gpu"]["sm_clock_mhz"] == {"p50": 0, "min": 0}
    assert "run_index" not in out and "time_scale" not in out


@pytest.mark.parametrize(("data", "message"), [
    ({"load": {"mode": "closed"}}, "needs 'concurrency'"),
    ({"load": {"mode": "sideways", "concurrency": 1}}, "mode must be"),
    ({"load": {"mode": "closed", "concurrency": 2}, "attainment": "high"}, "'attainment'"),
    ({"load": {"mode": "closed", "concurrency": True}}, "'concurrency' must be an integer"),
    ({"load": {"mode": "closed", "concurrency": 2}, "ttft_ms": {"p50": None}}, "'p50'"),
    ({"attainment": 1.0}, "needs a load"),
])
def test_a_malformed_point_says_where(data: dict[str, Any], message: str) -> None:
    with pytest.raises(DocumentError, match=message):
        SweepPoint.from_json(data, "point 3")


def test_loads_carry_their_arrival_process_to_a_new_value() -> None:
    gamma = load_from_json({"mode": "open", "rate_rps": 8.0, "arrival": "gamma:2",
                            "burstiness": 2.0})
    assert isinstance(gamma, OpenLoad) and gamma.at(4).to_json() == {
        "mode": "open", "rate_rps": 4.0, "arrival": "gamma:2", "burstiness": 2.0}
    assert ClosedLoad(8).at(12.0).to_json() == {"mode": "closed", "concurrency": 12}


def test_a_typed_document_is_never_written_by_accident() -> None:
    """orjson would write a dataclass's own fields (live, modelled, extra), not the file's
    keys: the project's dumps refuses it."""
    doc = SweepDoc.from_json(orjson.loads(H200.read_bytes()))
    with pytest.raises(TypeError):
        dumps(doc)
