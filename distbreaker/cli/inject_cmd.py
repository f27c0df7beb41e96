"""inject: fleet-wide fault injection that ends by itself (docs/guides/fault_injection.md)."""

from __future__ import annotations

from typing import Any

import click

from .. import inject as faults
from .._runtime.faults import parse_rate
from .._runtime.options import to_seconds
from .app import App, Failure, cli, default_actor, default_reason, emit_json
from .fmt import clock, duration, printable

_EPILOG = """\b
Examples:
  distbreaker inject payments --error 503 --rate 5% --for 10m --reason "game day"
  distbreaker inject 'llm:*' --latency 200ms --rate 20% --for 15m
  distbreaker inject payments --reject --for 2m          (as if OPEN)
  distbreaker inject --list          distbreaker inject --off payments [--kind error]
  distbreaker inject --off-all       distbreaker inject --history

Only workers whose breaker config says allow_fault_injection: true obey (never on by
default); an injection no running worker allows is refused. Injected errors raise
InjectedFault (counted by the breaker as failures), injected rejections raise
InjectedRejection (a CallNotPermitted); both are marked in events and metrics."""


def _rate(text: str | None) -> float:
    try:
        return 1.0 if text is None else parse_rate(text)
    except ValueError as exc:
        raise click.UsageError(f"--rate: {exc}") from None


def _seconds(text: str, option: str) -> float:
    try:
        return to_seconds(text, option, positive=True)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _fault_line(fault: Any, now_ms: int) -> str:
    left = duration(max(0, fault.until_ms - now_ms) / 1000)
    return f"{printable(fault.describe())}  ends {clock(fault.until_ms)} (in {left})"


@cli.command("inject", epilog=_EPILOG)
@click.argument("selector", required=False)
@click.option("--error", "status", type=int, metavar="STATUS",
              help="Raise InjectedFault carrying this HTTP status instead of the call.")
@click.option("--latency", "latency_text", metavar="DURATION",
              help="Sleep this long before the call (200ms, 1.5s).")
@click.option("--reject", is_flag=True, help="Reject the call as if the breaker were OPEN.")
@click.option("--rate", "rate_text", metavar="RATE",
              help="Share of calls affected: 5% or 0.05 (default 100%).")
@click.option("--for", "for_text", metavar="DURATION",
              help="How long the injection lasts (required: 10m, 1h; at most 7 days).")
@click.option("--off", "off", is_flag=True, help="End SELECTOR's injections (of --kind "
              "only, if given).")
@click.option("--kind", type=click.Choice(["error", "latency", "reject"]),
              help="With --off: end only this kind of injection.")
@click.option("--off-all", is_flag=True, help="The master switch: end every injection.")
@click.option("--list", "list_", is_flag=True, help="The injections in force and the names "
              "whose workers allow injection.")
@click.option("--history", is_flag=True, help="The injection log (set / off, actor, reason).")
@click.option("--allow-absent", is_flag=True, help="Store the injection even when no running "
              "worker allows it yet (it applies to workers that start while it lasts).")
@click.option("--reason", help="Why (recorded in the injection log and shown by workers).")
@click.option("--actor", default=default_actor, show_default="user@host",
              help="Who (recorded in the injection log).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def inject_command(app: App, selector: str | None, status: int | None,
                   latency_text: str | None, reject: bool, rate_text: str | None,
                   for_text: str | None, off: bool, kind: str | None, off_all: bool,
                   list_: bool, history: bool, allow_absent: bool, reason: str | None,
                   actor: str, as_json: bool) -> None:
    """Inject errors, latency or rejections into every allowing worker of SELECTOR (a
    name or a glob: 'llm:*'), for a bounded time."""
    kinds = [k for k, on in (("error", status is not None), ("latency", bool(latency_text)),
                             ("reject", reject)) if on]
    modes = [m for m, on in (("--off", off), ("--off-all", off_all), ("--list", list_),
                             ("--history", history)) if on]
    if len(modes) > 1:
        raise click.UsageError(f"give one of {', '.join(modes)}")
    why = reason or default_reason("inject")
    if list_:
        return _list(app, as_json)
    if history:
        entries = faults.log(app.client, app.prefix)
        if as_json:
            return emit_json(entries)
        for e in entries:
            click.echo(f"{clock(e['at_ms'])}  {e.get('op', '?'):3}  "
                       f"{printable(e.get('selector', ''))}  {e.get('kind', '')}  "
                       f"by {printable(e.get('actor', ''))}: {printable(e.get('reason', ''))}")
        return None
    if off_all or off:
        if off and not selector:
            raise click.UsageError("--off needs a SELECTOR (or use --off-all)")
        if kinds:
            raise click.UsageError("--off ends injections: give --kind KIND to end one kind")
        try:
            ended = faults.stop(app.client, app.prefix, None if off_all else selector,
                                kind, actor=actor, reason=why)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        if as_json:
            return emit_json({"ended": ended}, lines=True)
        click.echo(f"ended {ended} injection{'s' if ended != 1 else ''}")
        return None
    if not selector:
        raise click.UsageError("give a SELECTOR (a name or a glob such as 'llm:*'), or one "
                               "of --list, --off-all, --history")
    if len(kinds) != 1:
        raise click.UsageError("give exactly one of --error STATUS, --latency DURATION, "
                               "--reject")
    if not for_text:
        raise click.UsageError("give --for DURATION: an injection always ends by itself")
    try:
        result = faults.inject(
            app.client, app.prefix, selector, kinds[0], rate=_rate(rate_text), status=status,
            latency=_seconds(latency_text, "--latency") if latency_text else None,
            for_=_seconds(for_text, "--for"), actor=actor, reason=why,
            require_allowed=not allow_absent)
    except faults.NotAllowed as exc:
        raise Failure(str(exc)) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        return emit_json(result, lines=True)
    names = result["names"]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    click.echo(f"injecting {kinds[0]} into {printable(selector)} at {result['rate']:.4g} "
               f"until {clock(result['until_ms'])}"
               + (f"; workers allowing it: {printable(shown)}" if names else
                  "; no running worker allows it yet"))
    return None


def _list(app: App, as_json: bool) -> None:
    now_ms, found, allowed = faults.in_force(app.client, app.prefix)
    if as_json:
        emit_json({"now_ms": now_ms, "injections": [f.as_dict(now_ms) for f in found],
                   "allowing": sorted(allowed)})
        return
    if not found:
        click.echo("no injection in force")
    for fault in found:
        click.echo(_fault_line(fault, now_ms))
    click.echo(f"names whose workers allow injection: {len(allowed)}"
               + (": " + printable(", ".join(sorted(allowed)[:20])) if allowed else ""))
