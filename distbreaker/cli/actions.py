"""Operator actions. Each is ONE Lua script call, so it takes effect fleet-wide at once,
and the breaker script records it in the history with who (--actor) and why (--reason).

The `set` op carries a config wire string; the breaker's stored `cfg` is sent
back unchanged, so an operator action never looks like config drift and never
replaces the fleet's config with the CLI's defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from .. import readside as view
from .._runtime.keys import BreakerKeys, BulkheadKeys
from .._runtime.scripts import load_script, run_script
from ..breaker.config import BreakerConfig
from ..breaker.sync import CircuitBreaker
from ..errors import SchemaError
from .app import App, NotFound, check_name, cli, default_actor, emit_json


def stored_breaker(app: App, name: str) -> CircuitBreaker:
    """A CircuitBreaker for `name` carrying the fleet's stored config; NotFound if none."""
    client = app.client
    key = BreakerKeys.build(name, app.prefix).state
    kind = view.text(client.type(key))
    if kind == "none":
        raise NotFound(f"unknown breaker {name!r} under prefix {app.prefix!r}")
    if kind != "hash":
        raise SchemaError(f"key {key} holds a {kind}, expected a hash", key=key)
    wire = client.hget(key, "cfg")
    try:
        config = BreakerConfig.from_wire(view.text(wire)) if wire is not None else None
    except ValueError as exc:
        raise SchemaError(f"breaker {name!r}: {exc}", key=key) from None
    return CircuitBreaker(name, redis=client, config=config, prefix=app.prefix)


def _act(app: App, name: str, reason: str, actor: str, as_json: bool,
         action: Callable[[CircuitBreaker, str, str], Any], verb: str) -> None:
    breaker = stored_breaker(app, name)
    state = action(breaker, reason, actor)
    result = {"name": name, "action": verb, "state": str(state), "reason": reason,
              "actor": actor}
    if as_json:
        emit_json(result, lines=True)
    else:
        click.echo(f"{name}: {verb} -> {state}  (by {actor}: {reason})")


def _action_command(command: str, verb: str,
                    action: Callable[[CircuitBreaker, str, str], Any], doc: str) -> None:
    @cli.command(command, help=doc)
    @click.argument("name", callback=check_name)
    @click.option("--reason", required=True, help="Why (recorded in the history).")
    @click.option("--actor", default=default_actor, show_default="user@host",
                  help="Who (recorded in the history).")
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
    @click.pass_obj
    def run(app: App, name: str, reason: str, actor: str, as_json: bool) -> None:
        _act(app, name, reason, actor, as_json, action, verb)


_action_command("open", "forced open", lambda b, r, a: b.transition_to_forced_open(r, a),
                "Hold NAME FORCED_OPEN: every call is rejected until `close` or `reset`.")
_action_command("trip", "tripped", lambda b, r, a: b.trip(r, a),
                "Trip NAME to a normal OPEN: probes start after the open wait.")
_action_command("disable", "disabled", lambda b, r, a: b.transition_to_disabled(r, a),
                "Set NAME DISABLED: every call passes, nothing is recorded.")
_action_command("metrics-only", "metrics only",
                lambda b, r, a: b.transition_to_metrics_only(r, a),
                "Set NAME METRICS_ONLY: every call passes, outcomes are still recorded.")
_action_command("close", "closed", lambda b, r, a: b.transition_to_closed(r, a),
                "Move NAME to CLOSED (leaves FORCED_OPEN, DISABLED, METRICS_ONLY, OPEN).")


@cli.command("reset")
@click.argument("name", required=False, callback=check_name)
@click.option("--all", "every", is_flag=True, help="Reset every breaker under the prefix.")
@click.option("--yes", is_flag=True, help="Confirm --all.")
@click.option("--reason", required=True, help="Why (recorded in the history).")
@click.option("--actor", default=default_actor, show_default="user@host",
              help="Who (recorded in the history).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def reset_command(app: App, name: str | None, every: bool, yes: bool, reason: str,
                  actor: str, as_json: bool) -> None:
    """Back to CLOSED with an empty window (NAME, or every breaker with --all --yes)."""
    if every == (name is not None):
        raise click.UsageError("give either NAME or --all")
    if not every:
        _act(app, name or "", reason, actor, as_json, lambda b, r, a: b.reset(r, a), "reset")
        return
    if not yes:
        raise click.UsageError("reset --all resets every breaker under the prefix "
                               f"{app.prefix!r}; add --yes to confirm")
    found = view.scan_names(app.client, app.prefix)
    names = sorted(n for n, parts in found.items() if "breaker" in parts)
    done = 0
    for n in names:
        try:
            _act(app, n, reason, actor, as_json, lambda b, r, a: b.reset(r, a), "reset")
        except NotFound:  # only history left, or expired between the scan and the reset
            continue
        done += 1
    if not as_json:
        click.echo(f"reset {done} breaker(s)", err=True)


@cli.command("release-stale")
@click.argument("name", callback=check_name)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def release_stale_command(app: App, name: str, as_json: bool) -> None:
    """Reap NAME's expired bulkhead leases now (one bulkhead script call).

    Workers reap them on every bulkhead call anyway; this frees the permits of
    SIGKILLed holders on an idle bulkhead and wakes waiters at once.
    """
    from ..bulkhead.config import BulkheadConfig
    from ..bulkhead.core import BulkheadCodec
    from ..bulkhead.core import decode_reply as decode_bulkhead_reply

    client = app.client
    keys = BulkheadKeys.build(name, app.prefix)
    for key, kind in ((keys.leases, "zset"), (keys.meta, "hash"), (keys.notify, "list")):
        found = view.text(client.type(key))
        if found not in ("none", kind):
            raise SchemaError(f"key {key} holds a {found}, expected a {kind}", key=key)
    limit_raw = client.hget(keys.meta, "limit")
    try:
        limit = int(view.text(limit_raw)) if limit_raw is not None else 0
    except ValueError:
        raise SchemaError(f"key {keys.meta} field limit is not a number", key=keys.meta) from None
    if limit < 1:
        raise NotFound(f"unknown bulkhead {name!r} under prefix {app.prefix!r}")
    before = int(client.zcard(keys.leases))
    ttl_ms = max(int(client.pttl(keys.meta)), int(client.pttl(keys.leases)))
    # The metrics op reaps expired leases; it must carry the stored limit (it
    # sizes the waiters' wake-ups) and the keys' remaining TTL (it refreshes them).
    config = BulkheadConfig(max_concurrent_calls=limit, lease=0.01,
                            key_ttl=max(0.01, ttl_ms / 1000) if ttl_ms > 0 else 3600.0)
    call = BulkheadCodec(name, config, app.prefix).metrics_call()
    reply = decode_bulkhead_reply(run_script(client, load_script("bulkhead"), call.keys,
                                             call.args))
    in_use = reply.in_use
    result = {"name": name, "action": "release-stale", "released": max(0, before - in_use),
              "in_use": in_use, "limit": reply.limit, "waiting": reply.waiting}
    if as_json:
        emit_json(result, lines=True)
    else:
        click.echo(f"{name}: released {result['released']} expired lease(s); "
                   f"{in_use}/{result['limit']} in use, {result['waiting']} waiting")
