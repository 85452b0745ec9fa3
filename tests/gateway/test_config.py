"""The gateway's configuration: the documented example loads, bad files get clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatfleet.gateway.config import (
    ConfigError,
    Overrides,
    cap_from_sweep,
    hash_key,
    load_config,
    parse_config,
)

EXAMPLE = Path(__file__).parents[2] / "docs" / "gateway.example.yaml"


def test_the_documented_example_loads() -> None:
    cfg = load_config(EXAMPLE)
    assert [r.name for r in cfg.replicas] == ["l4-a", "l4-b"]
    assert [cfg.replica_cap(r) for r in cfg.replicas] == [8, 8]
    assert cfg.find_key("password") is not None  # the example's key hashes are of toy keys
    assert cfg.find_key("nope") is None
    assert cfg.is_admin("1234") and not cfg.is_admin("password")
    assert cfg.shared_prompt.mode == "own" and len(cfg.shared_prompt.tools) == 1
    assert cfg.state.gateways == 2 and parse_config({}).state.gateways == 0
    over = Overrides(("http://127.0.0.1:9000",), cap=3, queue_depth=0).apply(cfg)
    assert [r.name for r in over.replicas] == ["127.0.0.1:9000"]
    assert (over.cap, over.queue_depth) == (3, 0)


@pytest.mark.parametrize(("raw", "message"), [
    ({"cap": -1}, "cap"),
    ({"cap": "8"}, "must be a number"),
    ({"queue_depth": 1.5}, "whole number"),
    ({"replicas": ["https://x:1"]}, "not an http://host:port"),
    ({"replicas": ["http://x:1/v1"]}, "not an http://host:port"),
    ({"replicas": ["http://x:1", "http://x:1"]}, "duplicate"),
    ({"keys": [{"name": "a", "sha256": "plaintext-key"}]}, "plaintext keys"),
    ({"admin": {"sha256": "abc"}}, "sha256"),
    ({"timeouts": {"idle_s": 0}}, "positive"),
    ({"state": {"gateways": -1}}, "state.gateways"),
    ({"state": {"gateways": 1.5}}, "whole number"),
    ({"routing": {"colour": 1}}, "unknown key"),
    ({"shared_prompt": {"mode": "mine"}}, "shared_prompt"),
    ({"ttft_budget_s": 0.5, "prefill_reserve_s": 0.5}, "prefill_reserve_s"),
    ({"bogus": 1}, "unknown key"),
])
def test_bad_configs_name_the_key(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Overrides(("http://127.0.0.1:1",) if "replicas" not in raw else ()).apply(
            parse_config(raw))


def test_files_and_sweeps(tmp_path: Path) -> None:
    bad = tmp_path / "g.yaml"
    bad.write_text("cap: [1")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="no replicas"):
        Overrides().apply(parse_config({}))
    sweep = tmp_path / "s.json"
    sweep.write_text('{"schema": "chatfleet.sweep/1", "recommended_cap": 6}')
    assert cap_from_sweep(sweep) == 6
    sweep.write_text('{"schema": "chatfleet.sweep/1", "recommended_cap": null}')
    with pytest.raises(ConfigError, match="recommended_cap"):
        cap_from_sweep(sweep)
    assert hash_key("k").startswith("sha256:") and len(hash_key("k")) == 71
