"""`distbreaker record start|stop|status|export`: outcome recording of one breaker.

The switch and the stream are in `recording.control` (docs/KEY_SCHEMA.md, "Outcome
recording"); this module parses options and prints.
"""

from __future__ import annotations

import sys

import click

from .._runtime.options import to_seconds
from ..breaker.sampling import parse_rate
from ..recording import control
from ..recording.timeline import write_jsonl
from .app import App, Failure, check_name, cli, default_actor, emit_json
from .fmt import clock


@cli.group("record")
def record_group() -> None:
    """Outcome recording: sample a breaker's outcomes into a capped stream, export them
    as JSONL for `distbreaker replay` (docs/guides/tuning.md)."""


def _seconds(text: str, option: str) -> float:
    try:
        return to_seconds(text, option, positive=True)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@record_group.command("start")
@click.argument("name", callback=check_name)
@click.option("--rate", default="10%", show_default=True,
              help="Share of the record calls sampled: 10%, 0.1.")
@click.option("--for", "for_text", default="1h", show_default=True, metavar="DURATION",
              help="Stop by itself after DURATION (30m, 1h, PT2H), by Redis server time.")
@click.option("--max", "max_samples", type=int, default=10_000, show_default=True,
              help="Cap of the stream (entries; MAXLEN ~: Redis trims whole nodes).")
@click.option("--ttl", "ttl_text", default="24h", show_default=True, metavar="DURATION",
              help="The samples expire this long after the last one.")
@click.option("--actor", default=default_actor, show_default="user@host")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def record_start(app: App, name: str, rate: str, for_text: str, max_samples: int,
                 ttl_text: str, actor: str, as_json: bool) -> None:
    """Turn recording on for NAME; every worker follows at its next hello (about 20 s)."""
    try:
        fraction = parse_rate(rate, "--rate")
        for_s, ttl_s = _seconds(for_text, "--for"), _seconds(ttl_text, "--ttl")
        control.check_start(fraction, for_s, max_samples, ttl_s)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    until = control.start(app.client, name, fraction, for_s, max_samples=max_samples,
                          ttl_s=ttl_s, actor=actor, prefix=app.prefix)
    if as_json:
        emit_json({"name": name, "rate": fraction, "until_ms": until}, lines=True)
        return
    click.echo(f"{name}: recording {fraction:.2%} of outcomes until {clock(until)} "
               f"(workers follow within about 20 s)")
    if not control.breaker_exists(app.client, name, app.prefix):
        click.echo(f"note: no breaker {name!r} under prefix {app.prefix!r} yet: the switch "
                   "applies to workers that start using it", err=True)


@record_group.command("stop")
@click.argument("name", callback=check_name)
@click.pass_obj
def record_stop(app: App, name: str) -> None:
    """Turn the operator's recording switch off (the samples stay until their TTL)."""
    was_on = control.stop(app.client, name, app.prefix)
    click.echo(f"{name}: recording switch " + ("off" if was_on else "was not on")
               + " (a config's own record_sample_rate still applies)")


@record_group.command("status")
@click.argument("name", callback=check_name)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def record_status(app: App, name: str, as_json: bool) -> None:
    """The recording switch and how many samples the stream holds."""
    status = control.status(app.client, name, app.prefix)
    if as_json:
        emit_json(status.to_json(), lines=True)
        return
    switch = (f"on at {status.switch_rate:.2%} until {clock(status.switch_until_ms or 0)}"
              f" ({status.switch_actor})" if status.switch_rate is not None else "off")
    ttl = f", expiring in {status.stream_ttl_s:.0f}s" if status.stream_ttl_s else ""
    click.echo(f"{name}: switch {switch}; {status.samples} samples{ttl}")


@record_group.command("export")
@click.argument("name", callback=check_name)
@click.pass_obj
def record_export(app: App, name: str) -> None:
    """The recorded samples as JSONL on stdout, oldest first (docs/guides/tuning.md)."""
    n, skipped = 0, list[str]()
    for line in write_jsonl(control.export(app.client, name, app.prefix, skipped)):
        sys.stdout.write(line)
        n += 1
    sys.stdout.flush()
    if skipped:
        click.echo(f"note: skipped {len(skipped)} entries of the stream that are not samples "
                   f"(foreign data), e.g. {skipped[0]}", err=True)
    if n == 0:
        raise Failure(f"{name}: no recorded samples under prefix {app.prefix!r} "
                      f"(distbreaker record start {name} --rate 10% --for 1h)")


#: The most outcomes `record seed` generates (a timeline is held in memory).
MAX_SEED_CALLS = 10_000_000


@record_group.command("seed")
@click.option("--seconds", type=click.IntRange(1, 7 * 86_400), default=600,
              show_default=True)
@click.option("--rate", "calls_per_second", type=click.IntRange(1, 10_000), default=20,
              show_default=True, help="Calls per second.")
@click.option("--fail-from", type=click.IntRange(0), default=120, show_default=True,
              help="Second the dependency starts failing.")
@click.option("--fail-until", type=click.IntRange(0), default=300, show_default=True,
              help="Second it recovers.")
@click.option("--failure-rate", type=click.FloatRange(0, 1), default=0.9, show_default=True,
              help="Share of calls failing meanwhile (0.02 before and after).")
def record_seed(seconds: int, calls_per_second: int, fail_from: int, fail_until: int,
                failure_rate: float) -> None:
    """A generated timeline (JSONL on stdout): a dependency that fails, then recovers."""
    from ..recording.timeline import seed

    if fail_until < fail_from:
        raise click.UsageError(f"--fail-until ({fail_until}) is before --fail-from "
                               f"({fail_from})")
    if seconds * calls_per_second > MAX_SEED_CALLS:
        raise click.UsageError(f"--seconds x --rate is at most {MAX_SEED_CALLS:,} calls, got "
                               f"{seconds * calls_per_second:,}")

    for line in write_jsonl(seed(seconds, calls_per_second, fail_from, fail_until,
                                 failure_rate)):
        sys.stdout.write(line)
