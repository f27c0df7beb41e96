"""`distbreaker pool ...`: list pools, show one member by member, eject and uneject members.

Reads go through `readside_pool` (no script, nothing written); eject and uneject are one
``lua/pool.lua`` call each, recorded in the pool's history with the actor.
"""

from __future__ import annotations

import time
from typing import Any

import click

from .._runtime.options import to_seconds
from ..readside_pool import (
    act_on_member,
    pool_row,
    pool_summary,
    read_pool,
    read_pool_history,
    scan_pools,
)
from .app import App, NotFound, cli, default_actor, emit_json
from .fmt import duration


@cli.group("pool")
def pool() -> None:
    """Pools: members sharing one health record each, fleet-wide outlier ejection."""


def _status(app: App, name: str) -> Any:
    status = read_pool(app.client, app.prefix, name)
    if status is None:
        raise NotFound(f"no pool {name!r} under prefix {app.prefix!r}")
    return status


@pool.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def pool_ls(ctx: click.Context, as_json: bool) -> None:
    """Every pool: members, ejected, probing, calls in flight, panic."""
    app: App = ctx.find_object(App)
    rows = []
    for name in scan_pools(app.client, app.prefix):
        status = read_pool(app.client, app.prefix, name)
        if status is not None:
            rows.append(pool_summary(status))
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo(f"no pools under prefix {app.prefix!r}")
        return
    click.echo(f"{'POOL':30} {'MEMBERS':>7} {'EJECTED':>7} {'PROBING':>7} {'FLIGHT':>6}  EJECTED")
    for row in rows:
        panic = "  PANIC" if row["panic"] else ""
        click.echo(f"{row['pool']:30} {row['members']:>7} {row['ejected']:>7} "
                   f"{row['probing']:>7} {row['in_flight']:>6}  "
                   f"{', '.join(row['ejected_members']) or '-'}{panic}")


@pool.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--events", "events", default=10, show_default=True,
              help="How many of the pool's last events to show.")
@click.pass_context
def pool_show(ctx: click.Context, name: str, as_json: bool, events: int) -> None:
    """One pool, member by member: state, why, for how long, in flight, success rate,
    latency; then its last events."""
    app: App = ctx.find_object(App)
    status = _status(app, name)
    history = read_pool_history(app.client, app.prefix, name, events) if events > 0 else []
    if as_json:
        emit_json({**pool_row(status), "events": history})
        return
    threshold = (f", latency threshold {duration(status.latency_threshold)}"
                 if status.latency_threshold else "")
    click.echo(f"pool {name}: {len(status.members)} members, {status.ejected} ejected"
               + threshold + ("  PANIC (too few healthy: picks go to every member)"
                              if status.panic else ""))
    click.echo(f"{'MEMBER':30} {'STATE':9} {'WHY':30} {'FOR':>8} {'FLIGHT':>6} "
               f"{'SUCCESS':>7} {'LATENCY':>8} {'EJECTIONS':>9}")
    for m in status.members:
        left = duration(m.ejected_until - status.read_at) if m.ejected_until else "-"
        latency = duration(m.mean_latency) if m.mean_latency is not None else "-"
        why = m.why if (m.state != "healthy" or m.override) else ""
        if m.capped and not m.ejected:
            why = f"capped: {m.why}"
        click.echo(f"{m.member:30} {m.state:9} {why or '-':30} {left:>8} {m.in_flight:>6} "
                   f"{_rate(m.success_rate):>7} {latency:>8} {m.ejections:>9}")
    if history:
        click.echo("\nlast events:")
        for e in history:
            when = time.strftime("%H:%M:%S", time.localtime(int(e["id"].split("-")[0]) / 1000))
            until = (f" until {time.strftime('%H:%M:%S', time.localtime(e['until']))}"
                     if e["until"] and e["event"] == "ejected" else "")
            actor = f" by {e['actor']}" if e["actor"] else ""
            why = f" ({e['why']})" if e["why"] and e["event"] in ("ejected", "capped") else ""
            click.echo(f"  {when} {e['member']} {e['event']}{why}{until}{actor}")


def _seconds(for_text: str | None) -> float | None:
    try:
        return to_seconds(for_text, "--for", positive=True) if for_text else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--for") from None


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _report(change: Any, name: str) -> None:
    if not change.state:
        raise NotFound(f"pool {name!r} has no member {change.member!r}")
    until = (f" until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(change.ejected_until))}"
             if change.ejected_until else "")
    click.echo(f"{name} {change.member}: {change.state}{until}")


@pool.command("uneject")
@click.argument("name")
@click.argument("member")
@click.option("--actor", default=None, help="Who acts (default user@host).")
@click.pass_context
def pool_uneject(ctx: click.Context, name: str, member: str, actor: str | None) -> None:
    """Put MEMBER back at once, healthy, its ejection count forgotten (no probes)."""
    app: App = ctx.find_object(App)
    _status(app, name)
    _report(act_on_member(app.client, app.prefix, name, "uneject", member,
                          actor=actor or default_actor()), name)


@pool.command("eject")
@click.argument("name")
@click.argument("member")
@click.option("--for", "for_text", metavar="DURATION",
              help="End the ejection after DURATION (30m, 1h30m, 90s); default: until uneject.")
@click.option("--actor", default=None, help="Who acts (default user@host).")
@click.pass_context
def pool_eject(ctx: click.Context, name: str, member: str, for_text: str | None,
               actor: str | None) -> None:
    """Eject MEMBER fleet-wide (not bound by max_ejection_percent); it comes back through
    probes when the time ends."""
    app: App = ctx.find_object(App)
    seconds = _seconds(for_text)
    _status(app, name)
    _report(act_on_member(app.client, app.prefix, name, "eject", member, seconds,
                          actor=actor or default_actor()), name)


@pool.command("exempt")
@click.argument("name")
@click.argument("member")
@click.option("--for", "for_text", metavar="DURATION",
              help="End the exemption after DURATION (30m, 1h30m, 90s); default: until "
              "uneject.")
@click.option("--actor", default=None, help="Who acts (default user@host).")
@click.pass_context
def pool_exempt(ctx: click.Context, name: str, member: str, for_text: str | None,
                actor: str | None) -> None:
    """Put MEMBER back and never eject it by the rules (for DURATION, or until `pool
    uneject`); an operator's eject still works."""
    app: App = ctx.find_object(App)
    seconds = _seconds(for_text)
    _status(app, name)
    _report(act_on_member(app.client, app.prefix, name, "exempt", member, seconds,
                          actor=actor or default_actor()), name)
