"""Read views of pools for operator tools (the CLI, the dashboard, exporters), and the two
operator actions on a member (eject, uneject: one ``lua/pool.lua`` call each).

Reads go straight to the keys (one HGETALL and the server time per pool; no script, so a
replica or a read-only ACL user can serve them) and decide nothing: an ejection whose time
ended is shown as probing, as the next call will record it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._runtime.keys import PoolKeys, namespace
from ._runtime.scripts import load_script, run_script, text
from .pool.config import PoolConfig, validate_member
from .pool.core import (
    REASONS,
    MemberChange,
    PoolStatus,
    decode_change,
    decode_record,
    decode_status,
)

#: Keys a pool's members hash ends with (its hash tag holds the pool's name).
POOL_SUFFIX = ":pool"
SCAN_COUNT = 1000


def _glob_escape(value: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)


def scan_pools(client: Any, prefix: str, count: int = SCAN_COUNT) -> list[str]:
    """The names of every pool under the prefix (one SCAN; every primary on a cluster)."""
    head = namespace(prefix) + ":{"
    pattern = _glob_escape(head) + "*}" + POOL_SUFFIX
    kwargs: dict[str, Any] = {"match": pattern, "count": count}
    if hasattr(client, "get_primaries"):
        kwargs["target_nodes"] = client.PRIMARIES
    names = set()
    for raw in client.scan_iter(**kwargs):
        key = text(raw)
        if key.startswith(head) and key.endswith("}" + POOL_SUFFIX):
            names.add(key[len(head):-len("}" + POOL_SUFFIX)])
    return sorted(names)


def status_reply(raw: Mapping[Any, Any], now_ms: int) -> list[Any]:
    """A pool hash (HGETALL) in the shape of the script's status reply."""
    fields = {text(k): v for k, v in raw.items()}
    members = sorted(k[2:] for k in fields if k.startswith("m:"))
    reply: list[Any] = [now_ms, int(text(fields.get("iv", b"0")) or 0),
                        text(fields.get("cfg", b"")), int(text(fields.get("lt", b"0")) or 0),
                        len(members)]
    for name in members:
        reply += [name, text(fields[f"m:{name}"]), int(text(fields.get(f"i:{name}", b"0")))]
    return reply


def read_pool(client: Any, prefix: str, name: str) -> PoolStatus | None:
    """A pool as the fleet sees it (None: no such pool)."""
    keys = PoolKeys.build(name, prefix)
    raw = client.hgetall(keys.members)
    if not raw:
        return None
    # TIME on its own: a pipeline holding it is refused by Redis Cluster (no key, no slot)
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    for key, value in raw.items():
        if text(key).startswith("m:"):
            decode_record(value)  # ValueError on a corrupt record
    return decode_status(name, status_reply(raw, now_ms))


def pool_row(status: PoolStatus) -> dict[str, Any]:
    """A pool as a JSON-able dict (``distbreaker pool show --json``; docs/CLI_JSON.md)."""
    return {
        "pool": status.name, "members": len(status.members), "ejected": status.ejected,
        "healthy": status.healthy, "panic": status.panic, "read_at": status.read_at,
        "interval_started": status.interval_started,
        "latency_threshold": status.latency_threshold,
        "rows": [{
            "member": m.member, "state": m.state, "weight": m.weight,
            "in_flight": m.in_flight, "ejected_until": m.ejected_until, "why": m.why,
            "ejections": m.ejections, "multiplier": m.multiplier,
            "consecutive_5xx": m.consecutive_5xx,
            "consecutive_gateway_failure": m.consecutive_gateway_failure,
            "consecutive_local_origin_failure": m.consecutive_local_origin_failure,
            "calls": m.calls, "failures": m.failures, "success_rate": m.success_rate,
            "mean_latency": m.mean_latency, "latency_ewma": m.latency_ewma,
            "override": m.override, "last_ejected_at": m.last_ejected_at,
            "capped": m.capped, "slow_share": m.slow_share,
        } for m in status.members],
    }


def pool_summary(status: PoolStatus) -> dict[str, Any]:
    """One line of ``distbreaker pool ls``: counts only."""
    return {"pool": status.name, "members": len(status.members), "ejected": status.ejected,
            "probing": sum(1 for m in status.members if m.state == "probing"),
            "in_flight": sum(m.in_flight for m in status.members), "panic": status.panic,
            "ejected_members": [m.member for m in status.members if m.ejected]}


def read_pool_history(client: Any, prefix: str, name: str, count: int = 50,
                      member: str | None = None) -> list[dict[str, Any]]:
    """The pool's last events, newest first (of `member` only when given)."""
    entries = client.xrevrange(PoolKeys.build(name, prefix).history,
                               count=count if member is None else max(count, 1000))
    out = []
    for entry_id, fields in entries:
        f = {text(k): text(v) for k, v in fields.items()}
        if member is not None and f.get("member") != member:
            continue
        why = int(f["why"]) if f.get("why", "").isdigit() else -1
        out.append({"id": text(entry_id), "member": f.get("member", ""),
                    "event": f.get("event", ""),
                    "why": REASONS[why] if 0 <= why < len(REASONS) else f.get("why", ""),
                    "until": int(f["until"]) / 1000 if f.get("until", "0") not in ("", "0")
                    else None, "actor": f.get("actor", ""),
                    "at": int(f["at"]) / 1000 if f.get("at", "").isdigit() else None})
        if len(out) >= count:
            break
    return out


def _stored_wire(client: Any, keys: PoolKeys) -> str:
    """The config the pool's last interval was closed with (its TTL governs the keys),
    else the defaults."""
    stored = client.hget(keys.members, "cfg")
    wire = text(stored) if stored else ""
    return wire if wire.count(",") == PoolConfig().wire.count(",") else PoolConfig().wire


def act_on_member(client: Any, prefix: str, name: str, op: str, member: str,
                  duration: float | None = None, actor: str = "cli") -> MemberChange:
    """An operator's ``eject`` (for `duration` seconds; None: until uneject), ``uneject``
    or ``exempt`` (never ejected by the rules, for `duration` seconds; None: until uneject)
    of one member, fleet-wide: one script call. `state` "" when the pool has
    no such member."""
    if op not in ("eject", "uneject", "exempt"):
        raise ValueError(f"op must be eject, uneject or exempt, got {op!r}")
    keys = PoolKeys.build(name, prefix)
    validate_member(member)
    wire = _stored_wire(client, keys)
    if op in ("eject", "exempt"):
        ms = 0 if duration is None else max(1, round(duration * 1000))
        args = [op, wire, member, str(ms), actor]
    else:
        args = [op, wire, member, actor]
    raw = run_script(client, load_script("pool"), keys.script_keys, args)
    return decode_change(member, raw)
