"""Operator actions as plain functions, shared by the CLI commands and the web dashboard.

Each action is ONE breaker script call (the `set` op), so it takes effect
fleet-wide at once, and the script records it in the history with who and
why. The breaker's stored `cfg` is sent back unchanged, so an action never
looks like config drift and never replaces the fleet's config with defaults;
`reset` with ``adopt_drift`` instead sends the config a drifting worker
reported, which the script then stores (the operator's way to roll the
fleet's config forward).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import readside as view
from .._runtime.keys import BreakerKeys
from ..breaker.config import BreakerConfig, config_differences
from ..breaker.events import Transition
from ..breaker.state import State
from ..breaker.sync import CircuitBreaker
from ..errors import SchemaError


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
BY_COMMAND = {a.command: a for a in ACTIONS.values()}


class UnknownBreaker(LookupError):
    """No breaker state is stored for the name; `suggestions` are close existing names."""

    def __init__(self, name: str, prefix: str, suggestions: list[str]) -> None:
        self.name, self.prefix, self.suggestions = name, prefix, suggestions
        super().__init__(f"unknown breaker {name!r} under prefix {prefix!r}")


class NoDrift(ValueError):
    """`adopt_drift` was asked but no worker reported another config."""


def breaker_names(client: Any, prefix: str) -> list[str]:
    """Every name with breaker keys under the prefix (SCAN; for suggestions)."""
    return sorted(n for n, parts in view.scan_names(client, prefix).items() if "breaker" in parts)


def close_names(wanted: str, names: list[str]) -> list[str]:
    import difflib

    return difflib.get_close_matches(wanted, names, n=3, cutoff=0.6)


def read_stored(client: Any, prefix: str, name: str) -> tuple[BreakerConfig | None, str | None]:
    """(the stored config, the drifting config's wire) of `name`; (None, None) without keys."""
    key = BreakerKeys.build(name, prefix).state
    kind = view.text(client.type(key))
    if kind == "none":
        return None, None
    if kind != "hash":
        raise SchemaError(f"key {key} holds a {kind}, expected a hash", key=key)
    wire, drift = client.hmget(key, ["cfg", "drift_cfg"])
    try:
        stored = view.text(wire) if wire is not None else view.UNSET_CONFIG
        config = None if stored == view.UNSET_CONFIG else BreakerConfig.from_wire(stored)
    except ValueError as exc:
        raise SchemaError(f"breaker {name!r}: {exc}", key=key) from None
    return config or BreakerConfig(), view.text(drift) if drift else None


def act(client: Any, prefix: str, name: str, action: Action, reason: str, actor: str, *,
        create: bool = False, adopt_drift: bool = False, for_: float | None = None,
        until: float | None = None) -> dict[str, Any]:
    """Run one operator action; the result is the CLI's `--json` line (docs/CLI_JSON.md).

    A name with no keys raises UnknownBreaker, except for actions that may create
    one (`open`, `disable`, `metrics-only`): they store a new breaker whose config
    is 'unset' (the first worker stores its own), unless an existing name is close
    enough to be a typo and `create` was not given. `for_` (seconds) or `until`
    (epoch seconds) make the action an override that ends by server time.
    """
    config, drift_wire = read_stored(client, prefix, name)
    created = config is None
    if created:
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
    state = _run(breaker, action, reason, actor, for_, until)
    previous = moves[0].from_state.value if moves else str(state)
    ends = view.text(client.hget(breaker.keys.state, "ov_until") or "0")
    if action.id == "trip" and state is State.OPEN:
        ends = view.text(client.hget(breaker.keys.state, "open_until") or "0")
    return {"name": name, "action": action.id, "previous": previous, "state": str(state),
            "changed": bool(moves), "created": created, "reason": reason, "actor": actor,
            "at_ms": moves[-1].at_ms if moves else None,
            "until_ms": int(ends) or None,
            "drift_cleared": action.id == "reset" and drift_wire is not None,
            "adopted": [{"field": f, "was": a, "now": b} for f, a, b in adopted]}


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
