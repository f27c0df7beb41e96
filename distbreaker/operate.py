"""Operator actions as plain functions, shared by the CLI commands and the web dashboard.

Each action is ONE breaker script call (the `set` op), so it takes effect
fleet-wide at once, and the script records it in the history with who and
why. The breaker's stored `cfg` is sent back unchanged, so an action never
looks like config drift and never replaces the fleet's config with defaults;
`reset` with ``adopt_drift`` instead sends the config a drifting worker
reported, which the script then stores (the operator's way to roll the
fleet's config forward).

Actions act on key schema v2 only. A name whose breaker has only v1 keys (workers
not yet upgraded) raises `OnlyV1`: this tool never writes v1 keys, and a new v2
breaker would not reach the v1 workers (docs/OPERATIONS.md, Rolling deploy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import redis

from . import readside as view
from ._runtime import state_record
from ._runtime.keys import BreakerKeys
from ._runtime.scripts import load_script, run_script
from .breaker import shadow as shadows
from .breaker.config import BreakerConfig, config_differences
from .breaker.events import Transition
from .breaker.state import State
from .breaker.sync import CircuitBreaker
from .errors import SchemaError


@dataclasses.dataclass(frozen=True)
class Action:
    """One operator action: its CLI command, its stable JSON id and its script target."""

    command: str
    id: str
    target: str
    creates: bool  # may store a new breaker for a name that has no keys (planned maintenance)
    help: str


ACTIONS: dict[str, Action] = {a.id: a for a in (
    Action("open", "forced_open", State.FORCED_OPEN.value, True,
           "Hold NAME FORCED_OPEN: every call is rejected until `close` or `reset`. "
           "Works for a name with no keys yet (planned maintenance)."),
    Action("trip", "trip", "TRIP", False,
           "Trip NAME to a normal OPEN: probes start after the open wait."),
    Action("disable", "disabled", State.DISABLED.value, True,
           "Set NAME DISABLED: every call passes, nothing is recorded."),
    Action("metrics-only", "metrics_only", State.METRICS_ONLY.value, True,
           "Set NAME METRICS_ONLY: every call passes, outcomes are still recorded."),
    Action("close", "closed", State.CLOSED.value, False,
           "Move NAME to CLOSED (leaves FORCED_OPEN, DISABLED, METRICS_ONLY, OPEN)."),
    Action("reset", "reset", "RESET", False,
           "Back to CLOSED with an empty window; clears the recorded config drift."),
)}


class UnknownBreaker(LookupError):
    """No breaker state is stored for the name; `suggestions` are close existing names."""

    def __init__(self, name: str, prefix: str, suggestions: list[str]) -> None:
        self.name, self.prefix, self.suggestions = name, prefix, suggestions
        super().__init__(f"unknown breaker {name!r} under prefix {prefix!r}")


class OnlyV1(LookupError):
    """The name's breaker has keys of key schema v1 only: its workers run a distbreaker
    that predates schema v2, which this tool does not write."""

    def __init__(self, name: str, prefix: str) -> None:
        self.name, self.prefix = name, prefix
        super().__init__(
            f"breaker {name!r} exists only in key schema v1 (under {prefix}:v1): its "
            "workers run a distbreaker older than schema v2, and this tool acts on v2 keys "
            "only (v1 and v2 workers never share state). Upgrade those workers, or act "
            "with a v1 distbreaker CLI")


def has_v1_breaker(client: Any, prefix: str, name: str) -> bool:
    """Whether `name` has breaker keys of key schema v1 (state hash or history)."""
    keys = view.NameKeys.build(name, prefix, view.V1)
    return bool(client.exists(keys.state, keys.history))


class NoDrift(ValueError):
    """`adopt_drift` was asked but no worker reported another config."""


def breaker_names(client: Any, prefix: str) -> list[str]:
    """Every name with breaker keys under the prefix (SCAN; for suggestions)."""
    return sorted(n for n, parts in view.scan_names(client, prefix).items() if "breaker" in parts)


def close_names(wanted: str, names: list[str]) -> list[str]:
    import difflib

    return difflib.get_close_matches(wanted, names, n=3, cutoff=0.6)


def read_stored(client: Any, prefix: str, name: str) -> tuple[BreakerConfig | None, str | None]:
    """(the stored config, the drifting config's wire) of `name`; (None, None) without a
    v2 state record."""
    keys = BreakerKeys.build(name, prefix)
    kinds = [view.text(client.type(k)) for k in (keys.state, keys.meta)]
    for key, kind, wanted in zip((keys.state, keys.meta), kinds, ("string", "hash"),
                                 strict=True):
        if kind not in ("none", wanted):
            raise SchemaError(f"key {key} holds a {kind}, expected a {wanted}", key=key)
    if kinds[0] == "none":
        return None, None
    header = record_header(client, keys.state, name)
    wire, drift = client.hmget(keys.meta, ["cfg", "drift_cfg"])
    try:
        stored = view.text(wire) if wire is not None and header["fp"] else view.UNSET_CONFIG
        config = None if stored == view.UNSET_CONFIG else BreakerConfig.from_wire(stored)
    except ValueError as exc:
        raise SchemaError(f"breaker {name!r}: {exc}", key=keys.meta) from None
    return config or BreakerConfig(), view.text(drift) if drift else None


def record_header(client: Any, key: str, name: str) -> dict[str, Any]:
    """The header fields of a v2 state record (empty when there is none)."""
    data = view.read_record(client, key, state_record.WINDOW_OFFSET - 1)
    if data is None:
        return {}
    try:
        return state_record.decode_record(data)
    except state_record.NotAStateRecord as exc:
        raise SchemaError(f"breaker {name!r}: key {key} {exc}", key=key) from None


def act(client: Any, prefix: str, name: str, action: Action, reason: str, actor: str, *,
        create: bool = False, adopt_drift: bool = False, for_: float | None = None,
        until: float | None = None) -> dict[str, Any]:
    """Run one operator action; the result is the CLI's `--json` line (docs/CLI_JSON.md).

    A name with no keys raises UnknownBreaker, except for actions that may create
    one (`open`, `disable`, `metrics-only`): they store a new breaker whose config
    is 'unset' (the first worker stores its own), unless an existing name is close
    enough to be a typo and `create` was not given. A name with v1 breaker keys only
    raises OnlyV1 (with `create`, a creating action stores a new v2 breaker: only v2
    workers obey it). `for_` (seconds) or `until`
    (epoch seconds) make the action an override that ends by server time.
    """
    config, drift_wire = read_stored(client, prefix, name)
    created = config is None
    if created:
        if (not action.creates or not create) and has_v1_breaker(client, prefix, name):
            raise OnlyV1(name, prefix)
        if not action.creates:
            raise UnknownBreaker(name, prefix, close_names(name, breaker_names(client, prefix)))
        similar = close_names(name, breaker_names(client, prefix))
        if similar and not create:
            raise UnknownBreaker(name, prefix, similar)
        config = BreakerConfig()
    adopted: list[tuple[str, Any, Any]] = []
    if adopt_drift:
        if action.id != "reset":
            raise ValueError("adopt_drift only applies to reset")
        if drift_wire is None:
            raise NoDrift(f"no worker of {name!r} reported another config: nothing to adopt")
        try:
            new = BreakerConfig.from_wire(drift_wire)
        except ValueError as exc:
            raise SchemaError(f"breaker {name!r}: drift_cfg: {exc}") from None
        assert config is not None
        adopted = config_differences(config, new)
        config = new
    breaker = CircuitBreaker(name, redis=client, config=config, prefix=prefix)
    moves: list[Transition] = []
    breaker.add_listener(moves.append)
    if (for_ is not None or until is not None) and action.id == "reset":
        raise ValueError("reset takes no --for / --until")
    before = {} if created else record_header(client, breaker.keys.state, name)
    last_id = _last_history_id(client, breaker.keys.history)
    state = _run(breaker, action, reason, actor, for_, until)
    previous = moves[0].from_state.value if moves else str(state)
    header = record_header(client, breaker.keys.state, name)
    ends = header.get("ov_until", 0)
    if action.id == "trip" and state is State.OPEN:
        ends = header.get("open_until", 0)
    recorded = _recorded(client, breaker.keys.history, last_id, reason, actor)
    change = describe_change(recorded, before)
    return {"name": name, "action": action.id, "previous": previous, "state": str(state),
            "changed": change is not None, "change": change, "created": created,
            "reason": reason, "actor": actor,
            "at_ms": recorded[-1]["at_ms"] if recorded else None,
            "until_ms": int(ends) or None,
            "drift_cleared": action.id == "reset" and drift_wire is not None,
            "adopted": [{"field": f, "was": a, "now": b} for f, a, b in adopted]}


def _last_history_id(client: Any, key: str) -> str:
    """The newest history entry's id ("0-0" when there is none)."""
    try:
        newest = client.xrevrange(key, count=1)
    except redis.ResponseError:  # foreign data: the action's script names the key
        return "0-0"
    return view.text(newest[0][0]) if newest else "0-0"


def _recorded(client: Any, key: str, after: str, reason: str,
              actor: str) -> list[dict[str, Any]]:
    """The history entries this action wrote (after `after`, with its reason and actor;
    the entries a worker's call wrote meanwhile carry neither)."""
    entries = client.xrange(key, min=f"({after}", max="+")
    found = [view.decode_history(entry_id, fields, "") for entry_id, fields in entries]
    return [e for e in found if e["reason"] == reason and e["actor"] == actor]


def describe_change(recorded: list[dict[str, Any]], before: dict[str, Any]) -> str | None:
    """What an action changed, from the history entries it wrote (None: nothing, and
    nothing was recorded): "transition", "restarted" (a trip restarted the OPEN wait),
    "extended" / "shortened" / "indefinite" / "timed" (an override's end moved, was
    lifted or set on the state already held; "released": a held CLOSED's end lifted),
    "reset" (a CLOSED breaker's window emptied, a held CLOSED released or a drift record
    cleared)."""
    if not recorded:
        return None
    if any(e["kind"] == "" for e in recorded):
        return "transition"
    last = recorded[-1]
    if last["kind"] != "override":
        return {"restart": "restarted"}.get(last["kind"], last["kind"])
    was, now = int(before.get("ov_until", 0)), last["until_ms"] or 0
    if not now:
        return "released" if last["to"] == State.CLOSED.value else "indefinite"
    if not was:
        return "timed"
    return "extended" if now > was else "shortened"


def _run(breaker: CircuitBreaker, action: Action, reason: str, actor: str,
         for_: float | None, until: float | None) -> State:
    if action.id == "reset":
        return breaker.reset(reason, actor)
    if action.id == "trip":
        return breaker.trip(reason, actor, for_=for_, until=until)
    methods = {"forced_open": breaker.transition_to_forced_open,
               "disabled": breaker.transition_to_disabled,
               "metrics_only": breaker.transition_to_metrics_only,
               "closed": breaker.transition_to_closed}
    return methods[action.id](reason, actor, for_=for_, until=until)


class NoConfigToAdopt(LookupError):
    """`config adopt` found no config other than the one in force (or not the one asked)."""


def adopt_config(client: Any, prefix: str, name: str, reason: str, actor: str,
                 fingerprint: str | None = None) -> dict[str, Any]:
    """Promote a deployed config (docs/OPERATIONS.md, "Changing a breaker's config"):
    the one with `fingerprint`, else the newest deployed one that is not in force. It
    becomes the newest deployment, so the rollout rule keeps it in force; the window is
    kept unless its shape changes, the state is kept. The CLI's `--json` line."""
    config, _ = read_stored(client, prefix, name)
    if config is None:
        raise UnknownBreaker(name, prefix, close_names(name, breaker_names(client, prefix)))
    keys = BreakerKeys.build(name, prefix)
    record = view.read_record(client, keys.state, state_record.WINDOW_OFFSET - 1)
    meta = client.hgetall(keys.meta)
    rollout = view.merge_rollout(meta, client.hgetall(keys.state + view.LEGACY_ROLLOUT_SUFFIX))
    breaker_view = view.decode_state_record(name, record or b"", meta, view.server_now_ms(
        client), rollout=rollout)
    candidates = [c for c in breaker_view["configs"] if c["wire"] and not c["in_force"]]
    if fingerprint is not None:
        candidates = [c for c in candidates if c["fingerprint"] == fingerprint]
        if not candidates:
            known = ", ".join(c["fingerprint"] for c in breaker_view["configs"]) or "none"
            raise NoConfigToAdopt(f"no deployed config of {name!r} other than the one in "
                                  f"force has fingerprint {fingerprint} (known: {known})")
    elif not candidates:
        raise NoConfigToAdopt(f"no config of {name!r} other than the one in force is "
                              "deployed: nothing to adopt")
    chosen = candidates[0]  # in force first, then the newest deployment first
    try:
        new = BreakerConfig.from_wire(chosen["wire"])
    except ValueError as exc:
        raise SchemaError(f"breaker {name!r}: deployed config {chosen['wire']!r}: {exc}") \
            from None
    breaker = CircuitBreaker(name, redis=client, config=new, prefix=prefix)
    state = breaker.adopt_config(reason, actor)
    return {"name": name, "action": "config_adopt", "state": str(state),
            "fingerprint": chosen["fingerprint"], "wire": chosen["wire"],
            "workers": chosen["workers"], "reason": reason, "actor": actor,
            "changed": [{"field": f, "was": a, "now": b}
                        for f, a, b in config_differences(config, new)],
            "window_kept": (config.sliding_window_type, config.sliding_window_size)
            == (new.sliding_window_type, new.sliding_window_size)}


# -- shadow configs (docs/guides/shadow.md) ---------------------------------------------------
def set_shadow(client: Any, prefix: str, name: str, shadow: str,
               changes: Mapping[str, Any] | BreakerConfig, reason: str, actor: str, *,
               for_: float | None = None) -> dict[str, Any]:
    """Set (or replace) shadow config `shadow` of breaker `name`: the config in force with
    `changes` (a mapping of fields), or a whole BreakerConfig; it is fed every live
    outcome from now on, without deciding anything, until `for_` seconds have passed
    (None: until cleared). One script call; recorded in the shadows' history with
    `actor` and `reason`. Raises UnknownBreaker for a name without a breaker, ValueError
    for a bad config or a fourth shadow."""
    config, _ = read_stored(client, prefix, name)
    if config is None:
        raise UnknownBreaker(name, prefix, close_names(name, breaker_names(client, prefix)))
    wanted = changes if isinstance(changes, BreakerConfig) else shadows.candidate(config,
                                                                                  changes)
    keys = BreakerKeys.build(name, prefix)
    count = run_script(client, load_script("breaker"), [keys.state],
                       ["shadow", *shadows.set_args(shadow, wanted, for_, actor, reason)])
    found = {s["name"]: s for s in view.read_shadows(client, prefix, name)}
    return {"name": name, "shadow": shadow, "action": "shadow_set", "wire": wanted.to_wire(),
            "changes": [{"field": f, "in_force": a, "candidate": b}
                        for f, a, b in config_differences(config, wanted)],
            "until_ms": found.get(shadow, {}).get("until_ms") or None,
            "shadows": int(count), "reason": reason, "actor": actor}


def clear_shadow(client: Any, prefix: str, name: str, shadow: str | None, reason: str,
                 actor: str) -> dict[str, Any]:
    """Remove shadow `shadow` of `name` (None: every one), recording its final figures in
    the shadows' history. A declared shadow (the registry's `shadow:`) comes back with
    the next worker hello that declares it."""
    before = {s["name"]: s for s in view.read_shadows(client, prefix, name)}
    keys = BreakerKeys.build(name, prefix)
    left = run_script(client, load_script("breaker"), [keys.state],
                      ["shadow", *shadows.clear_args(shadow, actor, reason)])
    gone = [s for n, s in before.items() if shadow is None or n == shadow]
    return {"name": name, "shadow": shadow, "action": "shadow_clear",
            "cleared": [s["name"] for s in gone], "summaries": {s["name"]: s["summary"]
                                                                for s in gone},
            "shadows": int(left), "reason": reason, "actor": actor}


# -- selectors: one action on many names -------------------------------------------------
#: The state each action moves a breaker to (RESET: CLOSED with an empty window; TRIP:
#: OPEN, ignored by a FORCED_OPEN or DISABLED breaker), for `--dry-run`.
_TARGET_STATE = {"forced_open": State.FORCED_OPEN, "trip": State.OPEN,
                 "disabled": State.DISABLED, "metrics_only": State.METRICS_ONLY,
                 "closed": State.CLOSED, "reset": State.CLOSED}


def selected(client: Any, prefix: str, patterns: list[str]) -> list[str]:
    """The names with v2 breaker keys that any glob of `patterns` matches, sorted."""
    return view.matching(breaker_names(client, prefix), patterns)


def plan_many(client: Any, prefix: str, names: list[str], action: Action, *,
              held: bool = False) -> list[dict[str, Any]]:
    """What `act_many` would do, without doing it (`--dry-run`): per name its state now
    (one brief read of every name) and whether the action would change it (`held`: the
    action sets an end, `--for` / `--until`, which always changes something)."""
    briefs = view.read_brief(client, prefix, names)
    target = _TARGET_STATE[action.id]
    plans = []
    for name in names:
        b = briefs.get(name)
        plan: dict[str, Any] = {"name": name, "action": action.id, "dry_run": True,
                                "state": b["state"] if b else None,
                                "target": target.value, "would_change": False,
                                "error": None if b else "no readable state record"}
        if b is not None:
            now = State(b["state"])
            if action.id == "trip":
                change = now not in (State.FORCED_OPEN, State.DISABLED)
            else:  # the state held already: a timed hold without --for loses its end
                change = (now is not target or action.id == "reset"
                          or bool(b.get("override_until_ms")))
            plan["would_change"] = change or held
        plans.append(plan)
    return plans


def act_many(client: Any, prefix: str, names: list[str], action: Action, reason: str,
             actor: str, *, for_: float | None = None, until: float | None = None,
             batch: int = 500) -> list[dict[str, Any]]:
    """`act` on many existing breakers (a selector), each recorded in its history with
    `reason` and `actor` as a single action is: per batch of names, one pipeline reads
    the stored configs and newest history ids, one sends every action (the same `set`
    script call `act` makes), one reads back what each recorded; 3 round trips per
    `batch` names instead of ~8 per name. The results are `act`'s dicts; a name whose
    keys hold foreign data gets ``{"name", "action", "error"}`` and the others go on;
    a name without a state record (only its history left, or expired meanwhile) is
    skipped. Never creates a breaker."""
    from ._runtime.connection import db_of
    from ._runtime.scripts import load_script, run_scripts_each
    from .breaker.core import BreakerCodec, decode_reply, hold_args

    if (for_ is not None or until is not None) and action.id == "reset":
        raise ValueError("reset takes no --for / --until")
    hold = hold_args(for_, until)
    script, db = load_script("breaker"), db_of(client)
    configs: dict[str, BreakerConfig] = {}
    results: list[dict[str, Any]] = []
    for i in range(0, len(names), batch):
        chunk = names[i:i + batch]
        pipe = client.pipeline(transaction=False)
        for name in chunk:
            keys = BreakerKeys.build(name, prefix)
            view.queue_raw(pipe, keys.state, state_record.WINDOW_OFFSET - 1)
            pipe.hmget(keys.meta, ["cfg", "drift_cfg"])
            pipe.xrevrange(keys.history, count=1)
        read = pipe.execute(raise_on_error=False)
        before: dict[str, tuple[dict[str, Any], str, bool]] = {}
        calls, called = [], []
        for j, name in enumerate(chunk):
            record, meta, newest = read[3 * j:3 * j + 3]
            if not record and not isinstance(record, Exception):
                continue  # only history left, or expired since the names were found
            wire, drift = (None, None) if isinstance(meta, Exception) else meta
            try:
                header, config = _stored_for_action(name, record, meta if isinstance(
                    meta, Exception) else wire, newest, configs)
            except SchemaError as exc:
                results.append({"name": name, "action": action.id, "error": str(exc)})
                continue
            last = view.text(newest[0][0]) if newest else "0-0"
            before[name] = (header, last, drift is not None)
            call = BreakerCodec(name, config, prefix, db).set_call(action.target, reason,
                                                                   actor, hold)
            calls.append((script, call.keys, call.args))
            called.append(name)
        replies = run_scripts_each(client, calls) if calls else []
        pipe = client.pipeline(transaction=False)
        done = []
        for name, raw in zip(called, replies, strict=True):
            if isinstance(raw, Exception):
                results.append({"name": name, "action": action.id, "error": str(raw)})
                continue
            keys = BreakerKeys.build(name, prefix)
            view.queue_raw(pipe, keys.state, state_record.WINDOW_OFFSET - 1)
            pipe.xrange(keys.history, min=f"({before[name][1]}", max="+")
            done.append((name, decode_reply(raw).state))
        after = pipe.execute(raise_on_error=False) if done else []
        for k, (name, state) in enumerate(done):
            record, entries = after[2 * k:2 * k + 2]
            header_before = before[name][0]
            header = {} if isinstance(record, Exception) or not record else \
                state_record.decode_record(bytes(record))
            found = [] if isinstance(entries, Exception) else [
                view.decode_history(entry_id, fields, name) for entry_id, fields in entries]
            recorded = [e for e in found if e["reason"] == reason and e["actor"] == actor]
            ends = header.get("ov_until", 0)
            if action.id == "trip" and state is State.OPEN:
                ends = header.get("open_until", 0)
            change = describe_change(recorded, header_before)
            results.append({
                "name": name, "action": action.id,
                "previous": State(header_before["state"]).value, "state": str(state),
                "changed": change is not None, "change": change, "created": False,
                "reason": reason, "actor": actor,
                "at_ms": recorded[-1]["at_ms"] if recorded else None,
                "until_ms": int(ends) or None,
                "drift_cleared": action.id == "reset" and before[name][2], "adopted": []})
    return results


def _stored_for_action(name: str, record: Any, wire: Any, newest: Any,
                       configs: dict[str, BreakerConfig]) -> tuple[dict[str, Any],
                                                                   BreakerConfig]:
    """(the record's header, the stored config) from a batch read, or SchemaError:
    what `read_stored` decides for one name."""
    for reply in (record, wire, newest):
        if isinstance(reply, Exception):
            raise SchemaError(f"breaker {name!r}: {reply}")
    try:
        header = state_record.decode_record(bytes(record))
    except state_record.NotAStateRecord as exc:
        raise SchemaError(f"breaker {name!r}: its state record {exc}") from None
    stored = view.text(wire) if wire is not None and header["fp"] else view.UNSET_CONFIG
    if stored not in configs:
        try:
            configs[stored] = (BreakerConfig() if stored == view.UNSET_CONFIG
                               else BreakerConfig.from_wire(stored))
        except ValueError as exc:
            raise SchemaError(f"breaker {name!r}: {exc}") from None
    return header, configs[stored]


# -- a rate limiter's limit at run time ---------------------------------------------------
class UnknownLimiter(LookupError):
    """No rate limiter bucket is stored for the name; `suggestions` are close names."""

    def __init__(self, name: str, prefix: str, suggestions: list[str]) -> None:
        self.name, self.prefix, self.suggestions = name, prefix, suggestions
        super().__init__(f"unknown rate limiter {name!r} under prefix {prefix!r}")


def change_limit(client: Any, prefix: str, name: str, reason: str, actor: str, *,
                 limit_for_period: int | None = None, refresh: float | None = None,
                 burst: int | None = None, reset: bool = False) -> dict[str, Any]:
    """Change a rate limiter's limit fleet-wide, at once (Resilience4j's
    changeLimitForPeriod: the `set` op of lua/ratelimiter.lua, as
    `RateLimiter.change_limit` sends it), or with `reset` drop an operator's limit so
    each worker's own config governs again (`unset`). Fields left None keep the limit in
    force; a burst that equalled the limit follows it. The reason, actor and server time
    are stored in the limiter's hash (`why`, `by`, `at`): `ls` / `show` show them. The
    result is the CLI's `--json` line (docs/CLI_JSON.md)."""
    from ._runtime.keys import RateLimiterKeys
    from ._runtime.scripts import load_script, run_script
    from .ratelimiter.config import RateLimiterConfig
    from .ratelimiter.core import RateLimiterCore, decode_metrics

    key = RateLimiterKeys.build(name, prefix).bucket
    kind = view.text(client.type(key))
    if kind not in ("none", "hash"):
        raise SchemaError(f"key {key} holds a {kind}, expected a hash", key=key)
    now_ms = view.server_now_ms(client)
    raw = client.hgetall(key)
    if not raw:
        known = [n for n, parts in view.scan_names(client, prefix).items()
                 if "rate_limiter" in parts]
        raise UnknownLimiter(name, prefix, close_names(name, known))
    before = view.decode_rate_limiter(raw, now_ms)
    fields = {view.text(k): view.text(v) for k, v in raw.items()}
    try:  # the workers' own bucket (what the TTL-setting worker sent), kept as it is
        bucket = [int(fields.get(f) or fields[g]) for f, g in
                  (("cl", "lim"), ("cp", "per"), ("cb", "bur"))]
        own = RateLimiterConfig(limit_for_period=bucket[0],
                                limit_refresh_period=bucket[1] / 1000, burst=bucket[2])
    except (KeyError, ValueError):
        raise SchemaError(f"key {key} holds no rate limiter bucket", key=key) from None
    # the key's TTL as it is, but never less than such a limiter's own (the change must
    # outlive a quiet spell)
    ttl_ms = max(int(client.pttl(key)), round(own.effective_key_ttl * 1000))
    geometry = [str(x) for x in bucket] + [str(ttl_ms)]
    if reset:
        args = ["unset", *geometry, reason, actor]
    else:
        core = RateLimiterCore(name, own, prefix, {})
        current = None
        if before["limit_for_period"]:
            current = decode_metrics([0, before["limit_for_period"],
                                      before["limit_refresh_period_ms"], before["burst"],
                                      0, 0, 0, 0, now_ms, 0])
        new = core.set_args(limit_for_period, refresh, burst, current)[5:8]  # validated
        args = ["set", *geometry, *new, reason, actor]
    reply = decode_metrics(run_script(client, load_script("ratelimiter"), [key], args))
    after = view.decode_rate_limiter(client.hgetall(key), view.server_now_ms(client))
    return {"name": name, "action": "limit_reset" if reset else "limit",
            "previous": {"limit_for_period": before["limit_for_period"],
                         "limit_refresh_period_ms": before["limit_refresh_period_ms"],
                         "burst": before["burst"], "overridden": before["overridden"]},
            "limit_for_period": reply.limit_for_period,
            "limit_refresh_period_ms": round(reply.limit_refresh_period * 1000),
            "burst": reply.burst, "overridden": reply.overridden,
            "available": reply.available_permissions, "reason": reason, "actor": actor,
            "at_ms": after["changed_at_ms"]}
