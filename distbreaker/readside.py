"""Read-only views of the shared state for operator tools (the CLI, exporters).

Only reads (SCAN, GET/GETRANGE, HGETALL, ZRANGE, XRANGE, PTTL, TIME), decoded into the
JSON-friendly dicts of the CLI's ``--json`` schema (docs/CLI_JSON.md). Nothing here decides
a transition: a stored OPEN whose wait has elapsed is OPEN with ``retry_in_s == 0``. The
one exception is an operator's override whose end has passed: every read shows the state
it ended in (`AFTER_OVERRIDE`, the `override_ended` row of lua/lib/breaker_transitions.lua,
a test keeps them equal) since its end time, without waiting for a call to record it, so
an ended `open --for 5s` never looks active (``override_ended_ms`` says so).

Two key schemas are read: v2 (the current one, ``<prefix>:v2``: the breaker's state is a
binary record, see `distbreaker._runtime.state_record`) and, read-only during a rolling
deploy, v1 (``<prefix>:v1``: the breaker's state and window are hashes). Every row and
detail says which one it came from (``schema``: "v2" or "v1").
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from redis.client import NEVER_DECODE

from ._runtime import state_record
from ._runtime.keys import (
    BreakerKeys,
    BudgetKeys,
    BulkheadKeys,
    RateLimiterKeys,
    namespace,
    validate_name,
)
from ._runtime.scripts import text
from .breaker.config import MAX_COUNT_WINDOW, MAX_TIME_WINDOW, BreakerConfig, WindowType
from .breaker.core import config_fingerprint, rate
from .breaker.shadow import (
    HEADER_BYTES,
    MAX_SHADOWS,
    SHADOWED,
    decode_shadow_event,
    decode_shadows,
    shadow_history_key,
    shadow_key,
    shadow_ring_key,
)
from .breaker.state import State
from .errors import SchemaError

JSON_SCHEMA_VERSION = 1
SCAN_COUNT = 500
"""Keys asked per SCAN step: bounded, so Redis never blocks on one huge reply."""

#: The key schema this version writes, and the older one it still reads (read-only).
V2, V1 = "v2", "v1"
SCHEMAS = (V2, V1)
# Key suffixes after ``{name}`` and the component each belongs to, per key schema.
_COMMON = {":cb": "breaker", ":cb:probes": "breaker", ":cb:events": "breaker",
           ":bh": "bulkhead", ":bh:meta": "bulkhead", ":bh:notify": "bulkhead",
           ":rb": "budget", ":rb2": "budget"}
_SUFFIXES = {V2: {**_COMMON, ":cb:meta": "breaker", ":cb:fw": "breaker",
                  ":rl": "rate_limiter"},
             V1: {**_COMMON, ":cb:win": "breaker"}}
_STATE_INTS = ("since", "open_until", "calls", "failures", "slow", "total_ms", "head",
               "wsec", "hp_issued", "hp_done", "hp_fail", "hp_slow", "rejected", "gen",
               "ov_until")
#: The stored `cfg` of a breaker only an operator has touched: the first worker stores its own.
UNSET_CONFIG = "unset"
#: The v2 meta fields a summary needs (the current state's reason and actor too).
_META_FIELDS = ("cfg", "drift_cfg", "drift_at", "reason", "actor")
#: The quorum trip's marks hash: the state key plus this (docs/KEY_SCHEMA.md).
QUORUM_SUFFIX = ":fw"
#: The config rollout's fields live in the meta hash; clients before that kept them in a
#: hash of their own, the state key plus this, which readers merge while it exists
#: (docs/KEY_SCHEMA.md, "Config rollouts").
LEGACY_ROLLOUT_SUFFIX = ":cfgs"


def schema_namespace(prefix: str, schema: str = V2) -> str:
    """The namespace of a key schema: ``<prefix>:v2`` (current) or ``<prefix>:v1``."""
    if schema not in SCHEMAS:
        raise ValueError(f"unknown key schema {schema!r}, expected one of {SCHEMAS}")
    current = namespace(prefix)
    return current if schema == V2 else f"{prefix}:{schema}"


def _in_schema(key: str, prefix: str, schema: str) -> str:
    """A v2 key of this module's key classes moved to `schema`'s namespace (v1 kept the
    same key names under ``:v1``, except for the breaker's state and window)."""
    return schema_namespace(prefix, schema) + key[len(namespace(prefix)):]


@dataclasses.dataclass(frozen=True)
class NameKeys:
    """Every key of one name in one key schema (v1: `meta` is the window hash)."""

    schema: str
    state: str
    meta: str
    probes: str
    history: str
    bh_leases: str
    bh_meta: str
    bh_notify: str
    rb: str
    fw: str
    rl: str
    rb1: str  # budget layout 1 (a hash; the v1 schema's only budget key): older workers

    @classmethod
    @functools.lru_cache(maxsize=16384)  # immutable; the dashboard reads the same names often
    def build(cls, name: str, prefix: str, schema: str = V2) -> NameKeys:
        bk, hk, rk = (BreakerKeys.build(name, prefix), BulkheadKeys.build(name, prefix),
                      BudgetKeys.build(name, prefix))
        v2 = {"state": bk.state, "meta": bk.meta, "probes": bk.probes,
              "history": bk.history, "bh_leases": hk.leases, "bh_meta": hk.meta,
              "bh_notify": hk.notify, "rb": rk.slices, "fw": f"{bk.state}:fw",
              "rl": RateLimiterKeys.build(name, prefix).bucket, "rb1": rk.layout1}
        keys = v2 if schema == V2 else {role: _in_schema(key, prefix, schema)
                                        for role, key in v2.items()}
        if schema == V1:
            keys["meta"] = keys["state"] + ":win"
            keys["rb"] = keys["rb1"]
        return cls(schema=schema, **keys)

    def expected_types(self) -> dict[str, str]:
        """Each key and the Redis type this schema stores in it."""
        state, meta = ("string", "hash") if self.schema == V2 else ("hash", "hash")
        return {self.state: state, self.meta: meta, self.probes: "zset",
                self.history: "stream", self.bh_leases: "zset", self.bh_meta: "hash",
                self.bh_notify: "list", self.rb1: "hash", self.fw: "hash",
                self.rl: "hash", self.rb: "string" if self.schema == V2 else "hash"}

    def unread(self, parts: Iterable[str]) -> dict[str, str]:
        """The keys of `parts` a summary does not read (the history, the waiters' list;
        v1: the quorum marks, which a v2 summary reads), with their types: `ls` asks
        their TYPE so that a foreign type there is an error row too."""
        unread = (self.history,) if self.schema == V2 else (self.history, self.fw)
        wanted = {"breaker": unread, "bulkhead": (self.bh_notify,)}
        types = self.expected_types()
        return {key: types[key] for part in parts for key in wanted.get(part, ())}


def _glob_escape(value: str) -> str:
    """Escape Redis glob specials so a prefix matches only itself."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)


def is_cluster(client: Any) -> bool:
    """True for a redis-py RedisCluster client (scans and scripts go to every primary)."""
    return hasattr(client, "get_primaries")


def server_now_ms(client: Any) -> int:
    """Redis server time in ms: the only clock distbreaker's state is measured with."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def name_from_key(key: str, prefix: str, schema: str = V2) -> tuple[str, str] | None:
    """``(name, component)`` for a distbreaker key of `schema` under `prefix`, else None."""
    head = schema_namespace(prefix, schema) + ":{"
    if not key.startswith(head):
        return None
    for tail, component in _TAILS[schema]:
        if key.endswith(tail) and len(key) > len(head) + len(tail):
            return key[len(head):-len(tail)], component
    return None


#: Per key schema, ("}" + suffix, component), longest suffix first (`name_from_key`).
_TAILS = {schema: [("}" + suffix, suffixes[suffix])
                   for suffix in sorted(suffixes, key=len, reverse=True)]
          for schema, suffixes in _SUFFIXES.items()}


def key_schema(key: str, prefix: str) -> str | None:
    """Which key schema a distbreaker key under `prefix` belongs to, else None."""
    return next((s for s in SCHEMAS if name_from_key(key, prefix, s) is not None), None)


def scan_pattern(prefix: str, schema: str = V2) -> str:
    """The SCAN MATCH pattern of every name's keys in `schema` under `prefix`."""
    return _glob_escape(schema_namespace(prefix, schema)) + ":{*"


def _scan_raw(client: Any, prefix: str, count: int, schema: str = V2) -> Iterator[Any]:
    """The keys as the client returns them (bytes, unless it decodes responses)."""
    kwargs: dict[str, Any] = {"match": scan_pattern(prefix, schema), "count": count}
    if is_cluster(client):
        kwargs["target_nodes"] = client.PRIMARIES
    yield from client.scan_iter(**kwargs)


@dataclasses.dataclass
class Scan:
    """What a SCAN of the prefix found: valid protected names with the components that
    have keys (`names`: key schema v2; `legacy`: v1 keys left by workers not yet
    upgraded), and the keys whose name part is not a valid name (written by another
    client), by that name part. Keys with an unknown suffix are not distbreaker's and
    are left out of all three."""

    names: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    invalid: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    legacy: dict[str, set[str]] = dataclasses.field(default_factory=dict)


def scan(client: Any, prefix: str, count: int = SCAN_COUNT, legacy: bool = True) -> Scan:
    """Every key under the prefix (v2, and v1 unless `legacy` is False), sorted into
    valid names and foreign name parts."""
    found = Scan()
    for schema in SCHEMAS if legacy else (V2,):
        for raw in _scan_raw(client, prefix, count, schema):
            sort_key(found, raw, prefix, schema)
    for keys in found.invalid.values():
        keys.sort()
    return found


def sort_key(found: Scan, raw: Any, prefix: str, schema: str = V2) -> None:
    """Add one scanned key (as the client returned it) of `schema` to `found`: its name's
    components, or its invalid name part (the dashboard scans a step at a time)."""
    key = text(raw)
    parsed = name_from_key(key, prefix, schema)
    if parsed is None:
        return
    name, component = parsed
    names = found.names if schema == V2 else found.legacy
    known = names.get(name)  # a name is checked once, not once per key
    if known is not None and _utf8(raw):
        known.add(component)
    elif (name in found.invalid or _invalid_name(name) is not None
            or not _utf8(raw)):  # its name part was decoded with replacement chars
        found.invalid.setdefault(name, []).append(key)
    else:
        names.setdefault(name, set()).add(component)


def scan_names(client: Any, prefix: str,
               count: int = SCAN_COUNT) -> dict[str, set[str]]:
    """Valid protected names under the prefix (key schema v2), each with the components
    that have keys (name parts that are not valid names are in `scan(...).invalid`)."""
    return scan(client, prefix, count, legacy=False).names


def _utf8(raw: Any) -> bool:
    """Whether a raw key is UTF-8 (the only keys distbreaker writes are)."""
    try:
        raw.decode("utf-8") if isinstance(raw, bytes) else None
    except UnicodeDecodeError:
        return False
    return True


def _invalid_name(name: str) -> str | None:
    """Why `name` cannot be a protected name, or None when it can."""
    try:
        validate_name(name)
    except ValueError as exc:
        return str(exc)
    return None


def invalid_row(name: str, keys: Sequence[str], prefix: str | None = None) -> dict[str, Any]:
    """The summary row of a name part that is not a valid name: only `error` is set (its
    `schema` is v1 when every key is a v1 key under `prefix`, else v2)."""
    why = _invalid_name(name) or "its key is not UTF-8; shown with replacement characters"
    error = f"not a distbreaker name ({why})"
    schema = V2
    if keys:
        shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
        error += f": {len(keys)} foreign key{'s' if len(keys) != 1 else ''} {shown}"
        if prefix is not None and all(key_schema(k, prefix) == V1 for k in keys):
            schema = V1
    return {**_empty_row(name, schema), "error": error}


def _empty_row(name: str, schema: str = V2) -> dict[str, Any]:
    return {"name": name, "schema": schema, "state": None, "breaker": None,
            "bulkhead": None, "budget": None, "rate_limiter": None, "error": None}


def read_rows(client: Any, prefix: str, found: Scan) -> list[dict[str, Any]]:
    """One summary row per valid name and key schema, and per invalid name part, sorted
    by name (a name with keys of both schemas: the v2 row first): the `ls` listing. A
    foreign key never stops the listing, it becomes a row's `error`."""
    rows = list(read_summaries(client, prefix, found.names))
    rows += read_summaries(client, prefix, found.legacy, schema=V1)
    rows += [invalid_row(name, keys, prefix) for name, keys in found.invalid.items()]
    return sorted(rows, key=lambda r: (r["name"], SCHEMAS.index(r["schema"])))


def foreign_key_count(found: Scan, rows: Iterable[Mapping[str, Any]]) -> int:
    """Keys distbreaker cannot read: every key of an invalid name part, plus one per
    valid name whose keys hold a foreign type or content (its row's `error`)."""
    return (sum(len(keys) for keys in found.invalid.values())
            + sum(1 for r in rows if r["error"] and r["name"] not in found.invalid))


# -- decoding ---------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _config(wire: str) -> tuple[dict[str, Any], int]:
    """(named thresholds, effective minimum calls) of a wire string; a fleet has few."""
    try:
        cfg = BreakerConfig.from_wire(wire)
    except ValueError as exc:
        raise SchemaError(str(exc)) from None
    return {
        "wire": wire,
        "sliding_window_type": cfg.sliding_window_type.value,
        "sliding_window_size": cfg.sliding_window_size,
        "minimum_number_of_calls": cfg.minimum_number_of_calls,
        "failure_rate_threshold": cfg.failure_rate_threshold,
        "slow_call_rate_threshold": cfg.slow_call_rate_threshold,
        "slow_call_duration_s": cfg.slow_call_duration,
        "wait_duration_in_open_state_s": cfg.wait_duration_in_open_state,
        "permitted_calls_in_half_open": cfg.permitted_calls_in_half_open,
        "max_wait_in_half_open_s": cfg.max_wait_in_half_open,
        "half_open_lease_s": cfg.half_open_lease,
        "key_ttl_s": cfg.key_ttl,
        "initial_state": str(cfg.initial_state),
        "transition_after_max_wait_in_half_open": str(cfg.transition_after_max_wait_in_half_open),
        "min_failing_workers": cfg.min_failing_workers,
        "quorum_window_s": cfg.quorum_window,
    }, cfg.effective_minimum_calls


def decode_state_hash(name: str, raw: Mapping[Any, Any], now_ms: int,
                      probe_deadlines: Sequence[int] = ()) -> dict[str, Any]:
    """A v1 breaker's state hash as a JSON-friendly dict (see docs/CLI_JSON.md); read-only
    support for workers not yet upgraded to key schema v2.

    `probe_deadlines` are the unexpired half-open lease deadlines, when known;
    they tell when a full half-open state frees a probe slot.
    """
    h = {text(k): text(v) for k, v in raw.items()}
    if h.get("v", "1") != "1":
        raise SchemaError(f"breaker {name!r} has schema version {h.get('v')!r}, "
                          "this tool reads 1")
    try:
        state = State(h.get("state", ""))
    except ValueError:
        raise SchemaError(f"breaker {name!r} has unknown state {h.get('state')!r}") from None
    try:
        n = {f: int(h.get(f, "0") or 0) for f in _STATE_INTS}
    except ValueError:
        raise SchemaError(f"breaker {name!r}: a counter field is not a number") from None
    wire = h.get("cfg") or UNSET_CONFIG
    return _breaker_view(name, state, n, wire, h, now_ms, probe_deadlines)


def decode_state_record(name: str, data: bytes, meta: Mapping[Any, Any], now_ms: int,
                        probe_deadlines: Sequence[int] = (),
                        quorum_marks: Mapping[Any, Any] | None = None,
                        rollout: Mapping[Any, Any] | None = None) -> dict[str, Any]:
    """A v2 breaker's state record (bytes) and meta hash as the same dict as
    `decode_state_hash` makes of a v1 hash.

    The record's config fingerprint must match the stored `cfg` (fingerprint 0: no
    config stored yet, shown with the defaults); anything else is foreign data.
    """
    try:
        fields = state_record.decode_record(data)
    except state_record.NotAStateRecord as exc:
        raise SchemaError(f"breaker {name!r}: its state record {exc}") from None
    m = {text(k): text(v) for k, v in meta.items()}
    wire = m.get("cfg") or ""
    if fields["fp"] == 0:
        wire = UNSET_CONFIG
    elif not wire:
        raise SchemaError(f"breaker {name!r}: the state record names a stored config "
                          "(fingerprint) but its meta hash has no cfg")
    elif config_fingerprint(wire) != fields["fp"]:
        raise SchemaError(f"breaker {name!r}: the stored cfg {wire!r} does not match the "
                          "state record's config fingerprint")
    n = {f: int(fields[f]) for f in _STATE_INTS if f != "hp_issued"}
    # v2 keeps no issued-permit counter: the probes issued are the reported ones plus
    # the live leases (what admission counts)
    n["hp_issued"] = n["hp_done"] + sum(1 for d in probe_deadlines if d > now_ms)
    n["calls_total"], n["failures_total"] = fields["calls_total"], fields["failures_total"]
    n["slow_total"] = fields["slow_total"]
    view = _breaker_view(name, State(fields["state"]), n, wire, m, now_ms, probe_deadlines)
    view["quorum"] = decode_quorum(view, quorum_marks or {}, now_ms)
    view["shadowed"] = fields["seq"] >= SHADOWED  # shadow configs exist (read_shadows)
    view["configs"], view["config_in_force"] = decode_rollout(
        rollout or {}, fields["fp"], wire, now_ms)
    return view


#: A worker counts as running its config this long after its last hello
#: (lua/lib/breaker_rollout.lua LIVE_MS).
ROLLOUT_LIVE_MS = 60_000


def merge_rollout(meta: Mapping[Any, Any],
                  legacy: Mapping[Any, Any] | None) -> dict[str, str]:
    """The config rollout's fields: the meta hash's over the legacy rollout hash's
    (``<state key>:cfgs``, kept by workers of a version before the merge while they run):
    a worker's later hello wins, and the adoption (`f:` fields) whose hash has one.
    Non-rollout fields of the meta hash come along; `decode_rollout` ignores them."""
    m = {text(k): text(v) for k, v in meta.items()}
    if not legacy:
        return m
    out = {k: v for k, v in ((text(k), text(v)) for k, v in legacy.items())
           if not (k.startswith("f:") and "f:at" in m)}
    for k, v in m.items():
        if k.startswith("w:") and k in out and _seen(out[k]) > _seen(v):
            continue
        out[k] = v
    return out


def _seen(entry: str) -> int:
    """A worker entry's (`<fp>:<ms>`) last hello, ms."""
    return _int_or(entry.partition(":")[2], 0)


def decode_rollout(raw: Mapping[Any, Any], in_force: int, wire: str,
                   now_ms: int) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The configs deployed (the config rollout's fields of the meta hash, merged by
    `merge_rollout`): one entry per config
    fingerprint the hash knows, with the workers that said hello with it in the last
    minute, in force first, then newest deployment first; and how the config in force
    got there (None for a record without one)."""
    h = {text(k): text(v) for k, v in raw.items()}
    workers: dict[str, int] = {}  # (a dict: `ls` decodes this for thousands of names)
    fps: set[str] = set()
    for field, value in h.items():
        kind = field[:2]
        if kind == "w:":
            fp, _, seen = value.partition(":")
            if now_ms - _int_or(seen, 0) <= ROLLOUT_LIVE_MS:
                workers[fp] = workers.get(fp, 0) + 1
                fps.add(fp)
        elif kind in ("c:", "d:"):
            fps.add(field[2:])
    forced = str(in_force)
    if in_force:
        fps.add(forced)
    configs = []
    for fp in fps:
        config_wire = h.get(f"c:{fp}") or (wire if fp == forced else "")
        version = _config_version(config_wire) if config_wire else None
        configs.append({"fingerprint": fp, "wire": config_wire or None, "version": version,
                        "deployed_at_ms": _int_or(h.get(f"d:{fp}", "0"), 0) or None,
                        "workers": workers.get(fp, 0), "in_force": fp == forced})
    configs.sort(key=lambda c: (not c["in_force"], -(c["deployed_at_ms"] or 0)))
    if not in_force:
        return configs, None
    why, since = h.get("f:why"), h.get("f:at", "0")
    if why is None and f"d:{forced}" in h:  # the first config stored writes no `f:` field
        why, since = "first config", h[f"d:{forced}"]
    return configs, {"fingerprint": str(in_force), "since_ms": _int_or(since, 0) or None,
                     "why": why or None, "actor": h.get("f:actor") or None}


@functools.lru_cache(maxsize=256)
def _config_version(wire: str) -> int | None:
    """A wire string's `config_version` (None: not a config); a fleet has few wires."""
    try:
        return BreakerConfig.from_wire(wire).config_version
    except ValueError:
        return None


def decode_quorum(breaker: Mapping[str, Any], marks: Mapping[Any, Any],
                  now_ms: int) -> dict[str, Any] | None:
    """The quorum trip's progress (config `min_failing_workers` > 1, else None): the
    workers whose failures count (their last one within the quorum window: the marks
    hash ``<state key>:fw``) and whether a fleet-wide trip waits for more of them."""
    config = breaker["config"]
    needed = int(config.get("min_failing_workers") or 1)
    if needed <= 1:
        return None
    window_ms = round(float(config.get("quorum_window_s") or 60.0) * 1000)
    failing = sorted(text(worker) for worker, at in marks.items()
                     if now_ms - _int_or(text(at), 0) <= window_ms)
    pending = breaker["state"] in (State.CLOSED.value, State.METRICS_ONLY.value) and 0 < len(
        failing) < needed
    return {"min_failing_workers": needed, "failing_workers": len(failing),
            "workers": failing, "pending": pending,
            "text": (f"quorum pending: {len(failing)} of {needed} workers failing"
                     if pending else None)}


#: The state an override ends in (lua/lib/breaker_transitions.lua, event override_ended):
#: FORCED_OPEN goes on as an OPEN whose wait is over, the others resume CLOSED.
AFTER_OVERRIDE = {State.FORCED_OPEN: State.HALF_OPEN, State.DISABLED: State.CLOSED,
                  State.METRICS_ONLY: State.CLOSED, State.CLOSED: State.CLOSED}


def _after_override(state: State, n: Mapping[str, int],
                    now_ms: int) -> tuple[State, dict[str, int], int | None]:
    """(state, counters, end) as the next call will record them when an override's end
    has passed: the state it ends in, since its end (a HALF_OPEN's `since` becomes the
    time of that call); a new state's window and probes empty, as the script's
    transition leaves them. `end` is None while none has passed."""
    ended = n["ov_until"]
    if not ended or now_ms < ended or state not in AFTER_OVERRIDE:
        return state, dict(n), None
    after = AFTER_OVERRIDE[state]
    out = dict(n, ov_until=0)
    if after is not state:
        out.update(since=ended, gen=n["gen"] + 1, open_until=0, hp_issued=0, hp_done=0,
                   hp_fail=0, hp_slow=0)
        if after is State.CLOSED:
            out.update(calls=0, failures=0, slow=0, total_ms=0, head=0, wsec=0)
    return after, out, ended


def _breaker_view(name: str, state: State, n: Mapping[str, int], wire: str,
                  meta: Mapping[str, str], now_ms: int,
                  probe_deadlines: Sequence[int]) -> dict[str, Any]:
    """The breaker dict of docs/CLI_JSON.md from decoded counters (either schema)."""
    state, n, ended = _after_override(state, n, now_ms)
    if ended is not None:
        probe_deadlines = ()
    try:
        config, minimum = _config(BreakerConfig().to_wire() if wire == UNSET_CONFIG else wire)
    except SchemaError as exc:
        raise SchemaError(f"breaker {name!r}: {exc}") from None
    config = dict(config)
    config["unset"] = wire == UNSET_CONFIG  # shown with defaults until a worker stores its own
    calls, failures, slow = n["calls"], n["failures"], n["slow"]
    if (config["sliding_window_type"] == WindowType.TIME_BASED.value and n["wsec"]
            and now_ms // 1000 - n["wsec"] >= config["sliding_window_size"]):
        calls = failures = slow = 0  # every bucket is stale; the next call clears them
    if state is State.HALF_OPEN or (state is State.OPEN and n["hp_done"] > 0):
        # an OPEN a half-open verdict made shows the probes' figures (as the script does)
        minimum = config["permitted_calls_in_half_open"]
        shown = (n["hp_done"], n["hp_fail"], n["hp_slow"])
    else:
        shown = (calls, failures, slow)
    return {
        "name": name,
        "state": state.value,
        "since_ms": n["since"],
        "in_state_s": max(0, now_ms - n["since"]) / 1000,
        "retry_in_s": _retry_in(state, n, config, now_ms, probe_deadlines),
        "open_until_ms": n["open_until"] or None,
        "override_until_ms": n["ov_until"] or None,
        "override_left_s": max(0, n["ov_until"] - now_ms) / 1000 if n["ov_until"] else None,
        "override_ended_ms": ended,
        "calls": shown[0],
        "failures": shown[1],
        "slow": shown[2],
        "failure_rate": rate(shown[1], shown[0], minimum),
        "slow_rate": rate(shown[2], shown[0], minimum),
        "window": {"calls": calls, "failures": failures, "slow": slow,
                   "total_ms": n["total_ms"], "head": n["head"]},
        "half_open": {"issued": n["hp_issued"], "done": n["hp_done"],
                      "failed": n["hp_fail"], "slow": n["hp_slow"]},
        "rejected": n["rejected"],
        # recorded since the keys were created, fleet-wide (v2; None from v1 keys)
        "calls_total": n.get("calls_total"),
        "failures_total": n.get("failures_total"),
        "slow_total": n.get("slow_total"),
        "generation": n["gen"],
        # why the breaker is in its state, and who put it there ('' for the breaker
        # itself): a hard stop names the HTTP status and the breaker's key here
        "reason": "override ended" if ended is not None else meta.get("reason"),
        "actor": "" if ended is not None else meta.get("actor"),
        "config": config,
        "config_drift": _drift(meta),
    }


def _drift(h: Mapping[str, str]) -> dict[str, Any] | None:
    """The newest config a worker used that differs from the stored one, if any."""
    wire = h.get("drift_cfg") or ""
    if not wire:
        return None
    try:
        config = dict(_config(wire)[0])
    except (SchemaError, ValueError):
        config = {"wire": wire}
    return {"config": config, "seen_at_ms": _int_or(h.get("drift_at") or "0", 0) or None}


def _retry_in(state: State, n: Mapping[str, int], config: Mapping[str, Any], now_ms: int,
              deadlines: Sequence[int]) -> float | None:
    """Seconds until a call may be tried; None while an operator holds it FORCED_OPEN
    without an end."""
    if state is State.FORCED_OPEN:
        return max(0, n["ov_until"] - now_ms) / 1000 if n["ov_until"] else None
    if state is State.OPEN:
        return max(0, n["open_until"] - now_ms) / 1000
    if state is State.HALF_OPEN and n["hp_issued"] >= config["permitted_calls_in_half_open"]:
        live = [d for d in deadlines if d > now_ms]
        return (min(live) - now_ms) / 1000 if live else 0.0
    return 0.0


def decode_window(config: Mapping[str, Any], raw: Mapping[Any, Any], head: int,
                  now_ms: int) -> list[dict[str, Any]]:
    """A v1 window hash as buckets: time windows per live second, count windows per slot.

    Count-window slots are listed oldest first (the ring starts at `head`).
    """
    fields = {text(k): text(v).split(",") for k, v in raw.items()}
    try:
        if config["sliding_window_type"] == WindowType.TIME_BASED.value:
            seconds = [tuple(int(p) for p in parts[:5]) for parts in fields.values()]
            return _time_buckets(seconds, config["sliding_window_size"], now_ms)
        size = config["sliding_window_size"]
        slots: list[tuple[bool, bool, int] | None] = []
        for slot in range(size):
            parts = fields.get(str(slot))
            if parts is None:
                slots.append(None)
            else:
                fails, slow, ms = (int(p) for p in parts[:3])
                slots.append((bool(fails), bool(slow), ms))
        return _count_buckets(slots, head)
    except ValueError:
        raise SchemaError("a window bucket is not a list of integers") from None


def decode_record_window(data: bytes, head: int, now_ms: int) -> list[dict[str, Any]]:
    """A v2 state record's window slots as the buckets `decode_window` lists (the
    record's own window type and size say how its bytes are laid out)."""
    fields = state_record.decode_record(data)
    size, kind = fields["window_size"], fields["window_type"]
    top = {0: MAX_COUNT_WINDOW, 1: MAX_TIME_WINDOW, 2: MAX_TIME_WINDOW}.get(kind)
    if top is None or not 1 <= size <= top:
        raise SchemaError(f"the state record has window type {kind} and size {size}, "
                          "which no config allows")
    if kind:
        return _time_buckets(state_record.time_seconds(data, size), size, now_ms)
    return _count_buckets(state_record.count_slots(data, size), head)


def _time_buckets(seconds: Iterable[tuple[int, ...]], size: int,
                  now_ms: int) -> list[dict[str, Any]]:
    """Time-window buckets of the live seconds (second, calls, failures, slow, ms),
    oldest first."""
    now_sec = now_ms // 1000
    buckets = [{"second": sec, "age_s": now_sec - sec, "calls": calls, "failures": fails,
                "slow": slow, "total_ms": ms}
               for sec, calls, fails, slow, ms in (s[:5] for s in seconds)
               if now_sec - sec < size]
    return sorted(buckets, key=lambda b: b["second"])


def _count_buckets(slots: Sequence[tuple[bool, bool, int] | None],
                   head: int) -> list[dict[str, Any]]:
    """Count-window buckets in ring order from `head` (oldest first), empty slots left out."""
    size = len(slots)
    buckets = []
    for i in range(size):
        slot = (head + i) % size
        outcome = slots[slot]
        if outcome is not None:
            failed, slow, ms = outcome
            buckets.append({"slot": slot, "failed": failed, "slow": slow, "duration_ms": ms})
    return buckets


def decode_history(entry_id: Any, fields: Mapping[Any, Any], name: str) -> dict[str, Any]:
    """One history stream entry as an event dict (same layout as a live event)."""
    f = {text(k): text(v) for k, v in fields.items()}
    return _event(name, text(entry_id), f)


def decode_event_message(payload: Any) -> dict[str, Any] | None:
    """A pub/sub transition payload as an event dict; None if it is not one of ours."""
    try:
        data = json.loads(text(payload))
    except ValueError:
        return None
    if not isinstance(data, dict) or "name" not in data or "to" not in data:
        return None
    return _event(str(data["name"]), None, data)


def _event(name: str, entry_id: str | None, f: Mapping[str, Any]) -> dict[str, Any]:
    def num(key: str) -> float | None:
        try:
            return float(f[key])
        except (KeyError, TypeError, ValueError):
            return None

    at = num("at_ms")
    gen = num("gen")
    return {"name": name, "id": entry_id, "at_ms": int(at) if at is not None else None,
            "from": str(f.get("from", "")), "to": str(f.get("to", "")),
            "reason": str(f.get("reason", "")), "actor": str(f.get("actor", "")),
            "failure_rate": num("failure_rate"), "slow_rate": num("slow_rate"),
            "generation": int(gen) if gen is not None else None,
            # '' for a transition; restart / override / override_end: history only
            "kind": str(f.get("kind", "")),
            "until_ms": int(num("until_ms") or 0) or None,
            # set when the entry was written after at_ms (an override's end, recorded by
            # the first call after it)
            "recorded_ms": int(num("recorded_ms") or 0) or None, "error": None}


def error_event(name: str, error: str) -> dict[str, Any]:
    """An events line for a name whose keys could not be read: only `error` says why."""
    return {"name": name, "id": None, "at_ms": None, "from": "", "to": "", "reason": "",
            "actor": "", "failure_rate": None, "slow_rate": None, "generation": None,
            "kind": "", "until_ms": None, "recorded_ms": None, "error": error}


def decode_bulkhead(leases: Sequence[tuple[Any, Any]], meta: Mapping[Any, Any],
                    now_ms: int, leases_key: str = "") -> dict[str, Any]:
    """Bulkhead leases (holder, deadline) and meta hash; expired leases are not in use."""
    m = {text(k): text(v) for k, v in meta.items()}
    holders = [{"token": text(tok), "deadline_ms": deadline,
                "expires_in_s": (deadline - now_ms) / 1000, "expired": deadline <= now_ms}
               for (tok, _), deadline in zip(leases, deadlines_of(leases_key, leases),
                                             strict=True)
               if deadline > 0]  # not the keep-alive member `~` (score 0, KEY_SCHEMA)

    def counter(field: str) -> int | None:
        try:
            return int(m[field])
        except (KeyError, ValueError):
            return None

    waiting = sum(1 for k, v in m.items() if k.startswith("w:") and _int_or(v, 0) > now_ms)
    return {"in_use": sum(1 for h in holders if not h["expired"]), "limit": counter("limit"),
            "waiting": waiting, "rejected": counter("rejected"),
            "acquired": counter("acquired"), "lost": counter("lost"),
            "adaptive": decode_adaptive(m, now_ms), "holders": holders}


#: The meta hash fields of an adaptive bulkhead limit (lua/bulkhead.lua, docs/ADAPTIVE.md).
ADAPTIVE_FIELDS = ("a_limit", "a_why", "a_moved", "a_pause", "a_rtt_s", "a_rtt_l")


def decode_adaptive(meta: Mapping[str, str], now_ms: int) -> dict[str, Any] | None:
    """An adaptive bulkhead's limit and why it last moved, from its meta hash fields
    (None: the hash has no adaptive limit, i.e. no worker ran it with `adaptive=`).

    `limit` is the unrounded limit (the bulkhead's `limit` is its integer part);
    `moved_at_ms` the server time its integer part last changed (None: never since it
    started); `paused_until_ms` the end of a 429's pause of increases (None: none)."""
    raw = meta.get("a_limit")
    if raw is None:
        return None
    limit = float(raw)  # a ValueError is foreign content, reported by the caller
    if not 0 < limit < float("inf"):
        raise ValueError(f"bulkhead field a_limit is not a limit: {raw!r}")

    def ms(field: str) -> int | None:
        value = _int_or(meta.get(field) or "0", 0)
        return value if value > 0 else None

    def rtt(field: str) -> float | None:
        try:
            value = float(meta.get(field) or "")
        except ValueError:
            return None
        return value if value > 0 else None

    moved, paused = ms("a_moved"), ms("a_pause")
    return {"limit": limit, "why": meta.get("a_why") or "", "moved_at_ms": moved,
            "moved_ago_s": None if moved is None else max(0, now_ms - moved) / 1000,
            "paused_until_ms": paused if paused is not None and paused > now_ms else None,
            "paused_for_s": max(0, (paused or 0) - now_ms) / 1000,
            "rtt_short_ms": rtt("a_rtt_s"), "rtt_long_ms": rtt("a_rtt_l")}


def _budget_int(value: str) -> bool:
    """An integer within the range the scripts keep exact (|x| < 2**53)."""
    try:
        return abs(int(value)) < MAX_MS
    except ValueError:
        return False


def _int_or(value: str, default: int) -> int:
    try:
        return int(value)
    except ValueError:
        return default


def budget_fields(raw: bytes) -> dict[str, str]:
    """A budget window of layout 2 (the string lua/budget.lua writes: big-endian 8-byte
    integers, a header of 10, then id, deposits, withdrawals per older slice) as the
    fields of layout 1's hash, so one decoding serves both (and `fields` reads the same)."""
    if len(raw) < BUDGET_HEADER or (len(raw) - BUDGET_HEADER) % 24:
        raise SchemaError(f"budget window of {len(raw)} bytes is not a layout-2 window")
    values = struct.unpack(f">{len(raw) // 8}q", raw)
    v, n, slice_ms, head, d_total, w_total, d, w, ppm, reserve = values[:10]
    fields = {"v": v, "n": n, "slice_ms": slice_ms, "head": head, "D": d_total,
              "W": w_total, "ppm": ppm, "reserve": reserve}
    for sid, deposits, withdrawals in [*zip(values[10::3], values[11::3], values[12::3],
                                            strict=True),
                                       (head, d, w)]:
        if deposits:
            fields[f"d:{sid}"] = deposits
        if withdrawals:
            fields[f"w:{sid}"] = withdrawals
    return {k: str(v) for k, v in fields.items()}


#: Bytes of a layout-2 budget window's header (lua/budget.lua).
BUDGET_HEADER = 80


def decode_budget(raw: Mapping[Any, Any] | bytes, now_ms: int) -> dict[str, Any]:
    """The retry budget window: deposits, withdrawals and balance over the live window.

    `raw` is a layout-2 window (bytes) or the hash of layout 1 (workers of earlier
    versions). The balance uses the last writer's percent_can_retry and reserve
    (fields `ppm`, `reserve`); it is None for a hash written before they were stored.
    The raw fields are included as they are (a layout-2 window's as layout 1 names them).
    """
    if isinstance(raw, bytes):
        raw = budget_fields(raw)
    f = {text(k): text(v) for k, v in raw.items()}
    out: dict[str, Any] = {"deposits": None, "withdrawals": None, "balance": None,
                           "slice_ms": None, "slices": None,
                           "fields": dict(sorted(f.items()))}
    counts = {k: v for k, v in f.items() if k in ("v", "slice_ms", "n", "head", "D", "W")
              or k.partition(":")[0] in ("d", "w")}
    for field, value in counts.items():  # what lua/budget.lua refuses too
        if not _budget_int(value):
            raise SchemaError(f"budget field {field} is not an integer count: {value!r:.40}")
    if "slice_ms" not in f or "n" not in f or int(f["slice_ms"]) < 1:
        return out
    slice_ms, n = int(f["slice_ms"]), int(f["n"])
    oldest = now_ms // slice_ms - n + 1
    live = {"d": 0, "w": 0}
    for key, value in f.items():
        kind, _, sid = key.partition(":")
        if kind in live and sid.lstrip("-").isdigit() and int(sid) >= oldest:
            live[kind] += int(value)
    out.update(deposits=live["d"], withdrawals=live["w"], slice_ms=slice_ms, slices=n)
    ppm, reserve = _int_or(f.get("ppm", ""), -1), _int_or(f.get("reserve", ""), -1)
    if ppm >= 0 and reserve >= 0:
        out["balance"] = (reserve + ppm * live["d"]) // 1_000_000 - live["w"]
    return out


def decode_rate_limiter(raw: Mapping[Any, Any], now_ms: int) -> dict[str, Any]:
    """The rate limiter hash (lua/ratelimiter.lua): its limit (an operator's, else the one
    the last TTL-setting worker sent), permits available now (negative: reserved by
    waiting calls), how far ahead reservations reach, and the fleet-wide counters."""
    f = {text(k): text(v) for k, v in raw.items()}

    def num(field: str) -> int | None:
        return _int_or(f[field], -1) if field in f else None

    overridden = "lim" in f
    limit, period, burst = (num(k) for k in (("lim", "per", "bur") if overridden
                                             else ("cl", "cp", "cb")))
    out: dict[str, Any] = {
        "limit_for_period": limit, "limit_refresh_period_ms": period, "burst": burst,
        "overridden": overridden, "available": None, "reserved_ahead_ms": None,
        "calls": num("calls") or 0, "permits": num("permits") or 0,
        "waited": num("waited") or 0, "rejected": num("rejected") or 0,
        # the last operator change of the limit (`distbreaker limit`), if one was recorded
        "changed_reason": f.get("why"), "changed_by": f.get("by"),
        "changed_at_ms": num("at") if "at" in f else None}
    tat = num("tat")
    if limit and period and burst and limit > 0 and period > 0 and tat is not None:
        backlog = max(0, tat - now_ms * 1000)
        cap = burst * period * 1000 // limit
        out["available"] = (cap - backlog) // max(1, -(-period * 1000 // limit))
        out["reserved_ahead_ms"] = max(0, backlog - cap) // 1000
    return out


# -- reading ------------------------------------------------------------------------

def _check_type(client: Any, key: str, expected: str) -> None:
    found = text(client.type(key))
    if found not in ("none", expected):
        raise SchemaError(f"key {key} holds a {found}, expected a {expected}", key=key)


def queue_raw(pipe: Any, key: str, end: int | None = None) -> Any:
    """Queue a read of a binary string (a v2 state record: all of it, or its bytes up to
    `end`) on a pipeline or client, as bytes even on a client that decodes responses."""
    args: tuple[Any, ...] = ("GET", key) if end is None else ("GETRANGE", key, 0, end)
    return pipe.execute_command(*args, **{NEVER_DECODE: []})


def read_record(client: Any, key: str, end: int | None = None) -> bytes | None:
    """A v2 state record's bytes (None: no key, or an empty string read by GETRANGE)."""
    data = queue_raw(client, key, end)
    return bytes(data) if data else None


def read_summaries(client: Any, prefix: str,
                   names: Mapping[str, Iterable[str]] | Iterable[str],
                   batch: int = 500, schema: str = V2) -> Iterator[dict[str, Any]]:
    """One summary row per name (breaker state, bulkhead usage, budget) in key schema
    `schema`, read in pipelined batches so thousands of names cost a few bounded round
    trips.

    `names` may map each name to its components (as `scan_names` returns), so
    only the keys that exist are read. A name whose keys hold foreign data
    gets an ``error`` entry instead of failing the whole listing.
    """
    if isinstance(names, Mapping):
        items = [(n, frozenset(c)) for n, c in names.items()]
    else:
        items = [(n, _ALL) for n in names]
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        rows = {n: {**invalid_row(n, []), "schema": schema}
                for n, _ in chunk if _invalid_name(n) is not None}
        rows.update((r["name"], r) for r in _summaries(
            client, prefix, [item for item in chunk if item[0] not in rows], schema))
        yield from (rows[n] for n, _ in chunk)


_ALL = frozenset({"breaker", "bulkhead", "budget", "rate_limiter"})


def _summaries(client: Any, prefix: str, items: Sequence[tuple[str, frozenset[str]]],
               schema: str = V2) -> list[dict[str, Any]]:
    now_ms = server_now_ms(client)
    pipe = client.pipeline(transaction=False)
    plan: list[tuple[NameKeys, list[str]]] = []
    for name, parts in items:
        keys = NameKeys.build(name, prefix, schema)
        steps = []
        if "breaker" in parts:
            if schema == V2:
                queue_raw(pipe, keys.state, state_record.WINDOW_OFFSET - 1)
                pipe.hgetall(keys.meta)  # (its fields and the config rollout's)
                pipe.hgetall(keys.state + QUORUM_SUFFIX)
                pipe.hgetall(keys.state + LEGACY_ROLLOUT_SUFFIX)
                steps += ["record", "meta", "quorum", "rollout"]
            else:
                pipe.hgetall(keys.state)
                steps.append("state")
            pipe.zrangebyscore(keys.probes, f"({now_ms}", "+inf", start=0, num=1,
                               withscores=True)
            steps.append("probe")
        if "bulkhead" in parts:
            pipe.zcount(keys.bh_leases, f"({now_ms}", "+inf")
            pipe.hmget(keys.bh_meta, ["limit", *ADAPTIVE_FIELDS])
            pipe.zrangebyscore(keys.bh_leases, f"({MAX_MS}", "+inf", start=0, num=1,
                               withscores=True)  # a lease no worker wrote (e.g. inf)
            steps += ["in_use", "limit", "far"]
        if "budget" in parts:
            if schema == V2:
                queue_raw(pipe, keys.rb)
                steps.append("budget2")
            pipe.hgetall(keys.rb1)
            steps.append("budget")
        if "rate_limiter" in parts and schema == V2:
            pipe.hgetall(keys.rl)
            steps.append("rate_limiter")
        for key in keys.unread(parts):
            pipe.type(key)
            steps.append(f"type {key}")
        plan.append((keys, steps))
    replies = iter(pipe.execute(raise_on_error=False))
    rows = []
    for (name, _), (keys, steps) in zip(items, plan, strict=True):
        got = {step: next(replies) for step in steps}
        rows.append(_summary(client, prefix, name, got, now_ms, schema, keys))
    return rows


def _summary(client: Any, prefix: str, name: str, got: dict[str, Any],
             now_ms: int, schema: str = V2, keys: NameKeys | None = None) -> dict[str, Any]:
    row = _empty_row(name, schema)
    if any(isinstance(v, Exception) for v in got.values()):
        row["error"] = _explain_types(client, prefix, name, schema) or next(
            str(v) for v in got.values() if isinstance(v, Exception))
        return row
    keys = keys or NameKeys.build(name, prefix, schema)
    expected = keys.expected_types()
    errors = [f"key {step[5:]} holds a {text(found)}, expected a {expected[step[5:]]}"
              for step, found in got.items() if step.startswith("type ")
              and text(found) not in ("none", expected[step[5:]])]

    def breaker() -> None:
        deadlines = deadlines_of(keys.probes, got.get("probe") or ())
        if got.get("record"):
            meta = {text(k): v for k, v in (got["meta"] or {}).items()}
            row["breaker"] = decode_state_record(
                name, got["record"], {k: meta[k] for k in _META_FIELDS if k in meta},
                now_ms, deadlines, got.get("quorum") or {},
                merge_rollout(meta, got.get("rollout")))
            row["state"] = row["breaker"]["state"]
        elif got.get("state"):
            row["breaker"] = decode_state_hash(name, got["state"], now_ms, deadlines)
            row["state"] = row["breaker"]["state"]

    def bulkhead() -> None:
        deadlines_of(keys.bh_leases, got.get("far") or ())
        if "in_use" in got:
            limit, *adaptive = got["limit"]
            fields = {f: text(v) for f, v in zip(ADAPTIVE_FIELDS, adaptive, strict=True)
                      if v is not None}
            row["bulkhead"] = {"in_use": int(got["in_use"]),
                               "limit": _int_or(text(limit), 0) or None if limit else None,
                               "adaptive": decode_adaptive(fields, now_ms)}

    def budget() -> None:
        window = got.get("budget2") or got.get("budget")
        if window:
            row["budget"] = decode_budget(window, now_ms)

    def rate_limiter() -> None:
        if got.get("rate_limiter"):
            row["rate_limiter"] = decode_rate_limiter(got["rate_limiter"], now_ms)

    for part, read, key in (("breaker", breaker, keys.state),
                            ("bulkhead", bulkhead, keys.bh_meta), ("budget", budget, keys.rb),
                            ("rate_limiter", rate_limiter, keys.rl)):
        try:
            read()
        except _FOREIGN_CONTENT as exc:
            row[part] = None
            if part == "breaker":
                row["state"] = None
            errors.append(_content_error(name, exc, key))
    row["error"] = "; ".join(errors) or None
    return row


# -- many names: selectors, a brief read to filter and rank, then full rows ----------
GLOB_CHARS = "*?["


def is_selector(text: str) -> bool:
    """Whether an operator's NAME is a glob over names (``llm:*``, ``tenant:?``)."""
    return any(c in text for c in GLOB_CHARS)


def matching(names: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """The names any of the glob `patterns` matches (fnmatch, case-sensitive: ``*``, ``?``,
    ``[abc]``; ``[*]`` for a literal ``*``), sorted."""
    import fnmatch
    import re

    if not patterns:
        return sorted(names)
    match = re.compile("|".join(fnmatch.translate(p) for p in patterns)).match
    return sorted(n for n in names if match(n))


#: The breaker field `ls --top N --by ...` ranks by, highest first.
RANK_FIELDS = {"failure-rate": "failure_rate", "slow-rate": "slow_rate",
               "rejections": "rejected", "calls": "calls"}


def read_brief(client: Any, prefix: str, names: Iterable[str],
               batch: int = 1000) -> dict[str, dict[str, Any] | None]:
    """Per name (key schema v2), its breaker dict as `ls` shows it, without the parts a
    summary adds from other keys (probe leases, quorum marks, rollout): two commands per
    name (GETRANGE of the state record's header, HGETALL of its meta hash), so thousands
    of names can be filtered by state or ranked before the few shown are read in full.
    None: no state record, or foreign data (the full read names it)."""
    names = list(names)
    now_ms = server_now_ms(client)
    out: dict[str, dict[str, Any] | None] = {}
    for i in range(0, len(names), batch):
        chunk = names[i:i + batch]
        pipe = client.pipeline(transaction=False)
        for name in chunk:
            keys = BreakerKeys.build(name, prefix)
            queue_raw(pipe, keys.state, state_record.WINDOW_OFFSET - 1)
            pipe.hmget(keys.meta, list(_META_FIELDS))
        replies = pipe.execute(raise_on_error=False)
        for j, name in enumerate(chunk):
            record, meta = replies[2 * j], replies[2 * j + 1]
            out[name] = None
            if not record or isinstance(record, Exception) or isinstance(meta, Exception):
                continue
            fields = {k: v for k, v in zip(_META_FIELDS, meta, strict=True) if v is not None}
            try:
                out[name] = decode_state_record(name, record, fields, now_ms)
            except _FOREIGN_CONTENT:
                pass
    return out


def rank(briefs: Mapping[str, dict[str, Any] | None], by: str, top: int) -> list[str]:
    """The `top` names with the highest `by` (a `RANK_FIELDS` key), ties by name; names
    without a breaker are not ranked."""
    field = RANK_FIELDS[by]
    ranked = sorted((n for n, b in briefs.items() if b is not None),
                    key=lambda n: (-(briefs[n][field] or 0), n))  # type: ignore[index]
    return ranked[:top]


def rank_key(row: Mapping[str, Any], by: str) -> tuple[float, str]:
    """Sort key of a full row for `by`, as `rank` orders names (highest first)."""
    breaker = row.get("breaker") or {}
    return -(breaker.get(RANK_FIELDS[by]) or 0), row["name"]


def rank_rows(client: Any, prefix: str, names: Mapping[str, Iterable[str]] | Iterable[str],
              by: str, top: int) -> list[dict[str, Any]]:
    """The full summary rows of the `top` names with the highest `by`: a brief read of
    every name ranks them, then only those are read in full (and ordered by what that
    read found)."""
    parts = ({n: frozenset(p) for n, p in names.items()} if isinstance(names, Mapping)
             else dict.fromkeys(names, _ALL))
    briefs = read_brief(client, prefix, [n for n, p in parts.items() if "breaker" in p])
    chosen = rank(briefs, by, top)
    return sorted(read_summaries(client, prefix, {n: parts[n] for n in chosen}),
                  key=lambda r: rank_key(r, by))


#: Scores and counters above this are no server time nor count distbreaker writes.
MAX_MS = 2 ** 53


def deadlines_of(key: str, members: Iterable[tuple[Any, Any]]) -> list[int]:
    """The scores of a zset of deadlines (server ms), or a SchemaError naming the key."""
    deadlines = []
    for member, score in members:
        if not (isinstance(score, int | float) and math.isfinite(score)
                and abs(score) < MAX_MS):
            raise SchemaError(f"key {key} holds member {text(member)!r} with score "
                              f"{score!r}, expected a deadline in server ms", key=key)
        deadlines.append(int(score))
    return deadlines


#: What decoding foreign content can raise (a SchemaError, or a value of the wrong shape or
#: out of range: an infinite score is an OverflowError).
_FOREIGN_CONTENT = (SchemaError, ValueError, TypeError, KeyError, IndexError, OverflowError)


def _content_error(name: str, exc: Exception, key: str) -> str:
    """The error row's text: it always names a key (the one read, unless the error
    names its own)."""
    if isinstance(exc, SchemaError):
        named = exc.key or key
        return str(exc) if named in str(exc) else f"key {named}: {exc}"
    return f"key {key} of {name!r} holds foreign content ({type(exc).__name__}: {exc})"


def _explain_types(client: Any, prefix: str, name: str, schema: str = V2) -> str | None:
    """Which of a name's keys holds a foreign type (only asked after a WRONGTYPE)."""
    for key, kind in _expected_types(name, prefix, schema).items():
        found = text(client.type(key))
        if found not in ("none", kind):
            return f"key {key} holds a {found}, expected a {kind}"
    return None


def _expected_types(name: str, prefix: str, schema: str = V2) -> dict[str, str]:
    return NameKeys.build(name, prefix, schema).expected_types()


def read_detail(client: Any, prefix: str, name: str, schema: str = V2) -> dict[str, Any]:
    """Everything stored about one name in key schema `schema` (the `show` view). A key
    of a foreign type is left unread and named in ``error``, as is foreign content (the
    component whose keys hold it is then None); the rest is read as usual."""
    keys = NameKeys.build(name, prefix, schema)
    expected = keys.expected_types()
    pipe = client.pipeline(transaction=False)
    for key in expected:
        pipe.type(key)
    found = dict(zip(expected, (text(t) for t in pipe.execute()), strict=True))
    errors = [f"key {key} holds a {found[key]}, expected a {kind}"
              for key, kind in expected.items() if found[key] not in ("none", kind)]
    usable = {key for key, kind in expected.items() if found[key] == kind}
    now_ms = server_now_ms(client)
    pipe = client.pipeline(transaction=False)
    reads = {keys.state: (lambda k: queue_raw(pipe, k)) if schema == V2 else pipe.hgetall,
             keys.meta: pipe.hgetall, keys.bh_meta: pipe.hgetall, keys.rb1: pipe.hgetall,
             keys.rb: (lambda k: queue_raw(pipe, k)) if schema == V2 else pipe.hgetall,
             keys.rl: pipe.hgetall,
             keys.probes: lambda k: pipe.zrange(k, 0, -1, withscores=True),
             keys.bh_leases: lambda k: pipe.zrange(k, 0, -1, withscores=True),
             keys.history: pipe.xlen}
    order = [key for key in reads if key in usable]
    for key in order:
        reads[key](key)
    for key in expected:
        pipe.pttl(key)
    extras = 0
    if schema == V2 and keys.state in usable:
        pipe.hgetall(keys.state + QUORUM_SUFFIX)
        pipe.hgetall(keys.state + LEGACY_ROLLOUT_SUFFIX)
        extras = 2
    replies = pipe.execute(raise_on_error=False)
    got: dict[str, Any] = dict(zip(order, replies, strict=False))
    ttls = replies[len(order):len(replies) - extras]
    marks, rollout = ({} if isinstance(r, Exception) else r
                      for r in (replies[-2:] if extras else ({}, {})))
    state, meta = got.get(keys.state) or {}, got.get(keys.meta, {})
    if schema == V2:
        rollout = merge_rollout(meta, rollout)
    probes, history_len = got.get(keys.probes, []), got.get(keys.history, 0)
    leases, bh_meta = got.get(keys.bh_leases, []), got.get(keys.bh_meta, {})
    budget, limiter = got.get(keys.rb) or got.get(keys.rb1, {}), got.get(keys.rl, {})
    detail: dict[str, Any] = {"name": name, "prefix": prefix, "schema": schema,
                              "server_time_ms": now_ms,
                              "exists": bool(state or leases or bh_meta or budget or limiter
                                             or history_len or errors),
                              "breaker": None, "bulkhead": None, "budget": None,
                              "rate_limiter": None}
    parts = {"breaker": (lambda: _breaker_detail(name, state, meta, probes, history_len,
                                                 now_ms, keys.probes, marks, rollout)
                         if state else None, keys.state),
             "bulkhead": (lambda: decode_bulkhead(leases, bh_meta, now_ms, keys.bh_leases)
                          if leases or bh_meta else None, keys.bh_meta),
             "budget": (lambda: decode_budget(budget, now_ms) if budget else None, keys.rb),
             "rate_limiter": (lambda: decode_rate_limiter(limiter, now_ms) if limiter else None,
                              keys.rl)}
    for part, (read, key) in parts.items():
        try:
            detail[part] = read()
        except _FOREIGN_CONTENT as exc:
            errors.append(_content_error(name, exc, key))
    detail["ttls"] = {key: (int(ttl) / 1000 if int(ttl) >= 0 else None)
                      for key, ttl in zip(expected, ttls, strict=True) if int(ttl) != -2}
    detail["error"] = "; ".join(errors) or None
    return detail


def _breaker_detail(name: str, state: bytes | Mapping[Any, Any], meta: Mapping[Any, Any],
                    probes: Sequence[tuple[Any, Any]], history_len: int,
                    now_ms: int, probes_key: str = "",
                    quorum_marks: Mapping[Any, Any] | None = None,
                    rollout: Mapping[Any, Any] | None = None) -> dict[str, Any]:
    """`state` is a v2 record (bytes, `meta` its meta hash) or a v1 state hash (`meta`
    its window hash)."""
    deadlines = deadlines_of(probes_key, probes)
    if isinstance(state, (bytes, bytearray)):
        breaker = decode_state_record(name, state, meta, now_ms, deadlines, quorum_marks,
                                      rollout)
        try:
            buckets = decode_record_window(state, breaker["window"]["head"], now_ms)
        except SchemaError as exc:
            raise SchemaError(f"breaker {name!r}: {exc}") from None
        if breaker["override_ended_ms"] and breaker["state"] == State.CLOSED.value \
                and not breaker["window"]["calls"]:
            buckets = []  # the override ended into a new CLOSED: an empty window
    else:
        breaker = decode_state_hash(name, state, now_ms, deadlines)
        buckets = decode_window(breaker["config"], meta, breaker["window"]["head"], now_ms)
    breaker["window"]["buckets"] = buckets
    breaker["probes"] = [{"token": text(tok), "deadline_ms": int(score),
                          "expires_in_s": (int(score) - now_ms) / 1000}
                         for tok, score in probes]
    breaker["history_length"] = int(history_len)
    return breaker


#: Entries one XRANGE reads: more than a stream trimmed with `MAXLEN ~ 1000` holds.
HISTORY_READ = 2000


def read_history_after(client: Any, prefix: str, after: Mapping[str, str],
                       batch: int = 500, schema: str = V2) -> dict[str, list[dict[str, Any]]]:
    """For each name, its history entries after stream id ``after[name]`` (``"0"``: all),
    oldest first, read in pipelined batches. A stream holds about 1000 entries (trimmed
    with `MAXLEN ~ 1000`: whole nodes of up to 100 entries go, so up to ~1100 stay), so
    one XRANGE per name of up to HISTORY_READ entries reads all that is new. A name whose
    history key holds another type is left out (its row in `read_summaries` carries the error)."""
    names = list(after)
    found: dict[str, list[dict[str, Any]]] = {}
    for i in range(0, len(names), batch):
        chunk = names[i:i + batch]
        pipe = client.pipeline(transaction=False)
        for name in chunk:
            last = after[name]
            pipe.xrange(NameKeys.build(name, prefix, schema).history,
                        min="-" if last in ("", "0", "0-0") else f"({last}", max="+",
                        count=HISTORY_READ)
        for name, reply in zip(chunk, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, Exception):
                if not str(reply).startswith("WRONGTYPE"):
                    raise reply
                continue
            found[name] = [decode_history(entry_id, fields, name) for entry_id, fields in reply]
    return found


def read_history(client: Any, prefix: str, name: str, count: int,
                 schema: str = V2) -> list[dict[str, Any]]:
    """The last `count` transitions of one breaker, oldest first."""
    key = NameKeys.build(name, prefix, schema).history
    _check_type(client, key, "stream")
    entries = client.xrevrange(key, count=count)
    return [decode_history(entry_id, fields, name) for entry_id, fields in reversed(entries)]


def read_shadows(client: Any, prefix: str, name: str, now_ms: int | None = None,
                 clock: Callable[[int], str] | None = None) -> list[dict[str, Any]]:
    """The shadow configs of breaker `name` (docs/guides/shadow.md), each a dict of
    `breaker.shadow.ShadowView.as_dict` (its candidate wire, source, would-be state and
    figures, and a one-line `summary`, its times formatted by `clock`, UTC by default);
    [] when it has none. The `show` command, the Prometheus collector and the dashboard
    read them here."""
    return read_shadows_many(client, prefix, [name], now_ms, clock).get(name, [])


def read_shadows_many(client: Any, prefix: str, names: Sequence[str],
                      now_ms: int | None = None, clock: Callable[[int], str] | None = None,
                      ) -> dict[str, list[dict[str, Any]]]:
    """`read_shadows` of several names, one pipeline; names without shadows are left out
    (as are shadow keys of a foreign type)."""
    if not names:
        return {}
    if now_ms is None:
        now_ms = server_now_ms(client)
    pipe = client.pipeline(transaction=False)
    slots = range(1, MAX_SHADOWS + 1)
    for name in names:
        state = BreakerKeys.build(name, prefix).state
        pipe.hgetall(shadow_key(state))
        for slot in slots:  # each shadow's header: what every record changes
            pipe.getrange(shadow_ring_key(state, slot), 0, HEADER_BYTES - 1)
    found: dict[str, list[dict[str, Any]]] = {}
    replies = pipe.execute(raise_on_error=False)
    step = 1 + len(slots)
    for at, name in enumerate(names):
        raw = replies[at * step]
        if isinstance(raw, Exception) or not raw:
            continue
        headers = {slot: h for slot, h in zip(slots, replies[at * step + 1:at * step + step],
                                               strict=True) if isinstance(h, bytes)}
        views = [v.as_dict(clock) if clock else v.as_dict()
                 for v in decode_shadows(raw, now_ms, headers)]
        if views:
            found[name] = views
    return found


def read_shadow_history(client: Any, prefix: str, name: str, count: int,
                        shadow: str | None = None) -> list[dict[str, Any]]:
    """The last `count` entries of the shadows' history of `name` (would-be transitions,
    shadows set, declared, replaced, cleared, expired), oldest first; only `shadow`'s
    when given."""
    key = shadow_history_key(BreakerKeys.build(name, prefix).state)
    _check_type(client, key, "stream")
    entries = client.xrevrange(key, count=count if shadow is None else max(count, HISTORY_READ))
    events = [decode_shadow_event(entry_id, fields, name)
              for entry_id, fields in reversed(entries)]
    if shadow is not None:
        events = [e for e in events if e["shadow"] == shadow][-count:]
    return events


def read_detail_any(client: Any, prefix: str, name: str,
                    schema: str | None = None) -> dict[str, Any]:
    """`read_detail` of `schema`, or without one of v2 unless only v1 keys exist (a worker
    not yet upgraded); ``other_schemas`` lists the other key schema when it has keys too."""
    details = {s: read_detail(client, prefix, name, s) for s in SCHEMAS}
    if schema is None:
        schema = V1 if details[V1]["exists"] and not details[V2]["exists"] else V2
    detail = details[schema]
    detail["other_schemas"] = [s for s, d in details.items() if s != schema and d["exists"]]
    return detail
