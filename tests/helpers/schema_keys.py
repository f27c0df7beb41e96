"""Breaker keys written the way each key schema's script writes them, for read-side tests
(listing thousands of names, v1 keys left by workers not yet upgraded)."""

from __future__ import annotations

from typing import Any

from distbreaker._runtime.keys import BreakerKeys
from distbreaker._runtime.state_record import MAGIC, STATES, encode_fields
from distbreaker.breaker.config import BreakerConfig, WindowType
from distbreaker.breaker.core import config_fingerprint


def write_v2(pipe: Any, name: str, config: BreakerConfig, state: str = "CLOSED",
             prefix: str = "distbreaker", **fields: int) -> None:
    """A v2 state record (header with the config parsed, empty window) and its meta hash."""
    wire = config.to_wire()
    keys = BreakerKeys.build(name, prefix)
    header = {"magic": MAGIC, "fp": config_fingerprint(wire), "state": STATES.index(state),
              "window_type": 1 if config.sliding_window_type is WindowType.TIME_BASED else 0,
              "window_size": config.sliding_window_size,
              "minimum_calls": config.effective_minimum_calls,
              "key_ttl_ms": round(config.key_ttl * 1000), **fields}
    pipe.set(keys.state, encode_fields(b"", **header))
    pipe.hset(keys.meta, "cfg", wire)


def v1_key(name: str, suffix: str = "", prefix: str = "distbreaker") -> str:
    """A key of key schema v1: ``<prefix>:v1:{<name>}:cb<suffix>``."""
    return f"{prefix}:v1:{{{name}}}:cb{suffix}"


def write_v1(pipe: Any, name: str, config: BreakerConfig, state: str = "CLOSED",
             prefix: str = "distbreaker", window: dict[str, str] | None = None,
             **fields: Any) -> None:
    """A v1 breaker as lua/breaker.lua of schema v1 wrote it (docs/KEY_SCHEMA.md v1):
    the state hash (field `v` 1, `cfg` the wire string, `state`, counters) and, when
    given, the window hash (count window: field = slot, value "<failed>,<slow>,<ms>")."""
    pipe.hset(v1_key(name, "", prefix), mapping={
        "v": "1", "cfg": config.to_wire(), "state": state, "since": "1", "open_until": "0",
        "calls": "0", "failures": "0", "slow": "0", "total_ms": "0", "head": "0",
        "wsec": "0", "hp_issued": "0", "hp_done": "0", "hp_fail": "0", "hp_slow": "0",
        "rejected": "0", "gen": "0", "reason": "", "actor": "", "opens": "0",
        "ov_until": "0", "ttl_at": "1", **{k: str(v) for k, v in fields.items()}})
    if window:
        pipe.hset(v1_key(name, ":win", prefix), mapping=window)
