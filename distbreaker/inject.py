"""An operator's fleet-wide fault injection: set, stop, list and the log, one
`lua/inject.lua` call each (shared by the CLI; docs/guides/fault_injection.md).

Workers obey only when their config says `allow_fault_injection: true`: the script
refuses an injection that no running worker of the selector registered for, and each
worker checks its own config again.
"""

from __future__ import annotations

import json
from typing import Any

from ._runtime.connection import db_of
from ._runtime.faults import (
    MAX_DURATION_S,
    Fault,
    check_spec,
    fault_keys,
    parse_flat,
    selector_pattern,
)
from ._runtime.keys import events_channel, validate_name
from ._runtime.scripts import load_script, run_script, text

#: The longest actor or reason an injection carries (lua/inject.lua caps the spec JSON).
MAX_TEXT = 500


class NotAllowed(LookupError):
    """No running worker of the selector allows fault injection."""


def check_selector(selector: str) -> str:
    """A name, or a glob of names ('*' any run, '?' one character)."""
    validate_name(selector.replace("*", "x").replace("?", "x"))
    return selector


def inject(client: Any, prefix: str, selector: str, kind: str, *, rate: float = 1.0,
           status: int | None = None, latency: float | None = None, for_: float,
           actor: str = "", reason: str = "", require_allowed: bool = True) -> dict[str, Any]:
    """Inject `kind` ("error", "latency", "reject") into every allowing worker's calls of
    the names `selector` covers, for `for_` seconds. Replaces the selector's injection
    of the same kind. Raises NotAllowed when no running worker allows it (unless
    `require_allowed` is False: the injection then waits for the workers to come)."""
    check_selector(selector)
    if isinstance(for_, bool) or not isinstance(for_, (int, float)) \
            or not 0.001 <= for_ <= MAX_DURATION_S:
        raise ValueError(f"--for must be between 1 ms and {MAX_DURATION_S / 86400:g} days: "
                         f"an injection always ends by itself; got {for_!r}")
    for what, value in (("actor", actor), ("reason", reason)):
        if len(value) > MAX_TEXT:
            raise ValueError(f"--{what} is at most {MAX_TEXT} characters (every allowing "
                             f"worker reads it every few seconds), got {len(value)}")
    spec = check_spec(kind, rate, status, latency) | {"actor": actor, "reason": reason}
    raw = run_script(client, load_script("inject"), fault_keys(prefix),
                     ["set", events_channel(prefix, db_of(client)), selector,
                      json.dumps(spec, separators=(",", ":")), str(max(1, round(for_ * 1000))),
                      "1" if require_allowed else "0", actor, reason])
    if int(raw[0]) == 0:
        raise NotAllowed(f"no running worker of {selector!r} allows fault injection (set "
                         "allow_fault_injection: true in its breaker's config; workers "
                         "register within a few seconds of their first breaker)")
    return {"selector": selector, "kind": kind, "rate": spec["rate"],
            "status": spec.get("status"), "latency_s": latency if kind == "latency" else None,
            "at_ms": int(raw[1]), "until_ms": int(raw[2]),
            "names": [text(n) for n in raw[3:]], "actor": actor, "reason": reason}


def stop(client: Any, prefix: str, selector: str | None = None, kind: str | None = None,
         *, actor: str = "", reason: str = "") -> int:
    """End the injections of `selector` (of `kind`, or all kinds); every injection when
    `selector` is None (the master switch). Returns how many ended."""
    if selector is not None:
        check_selector(selector)
    raw = run_script(client, load_script("inject"), fault_keys(prefix),
                     ["off", events_channel(prefix, db_of(client)), selector or "",
                      kind or "", actor, reason])
    return int(raw[0])


def in_force(client: Any, prefix: str) -> tuple[int, list[Fault], dict[str, int]]:
    """(server ms, the injections in force, names allowing injection -> registration end)."""
    return parse_flat(run_script(client, load_script("inject"), fault_keys(prefix), ["list"]))


def covered(allowed: dict[str, int], selector: str) -> list[str]:
    """The allowing names a selector covers."""
    pattern = selector_pattern(selector)
    return sorted(n for n in allowed if pattern.match(n))


def log(client: Any, prefix: str, count: int = 50) -> list[dict[str, Any]]:
    """The newest `count` set / off entries of the injection log, oldest first."""
    entries = client.xrevrange(fault_keys(prefix)[1], count=count)
    out = []
    for entry_id, fields in reversed(entries):
        f = {text(k): text(v) for k, v in fields.items()}
        out.append({"id": text(entry_id), "at_ms": int(text(entry_id).split("-")[0]), **f})
    return out
