"""Operator action commands: open, trip, disable, metrics-only, close, reset, release-stale.

The actions themselves are in `operate` (one script call each, shared with the
dashboard); this module parses options and prints results.
"""

from __future__ import annotations

import os
from typing import Any

import click

from .. import operate
from .. import readside as view
from .._runtime.keys import BulkheadKeys
from .._runtime.options import to_seconds
from .._runtime.scripts import load_script, run_script
from ..errors import SchemaError
from .app import (
    App,
    Failure,
    NotFound,
    check_name,
    cli,
    default_actor,
    default_reason,
    emit_json,
)
from .fmt import clock, coloured, printable


def run_action(app: App, name: str, action: operate.Action, reason: str | None, actor: str,
               as_json: bool, create: bool = False, adopt_drift: bool = False,
               for_: float | None = None, until: float | None = None) -> None:
    """Run one action and print its result line; unknown names become NotFound."""
    why = reason or default_reason(action.command)
    try:
        result = operate.act(app.client, app.prefix, name, action, why, actor,
                             create=create, adopt_drift=adopt_drift, for_=for_, until=until)
    except operate.UnknownBreaker as exc:
        raise NotFound(f"unknown breaker {name!r} under prefix {app.prefix!r}"
                       + did_you_mean(exc.suggestions)
                       + (" (or give --create to store a new breaker under this name)"
                          if action.creates else "")) from None
    except operate.OnlyV1 as exc:
        raise NotFound(str(exc) + (" (or give --create to store a new v2 breaker, which "
                                   "only v2 workers obey)" if action.creates else "")) from None
    except operate.NoDrift as exc:
        raise NotFound(str(exc)) from None
    except ValueError as exc:  # e.g. an override that would end in the past
        raise click.UsageError(str(exc)) from None
    if as_json:
        emit_json(result, lines=True)
        return
    click.echo(result_text(result))
    if result["created"]:
        click.echo(f"note: {name!r} had no keys: stored the new state with no config; the "
                   "first worker's call stores its own", err=True)
    if operate.has_v1_breaker(app.client, app.prefix, name):
        click.echo(f"note: {name!r} also has key schema v1 keys: workers not yet upgraded "
                   "keep their own state and did not see this action (docs/OPERATIONS.md, "
                   "Rolling deploy)", err=True)


def did_you_mean(names: list[str]) -> str:
    return "" if not names else "; did you mean " + " or ".join(repr(n) for n in names) + "?"


def result_text(r: dict[str, Any]) -> str:
    """'payments: OPEN -> CLOSED  (closed by dana@box at 14:03:05 CET: deploy fixed it)'."""
    by = f"by {r['actor']}" if r["actor"] else "by an unnamed operator"
    when = f" at {clock(r['at_ms'], date=False)}" if r["at_ms"] else ""
    change = r.get("change")
    state = coloured(r["state"])
    until = clock(r["until_ms"]) if r.get("until_ms") else ""
    if change == "transition":
        head = f"{coloured(r['previous'])} -> {state}"
    elif change is None:
        head = f"already {state}, nothing changed (nothing recorded)"
    else:
        head = state + ", " + {
            "restarted": "OPEN wait restarted",
            "extended": f"override extended to {until}",
            "shortened": f"override shortened to {until}",
            "indefinite": "override now indefinite (no end)",
            "released": "hold released (its state machine runs again)",
            "timed": f"override now ends at {until}",
            "reset": "reset (window emptied, hold and drift record cleared)",
        }.get(change, change)
    lines = [f"{r['name']}: {head}  ({r['action']} {by}{when}: {r['reason']})"]
    if r.get("until_ms"):
        lines.append(f"  until {clock(r['until_ms'])}, then "
                     + ("half-open probes" if r["state"] in ("FORCED_OPEN", "OPEN")
                        else "the state machine (CLOSED)" if r["state"] != "CLOSED"
                        else "it may trip again"))
    if r["adopted"]:
        lines.append("  stored config now the drifting worker's: " + ", ".join(
            f"{a['field']} {a['was']} -> {a['now']}" for a in r["adopted"]))
    elif r["drift_cleared"]:
        lines.append("  config drift record cleared; the stored config still governs "
                     "(--adopt-drift stores the drifting worker's instead)")
    return "\n".join(lines)


_REASON = click.option("--reason", help="Why (recorded in the history; default: which "
                       "command, from the CLI).")
_ACTOR = click.option("--actor", default=default_actor, show_default="user@host",
                      help="Who (recorded in the history).")
_JSON = click.option("--json", "as_json", is_flag=True, help="Machine-readable output "
                     "(docs/CLI_JSON.md).")


def parse_duration(text: str) -> float:
    """--for: '30m', '1h30m', '90s', '1.5h', '45' (seconds), 'PT30M' as seconds (> 0), by
    the library's one duration parser; ValueError otherwise."""
    return to_seconds(text, "--for", positive=True)


def parse_until(text: str) -> float:
    """An ISO 8601 time ('2026-12-01T14:00', '14:00' today; local time zone unless given)
    as epoch seconds."""
    import datetime as dt

    try:
        if len(text) <= 8 and ":" in text:
            when = dt.datetime.combine(dt.date.today(), dt.time.fromisoformat(text))
        else:
            when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a time: {text!r} (e.g. 2026-12-01T14:00+01:00 or 14:00)") \
            from None
    if when.tzinfo is None:
        when = when.astimezone()
    return when.timestamp()


def _hold_options(run: Any) -> Any:
    run = click.option("--until", "until_text", metavar="TIME",
                       help="End the override at TIME (ISO 8601, local zone unless given).")(run)
    return click.option("--for", "for_text", metavar="DURATION",
                        help="End the override after DURATION (30m, 1h30m, 90s, 250ms, "
                        "PT30M), by Redis server time.")(run)


def _hold(for_text: str | None, until_text: str | None) -> dict[str, float | None]:
    if for_text and until_text:
        raise click.UsageError("give --for or --until, not both")
    try:
        return {"for_": parse_duration(for_text) if for_text else None,
                "until": parse_until(until_text) if until_text else None}
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


#: A selector matching more names than this asks before acting (`--yes` skips the
#: question; `--confirm-over` or $DISTBREAKER_CONFIRM_OVER moves the threshold).
CONFIRM_OVER = 10


def confirm_over_default() -> int:
    try:
        return max(0, int(os.environ.get("DISTBREAKER_CONFIRM_OVER", CONFIRM_OVER)))
    except ValueError:
        return CONFIRM_OVER


def _selector_options(run: Any) -> Any:
    run = click.option("--exact", is_flag=True, help="NAME is one name even when it holds "
                       "* ? or [ (no selector).")(run)
    run = click.option("--confirm-over", type=click.IntRange(0), default=confirm_over_default,
                       show_default="10, or $DISTBREAKER_CONFIRM_OVER", help="A selector "
                       "matching more names than this asks first.")(run)
    run = click.option("--yes", is_flag=True, help="Act on every name a selector matches "
                       "without asking.")(run)
    return click.option("--dry-run", is_flag=True, help="Only show what a selector would "
                        "change (each name's state now and after); change nothing.")(run)


def run_selector(app: App, pattern: str, action: operate.Action, reason: str | None,
                 actor: str, as_json: bool, *, dry_run: bool, yes: bool, confirm_over: int,
                 for_: float | None = None, until: float | None = None) -> None:
    """An action on every breaker whose name the glob `pattern` matches: `--dry-run`
    shows what would change; more than `confirm_over` names ask first unless `yes`; each
    name is recorded with the reason and actor as a single action is."""
    names = operate.selected(app.client, app.prefix, [pattern])
    if not names:
        raise NotFound(f"no breaker under prefix {app.prefix!r} matches {pattern!r}")
    if dry_run:
        plans = operate.plan_many(app.client, app.prefix, names, action,
                                  held=for_ is not None or until is not None)
        for plan in plans:
            if as_json:
                emit_json(plan, lines=True)
            else:
                click.echo(plan_text(plan))
        changing = sum(1 for p in plans if p["would_change"])
        if not as_json:
            click.echo(f"dry run: {action.command} would change {changing} of "
                       f"{len(names)} breaker(s) matching {pattern!r}; nothing was changed",
                       err=True)
        return
    confirm_many(action.command, "breakers", names, pattern, yes, confirm_over)
    why = reason or default_reason(f"{action.command} {pattern}")
    try:
        results = operate.act_many(app.client, app.prefix, names, action, why, actor,
                                   for_=for_, until=until)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    failed = [r for r in results if r.get("error")]
    for r in results:
        if as_json:
            emit_json(r, lines=True)
        elif r.get("error"):
            click.echo(f"{printable(r['name'])}: not changed: {printable(r['error'])}",
                       err=True)
        else:
            click.echo(result_text(r))
    if not as_json:
        changed = sum(1 for r in results if r.get("changed"))
        click.echo(f"{action.command}: {changed} of {len(names)} breaker(s) matching "
                   f"{pattern!r} changed" + (f"; {len(failed)} could not be acted on"
                                             if failed else ""), err=True)
    if failed:
        raise click.exceptions.Exit(1)


def confirm_many(command: str, what: str, names: list[str], pattern: str, yes: bool,
                 confirm_over: int) -> None:
    """Ask on stderr before acting on more than `confirm_over` names (unless `yes`);
    anything but yes (no terminal and no input included) raises Failure: nothing
    changed."""
    if len(names) <= confirm_over or yes:
        return
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    try:
        agreed = click.confirm(f"{command} {len(names)} {what} matching {pattern!r} "
                               f"({shown})?", err=True)
    except click.Abort:
        agreed = False
    if not agreed:
        raise Failure(f"not confirmed: nothing changed ({len(names)} names match "
                      f"{pattern!r}; --dry-run shows them, --yes acts without asking)")


def plan_text(p: dict[str, Any]) -> str:
    """'llm:a: OPEN -> FORCED_OPEN (would change)' for `--dry-run`."""
    if p["error"]:
        return f"{printable(p['name'])}: {printable(p['error'])}"
    if p["would_change"]:
        return (f"{printable(p['name'])}: {coloured(p['state'])} -> {coloured(p['target'])}"
                "  (would change)")
    return f"{printable(p['name'])}: {coloured(p['state'])}  (unchanged)"


SELECTOR_HELP = ("\n\nA NAME with * ? or [ ('llm:*', 'tenant:?7') is a selector: every "
                 "matching breaker, each recorded with the reason and actor; --dry-run "
                 "shows what would change; over --confirm-over matches it asks first.")


def _action_command(action: operate.Action) -> None:
    def run(app: App, name: str, reason: str | None, actor: str, as_json: bool,
            dry_run: bool, yes: bool, confirm_over: int, exact: bool,
            create: bool = False, for_text: str | None = None,
            until_text: str | None = None) -> None:
        hold = _hold(for_text, until_text)
        if view.is_selector(name) and not exact:
            if create:
                raise click.UsageError("--create does not apply to a selector (NAME with "
                                       "* ? or [); --exact makes NAME one name")
            run_selector(app, name, action, reason, actor, as_json, dry_run=dry_run,
                         yes=yes, confirm_over=confirm_over, **hold)
            return
        if dry_run:
            raise click.UsageError("--dry-run applies to a selector (NAME with * ? or [)")
        run_action(app, name, action, reason, actor, as_json, create=create, **hold)

    run = click.pass_obj(_JSON(_ACTOR(_REASON(_hold_options(_selector_options(run))))))
    if action.creates:
        run = click.option("--create", is_flag=True, help="Store a new breaker even when "
                           "an existing name is close to NAME (a typo guard).")(run)
    click.argument("name", callback=check_name)(run)
    cli.command(action.command, help=action.help + SELECTOR_HELP)(run)


for _action in operate.ACTIONS.values():
    if _action.id != "reset":
        _action_command(_action)


@cli.command("reset")
@click.argument("name", required=False, callback=check_name)
@click.option("--all", "every", is_flag=True, help="Reset every breaker under the prefix.")
@click.option("--yes", is_flag=True, help="Confirm --all; act on every name a selector "
              "matches without asking.")
@click.option("--dry-run", is_flag=True, help="Only show what a selector would change.")
@click.option("--confirm-over", type=click.IntRange(0), default=confirm_over_default,
              show_default="10, or $DISTBREAKER_CONFIRM_OVER",
              help="A selector matching more names than this asks first.")
@click.option("--exact", is_flag=True, help="NAME is one name even when it holds * ? or [.")
@click.option("--adopt-drift", is_flag=True, help="Store the config a drifting worker "
              "reported (see `show`) instead of keeping the stored one.")
@_REASON
@_ACTOR
@_JSON
@click.pass_obj
def reset_command(app: App, name: str | None, every: bool, yes: bool, dry_run: bool,
                  confirm_over: int, exact: bool, adopt_drift: bool,
                  reason: str | None, actor: str, as_json: bool) -> None:
    """Back to CLOSED with an empty window and no recorded config drift (NAME, every
    breaker a selector such as 'tenant:*' matches, or every breaker with --all --yes)."""
    action = operate.ACTIONS["reset"]
    if every == (name is not None):
        raise click.UsageError("give either NAME or --all")
    if name is not None and view.is_selector(name) and not exact:
        if adopt_drift:
            raise click.UsageError("--adopt-drift applies to one NAME, not a selector")
        run_selector(app, name, action, reason, actor, as_json, dry_run=dry_run, yes=yes,
                     confirm_over=confirm_over)
        return
    if dry_run:
        raise click.UsageError("--dry-run applies to a selector (NAME with * ? or [)")
    if not every:
        run_action(app, name or "", action, reason, actor, as_json, adopt_drift=adopt_drift)
        return
    if adopt_drift:
        raise click.UsageError("--adopt-drift applies to one NAME, not --all")
    if not yes:
        raise click.UsageError("reset --all resets every breaker under the prefix "
                               f"{app.prefix!r}; add --yes to confirm")
    done = 0
    refused = foreign_breakers(app)
    names = [n for n in operate.breaker_names(app.client, app.prefix) if n not in refused]
    # pipelined (3 round trips per 500 names); a name with only history left, or expired
    # since the scan, is skipped; one that became foreign since it was read is refused
    for r in operate.act_many(app.client, app.prefix, names, action,
                              reason or default_reason(action.command), actor):
        if r.get("error"):
            refused[r["name"]] = r["error"]
            continue
        if as_json:
            emit_json(r, lines=True)
        else:
            click.echo(result_text(r))
        done += 1
    for n, error in sorted(refused.items()):
        if as_json:
            emit_json({"name": n, "action": action.id, "error": error}, lines=True)
        else:
            click.echo(f"{printable(n)}: not reset: {printable(error)}", err=True)
    if not as_json:
        click.echo(f"reset {done} breaker(s)" + (f"; {len(refused)} name(s) under the prefix "
                   "hold foreign keys and were left as they are" if refused else ""), err=True)
    if refused:
        raise click.exceptions.Exit(1)


def foreign_breakers(app: App) -> dict[str, str]:
    """Names under the prefix whose breaker keys `reset --all` must not touch, with why:
    name parts that are not valid names, and breakers whose keys hold foreign data."""
    found = view.scan(app.client, app.prefix)
    breakers = {n: {"breaker"} for n, parts in found.names.items() if "breaker" in parts}
    refused = {r["name"]: r["error"]
               for r in view.read_summaries(app.client, app.prefix, breakers) if r["error"]}
    refused.update((n, view.invalid_row(n, keys)["error"]) for n, keys in found.invalid.items()
                   if any(_component(k, app.prefix) == "breaker" for k in keys))
    return refused


def _component(key: str, prefix: str) -> str | None:
    parsed = view.name_from_key(key, prefix)
    return None if parsed is None else parsed[1]


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
        known = [n for n, parts in view.scan_names(client, app.prefix).items()
                 if "bulkhead" in parts]
        raise NotFound(f"unknown bulkhead {name!r} under prefix {app.prefix!r}"
                       + did_you_mean(operate.close_names(name, known)))
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


@cli.group("config")
def config_group() -> None:
    """A breaker's config in a rollout (docs/OPERATIONS.md, "Changing a breaker's config")."""


@config_group.command("adopt")
@click.argument("name", callback=check_name)
@click.option("--fingerprint", help="The deployed config to adopt (as `show` lists them); "
              "default: the newest deployed config that is not in force.")
@_REASON
@_ACTOR
@_JSON
@click.pass_obj
def config_adopt_command(app: App, name: str, fingerprint: str | None, reason: str | None,
                         actor: str, as_json: bool) -> None:
    """Put a deployed config in force now, keeping the state and (unless the window's type
    or size changes) the window; it then counts as the newest deployment."""
    try:
        result = operate.adopt_config(app.client, app.prefix, name,
                                      reason or default_reason("config adopt"), actor,
                                      fingerprint)
    except operate.UnknownBreaker as exc:
        raise NotFound(f"unknown breaker {name!r} under prefix {app.prefix!r}"
                       + did_you_mean(exc.suggestions)) from None
    except operate.NoConfigToAdopt as exc:
        raise NotFound(str(exc)) from None
    if as_json:
        emit_json(result, lines=True)
        return
    changed = ", ".join(f"{c['field']} {c['was']} -> {c['now']}" for c in result["changed"])
    click.echo(f"{name}: config {result['fingerprint']} in force "
               f"({result['workers']} workers run it), state {coloured(result['state'])} kept, "
               + ("window kept" if result["window_kept"] else "new window (its shape changed)")
               + (f": {changed}" if changed else ""))
