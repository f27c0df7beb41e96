"""Read-only commands: ls, show, events, watch. All reads go through distbreaker.readside."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

import click

from .. import readside as view
from .._runtime.keys import BreakerKeys, events_channel
from ..breaker.state import State
from .app import App, NotFound, check_name, cli, emit_json

STATE_COLOURS = {"CLOSED": "green", "OPEN": "red", "HALF_OPEN": "yellow",
                 "FORCED_OPEN": "magenta", "DISABLED": "blue", "METRICS_ONLY": "cyan"}
STATE_CHOICES = [s.value.lower() for s in State]


def duration(seconds: float | None) -> str:
    """Compact human duration: 850ms, 42s, 3m04s, 2h05m, 3d04h."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def percent(value: float | None) -> str:
    return "-" if value is None or value < 0 else f"{value:g}%"


def coloured(state: str | None) -> str:
    return click.style(state or "-", fg=STATE_COLOURS.get(state or ""))


def table(headers: Sequence[str], rows: Iterable[Sequence[str]],
          colour_col: int | None = None) -> str:
    """Left-aligned columns; the `colour_col` cell is coloured by state after padding."""
    rows = [list(r) for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=True)]
        if colour_col is not None:
            cells[colour_col] = cells[colour_col].replace(
                r[colour_col], coloured(r[colour_col]), 1)
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# -- ls ------------------------------------------------------------------------------
def collect(app: App, states: Sequence[str] = ()) -> dict[str, Any]:
    """The `ls` document: every name under the prefix, optionally filtered by state."""
    client = app.client
    names = view.scan_names(client, app.prefix)
    rows = list(view.read_summaries(client, app.prefix, {n: names[n] for n in sorted(names)}))
    wanted = {s.upper() for s in states}
    if wanted:
        rows = [r for r in rows if r["state"] in wanted]
    return {"schema": view.JSON_SCHEMA_VERSION, "prefix": app.prefix,
            "server_time_ms": view.server_now_ms(client), "breakers": rows}


def retry_in(breaker: dict[str, Any]) -> str:
    """When a call may next be tried: now, after a wait, or never (FORCED_OPEN)."""
    seconds = breaker.get("retry_in_s")
    if seconds is None:
        return "held open"
    return "now" if seconds <= 0 else duration(seconds)


def ls_rows(doc: dict[str, Any]) -> list[list[str]]:
    out = []
    for r in doc["breakers"]:
        b, bh, rb = r["breaker"] or {}, r["bulkhead"], r["budget"]
        bulk = "-" if bh is None else f"{bh['in_use']}/{bh['limit'] or '?'}"
        budget = ("-" if rb is None or rb["deposits"] is None
                  else f"+{rb['deposits']}/-{rb['withdrawals']}" + (
                      "" if rb.get("balance") is None else f" ={rb['balance']}"))
        if r["error"]:
            out.append([r["name"], "ERROR", r["error"], "", "", "", "", "", ""])
            continue
        out.append([r["name"], r["state"] or "-", duration(b.get("in_state_s")),
                    percent(b.get("failure_rate")), percent(b.get("slow_rate")),
                    str(b.get("calls", "-")),
                    retry_in(b) if b else "-", bulk, budget])
    return out


LS_HEADERS = ["NAME", "STATE", "IN STATE", "FAIL", "SLOW", "CALLS", "RETRY IN", "BULKHEAD",
              "BUDGET"]


@cli.command("ls")
@click.option("--state", "states", multiple=True, type=click.Choice(STATE_CHOICES,
              case_sensitive=False), help="Only breakers in this state (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output "
              "(docs/CLI_JSON.md).")
@click.pass_obj
def ls_command(app: App, states: tuple[str, ...], as_json: bool) -> None:
    """List every breaker, bulkhead and retry budget under the prefix (SCAN, never KEYS)."""
    doc = collect(app, states)
    if as_json:
        emit_json(doc)
    elif not doc["breakers"]:
        click.echo(f"no breakers under prefix {app.prefix!r}", err=True)
    else:
        click.echo(table(LS_HEADERS, ls_rows(doc), colour_col=1))


# -- show ----------------------------------------------------------------------------
def _outcomes(buckets: list[dict[str, Any]]) -> str:
    return "".join("F" if b["failed"] else "S" if b["slow"] else "." for b in buckets)


def show_text(d: dict[str, Any]) -> str:
    lines = [f"{d['name']}  (prefix {d['prefix']})"]
    b = d["breaker"]
    if b is None:
        lines.append("breaker: none stored")
    else:
        c = b["config"]
        retry = ("not until an operator closes it" if b["retry_in_s"] is None
                 else retry_in(b))
        lines += [
            f"state:     {coloured(b['state'])} for {duration(b['in_state_s'])} "
            f"(since {b['since_ms']} ms, generation {b['generation']})",
            f"probe in:  {retry}",
            f"window:    {b['window']['calls']} calls, {b['window']['failures']} failed, "
            f"{b['window']['slow']} slow; failure rate {percent(b['failure_rate'])}, "
            f"slow rate {percent(b['slow_rate'])}; {b['rejected']} rejected fleet-wide",
            f"config:    {c['sliding_window_type']} window of {c['sliding_window_size']}, "
            f"min {c['minimum_number_of_calls']} calls, failure >= "
            f"{c['failure_rate_threshold']:g}%, slow >= {c['slow_call_rate_threshold']:g}% "
            f"(> {c['slow_call_duration_s']:g}s), open wait "
            f"{c['wait_duration_in_open_state_s']:g}s, {c['permitted_calls_in_half_open']} "
            f"probes (lease {c['half_open_lease_s']:g}s, max half-open "
            f"{c['max_wait_in_half_open_s']:g}s), key TTL {c['key_ttl_s']:g}s",
            f"wire:      {c['wire']}",
        ]
        if b.get("config_drift"):
            lines.append(f"drift:     a worker runs {b['config_drift']['config'].get('wire')} "
                         f"(seen at {b['config_drift']['seen_at_ms']} ms); the stored "
                         f"config governs until reset")
        buckets = b["window"]["buckets"]
        if c["sliding_window_type"] == "COUNT_BASED":
            lines.append(f"outcomes:  {_outcomes(buckets) or '(empty)'}  "
                         "(oldest first; . ok, F failed, S slow)")
        else:
            lines.append("buckets:   " + (", ".join(
                f"-{x['age_s']}s {x['calls']}c/{x['failures']}f/{x['slow']}s"
                for x in buckets) or "(empty)"))
        if b["state"] == "HALF_OPEN":
            h = b["half_open"]
            lines.append(f"half-open: {h['issued']} probes issued, {h['done']} reported, "
                         f"{h['failed']} failed, {h['slow']} slow")
        for p in b["probes"]:
            lines.append(f"probe:     {p['token']} lease ends in {duration(p['expires_in_s'])}")
        lines.append(f"history:   {b['history_length']} transitions "
                     f"(distbreaker events {d['name']})")
    bh = d["bulkhead"]
    if bh is not None:
        lines.append(f"bulkhead:  {bh['in_use']}/{bh['limit'] or '?'} in use, "
                     f"{bh['waiting']} waiting, {bh['rejected'] or 0} rejected, "
                     f"{bh['lost'] or 0} leases lost")
        for h in bh["holders"]:
            state = "EXPIRED" if h["expired"] else f"ends in {duration(h['expires_in_s'])}"
            lines.append(f"holder:    {h['token']} lease {state}")
    rb = d["budget"]
    if rb is not None:
        lines.append(f"budget:    {rb['deposits']} deposits, {rb['withdrawals']} retries in "
                     f"the window ({rb['slices']} slices of {rb['slice_ms']} ms), "
                     f"balance {'?' if rb.get('balance') is None else rb['balance']}")
    for key, ttl in d["ttls"].items():
        lines.append(f"ttl:       {key}  {'no expiry' if ttl is None else duration(ttl)}")
    return "\n".join(lines)


@cli.command("show")
@click.argument("name", callback=check_name)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def show_command(app: App, name: str, as_json: bool) -> None:
    """Everything stored about one name: state, config, window, probes, bulkhead, budget."""
    detail = view.read_detail(app.client, app.prefix, name)
    if not detail["exists"]:
        raise NotFound(f"unknown name {name!r}: no keys under prefix {app.prefix!r}")
    if as_json:
        emit_json(detail)
    else:
        click.echo(show_text(detail))


# -- events --------------------------------------------------------------------------
def event_line(e: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((e["at_ms"] or 0) / 1000))
    who = f" by {e['actor']}" if e["actor"] else ""
    return (f"{when}.{(e['at_ms'] or 0) % 1000:03d}  {e['name']}  {coloured(e['from'])} -> "
            f"{coloured(e['to'])}  {e['reason']}{who}")


def recent_events(app: App, name: str | None, count: int) -> list[dict[str, Any]]:
    client = app.client
    if name is not None:
        if not client.exists(BreakerKeys.build(name, app.prefix).state,
                             BreakerKeys.build(name, app.prefix).history):
            raise NotFound(f"unknown breaker {name!r} under prefix {app.prefix!r}")
        return view.read_history(client, app.prefix, name, count)
    found = view.scan_names(client, app.prefix)
    merged: list[dict[str, Any]] = []
    for n in sorted(k for k, parts in found.items() if "breaker" in parts):
        merged.extend(view.read_history(client, app.prefix, n, count))
    merged.sort(key=lambda e: (e["at_ms"] or 0, e["id"] or ""))
    return merged[-count:]


def follow(app: App, name: str | None, as_json: bool, max_events: int | None,
           timeout: float | None) -> None:
    """Print live transitions from the channel until interrupted or a bound is reached."""
    pubsub = app.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(events_channel(app.prefix))
    if not as_json:
        click.echo(f"following transitions on {events_channel(app.prefix)} "
                   "(Ctrl-C to stop)", err=True)
    seen = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while max_events is None or seen < max_events:
            wait = 1.0 if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                break
            message = pubsub.get_message(timeout=min(wait, 1.0))
            if not message or message.get("type") != "message":
                continue
            event = view.decode_event_message(message["data"])
            if event is None or (name is not None and event["name"] != name):
                continue
            seen += 1
            if as_json:
                emit_json(event, lines=True)
            else:
                click.echo(event_line(event))
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    finally:
        pubsub.close()


@cli.command("events")
@click.argument("name", required=False, callback=check_name)
@click.option("-n", "--count", default=20, show_default=True, type=click.IntRange(1, 10_000),
              help="How many past transitions to show.")
@click.option("-f", "--follow", "live", is_flag=True,
              help="Tail live transitions from every worker instead.")
@click.option("--max-events", type=click.IntRange(1), help="With --follow: stop after N.")
@click.option("--timeout", type=click.FloatRange(0, min_open=True),
              help="With --follow: stop after S seconds.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def events_command(app: App, name: str | None, count: int, live: bool,
                   max_events: int | None, timeout: float | None, as_json: bool) -> None:
    """Transition history (oldest first), or live transitions with --follow."""
    if live:
        follow(app, name, as_json, max_events, timeout)
        return
    if max_events is not None or timeout is not None:
        raise click.UsageError("--max-events and --timeout only apply with --follow")
    for event in recent_events(app, name, count):
        if as_json:
            emit_json(event, lines=True)
        else:
            click.echo(event_line(event))


# -- watch ---------------------------------------------------------------------------
@cli.command("watch")
@click.option("--interval", default=2.0, show_default=True,
              type=click.FloatRange(0.05), help="Seconds between refreshes.")
@click.option("--state", "states", multiple=True, type=click.Choice(STATE_CHOICES,
              case_sensitive=False), help="Only breakers in this state (repeatable).")
@click.option("--iterations", type=click.IntRange(1), help="Stop after N refreshes.")
@click.pass_obj
def watch_command(app: App, interval: float, states: tuple[str, ...],
                  iterations: int | None) -> None:
    """A live table of every breaker, coloured by state (Ctrl-C to stop)."""
    done = 0
    tty = sys.stdout.isatty()
    try:
        while iterations is None or done < iterations:
            doc = collect(app, states)
            if tty:
                click.clear()
            stamp = time.strftime("%H:%M:%S", time.localtime(doc["server_time_ms"] / 1000))
            click.echo(f"distbreaker watch  prefix {app.prefix}  {len(doc['breakers'])} "
                       f"names  server time {stamp}  every {interval:g}s")
            click.echo(table(LS_HEADERS, ls_rows(doc), colour_col=1))
            done += 1
            if iterations is None or done < iterations:
                if not tty:
                    click.echo("")
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
