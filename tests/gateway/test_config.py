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
    assert cfg.timeouts.client_read_s == 10 and cfg.max_connections == 4096
    over = Overrides(("http://127.0.0.1:9000",), cap=3, queue_depth=0).apply(cfg)
    assert [r.name for r in over.replicas] == ["127.0.0.1:9000"]
    assert (over.cap, over.queue_depth) == (3, 0)


def test_the_reserve_and_the_spill_rule_load_with_their_defaults() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.reserve.learn and cfg.reserve.percentile == 99 and cfg.reserve.max_s is None
    assert cfg.reserve.resolution_s == 0.01 and cfg.routing.spill == "cost"
    assert parse_config({}).reserve == cfg.reserve
    assert parse_config({"reserve": {"learn": False, "max_s": 5}}).reserve.learn is False
    assert parse_config({"routing": {"spill": "never"}}).routing.spill == "never"


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
    ({"timeouts": {"idle_s": 0.01}}, r"timeouts.idle_s: must lie in \[1, 3600\]"),
    ({"timeouts": {"client_header_s": 0.1}}, r"client_header_s: must lie in \[0.5, 300\]"),
    ({"timeouts": {"client_idle_s": 7200}}, r"client_idle_s: must lie in \[1, 3600\]"),
    ({"timeouts": {"client_read_s": 0.5}}, r"client_read_s: must lie in \[1, 3600\]"),
    ({"max_connections": 4}, r"max_connections: must lie in \[16, 1e\+06\]"),
    ({"max_connections": 100.5}, "whole number"),
    ({"routing": {"colour": 1}}, "unknown key"),
    ({"shared_prompt": {"mode": "mine"}}, "shared_prompt"),
    ({"ttft_budget_s": 0.5, "prefill_reserve_s": 0.5}, "prefill_reserve_s"),
    ({"bogus": 1}, "unknown key"),
    ({"reserve": {"percentile": 0}}, r"reserve.percentile: must be positive"),
    ({"reserve": {"percentile": 120}}, r"reserve.percentile: must lie in \[1, 100\]"),
    ({"reserve": {"window_s": 0}}, "reserve.window_s: must be positive"),
    ({"reserve": {"max_samples": 2.5}}, "reserve.max_samples: must be a whole number"),
    ({"reserve": {"learn": "yes"}}, "reserve.learn: must be true or false"),
    ({"reserve": {"max_s": 1.0}}, r"reserve.max_s < ttft_budget_s"),
    ({"reserve": {"min_s": 0.4, "max_s": 0.3}}, r"reserve.min_s <= reserve.max_s"),
    ({"ttft_budget_s": 0.3, "reserve": {"min_s": 0.2}}, "max_s unset is half of it"),
    ({"reserve": {"colour": 1}}, "reserve: unknown key"),
    ({"reserve": {"resolution_s": 1}}, r"reserve.resolution_s: must lie in \[0.001, 0.1\]"),
    ({"routing": {"spill": "sometimes"}}, "routing.spill: must be one of cost, full, never"),
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


def test_a_duplicate_key_is_refused_with_its_name_and_line(tmp_path: Path) -> None:
    """A second `timeouts:` once replaced the first silently (its idle_s gone, every stream
    cut): YAML's last-one-wins is refused, at every level, in YAML and JSON."""
    path = tmp_path / "g.yaml"
    path.write_text("cap: 4\ntimeouts: {idle_s: 600}\nqueue_depth: 8\ntimeouts:\n"
                    "  first_byte_s: 30\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'timeouts' on line 4 \(first on "
                                          r"line 2\)"):
        load_config(path)
    path.write_text("routing:\n  affinity: true\n  session_ttl_s: 60\n  affinity: false\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'affinity' on line 4"):
        load_config(path)
    path.write_text("replicas:\n  - {name: a, url: 'http://x:1', name: b}\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'name' on line 2"):
        load_config(path)
    js = tmp_path / "g.json"
    js.write_text('{"cap": 4, "timeouts": {"idle_s": 600}, "timeouts": {"first_byte_s": 30}}')
    with pytest.raises(ConfigError, match="duplicate key 'timeouts'"):
        load_config(js)
    # the same key in two different mappings is no duplicate
    path.write_text("timeouts: {idle_s: 600}\nstate: {timeout_s: 0.5}\nhealth: {}\n"
                    "replicas: [{name: a, url: 'http://x:1'}, {name: b, url: 'http://x:2'}]\n")
    assert load_config(path).timeouts.idle_s == 600


def test_the_gateways_flag_sets_state_gateways_and_is_checked() -> None:
    """`chatfleet gateway --gateways N` (what `chatfleet launch` passes to each gateway it starts
    on a shared state) wins over the file, as every flag does; below 1 it is refused."""
    from chatfleet.gateway.config import GatewayConfig, Overrides

    cfg = Overrides(("http://127.0.0.1:9",), 4, None, 3).apply(GatewayConfig())
    assert cfg.state.gateways == 3
    with pytest.raises(ConfigError, match="--gateways"):
        Overrides(("http://127.0.0.1:9",), 4, None, 0).apply(GatewayConfig())
