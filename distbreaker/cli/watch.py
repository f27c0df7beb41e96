"""`distbreaker watch`: a live table of the fleet, worst first, that survives Redis outages.

Drawn with rich, which fits the table to the terminal's width (long names end
in an ellipsis instead of wrapping every row), refreshes in place and colours
states. Without a terminal (a pipe, a test) each refresh is printed as plain
text. When Redis stops answering, the last table stays on screen under a
"Redis unreachable since ..." line and watch keeps retrying.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import click
import redis

from .app import App, cli, explain
from .fmt import STATE_COLOURS, clock, describe_counts
from .views import STATE_CHOICES, V1_LEGEND, collect, row_cells

#: Severity rank of a row (smaller is worse); rows sort by it, then by failure rate.
SEVERITY = {"FORCED_OPEN": 0, "OPEN": 1, "HALF_OPEN": 2, "ERROR": 3, "METRICS_ONLY": 4,
            "CLOSED": 5, "DISABLED": 6}
HEADERS = ["NAME", "STATE", "FOR", "FAIL", "SLOW", "CALLS", "RETRY", "BULK", "RATE", "BUDGET"]
LEGEND = ("BUDGET +requests -retries =retries left   BULK in use/limit (adaptive: why it "
          "last moved, how long ago)   RATE permits now/limit per period (! changed)   "
          "OPEN (due): the wait is over, the next call probes   FAIL/SLOW -: too few calls")
NAME_MIN, NAME_MAX = 12, 60
MAX_ERROR_LINES = 10  # reasons of error rows shown under the table (foreign keys)
#: Columns hidden, first to last, while the table is wider than the terminal: a number
#: is never cut (`10…` for 100 % reads as 10); NAME, STATE and FAIL always stay.
DROP_ORDER = ("BUDGET", "RATE", "BULK", "SLOW", "RETRY", "FOR", "CALLS")


def severity_key(row: dict[str, Any]) -> tuple[int, float, str]:
    """FORCED_OPEN, OPEN, HALF_OPEN first, then by failure rate (highest first), then name."""
    state = "ERROR" if row["error"] else (row["state"] or "")
    rate = (row["breaker"] or {}).get("failure_rate")
    return SEVERITY.get(state, 7), -(rate if rate is not None and rate >= 0 else -1), row["name"]


def sorted_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=severity_key)


def render(doc: dict[str, Any] | None, prefix: str, interval: float, width: int,
           outage: Outage | None) -> Any:
    """One frame: header, table, legend, and the outage line when Redis is unreachable."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    if doc is not None:
        counts = Counter(r["state"] or ("ERROR" if r["error"] else "no breaker")
                         for r in doc["breakers"])
        parts.append(Text(f"distbreaker watch  prefix {prefix}  server time "
                          f"{clock(doc['server_time_ms'], date=False)}  every {interval:g}s",
                          style="bold"))
        if doc.get("top"):  # a top N of many: the states of every name
            every = doc.get("_counts") or {}
            parts.append(Text(f"top {len(doc['breakers'])} by failure rate of "
                              f"{sum(every.values())} names: {describe_counts(every)}"))
        else:
            parts.append(Text(f"{len(doc['breakers'])} names: "
                              f"{describe_counts(counts) or 'none'}"))
    if outage is not None:
        parts.append(Text(outage.line(), style="bold red"))
    if doc is None:
        return Group(*parts)
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold",
                  padding=(0, 1, 0, 0))
    # RATE only when some row has a rate limiter (it would narrow the names for nothing)
    without = () if any(r.get("rate_limiter") for r in doc["breakers"]) else ("RATE",)
    errors: list[str] = []
    rows: list[tuple[list[str], str]] = []
    for row in sorted_rows(doc["breakers"]):
        cells = row_cells(row)
        if row["error"]:  # the reason goes under the table, so the columns keep their width
            errors.append(f"{cells[0]}: {cells[-1]}")
            cells[-1] = "see below"
        state = cells[1].split(" ")[0]
        rows.append((cells, "bold red" if row["error"] else STATE_COLOURS.get(state, "")))
    shown = fitting_columns([cells for cells, _ in rows], width, without)
    others = sum(column_width(i, [c for c, _ in rows]) + 1 for i in shown if i)
    for i in shown:
        if i == 0:
            table.add_column(HEADERS[i], no_wrap=True, overflow="ellipsis", min_width=NAME_MIN,
                             max_width=max(NAME_MIN, min(NAME_MAX, width - others)))
        else:
            table.add_column(HEADERS[i], no_wrap=True, overflow="fold")
    for cells, style in rows:
        table.add_row(*(Text(cells[i], style=style) if i == 1 else Text(cells[i])
                        for i in shown))
    if not doc["breakers"]:
        parts.append(Text(f"no breakers under prefix {prefix!r}" if not doc["_filtered"]
                          else "no breaker in the chosen states", style="dim"))
    else:
        parts.append(table)
    for line in errors[:MAX_ERROR_LINES]:
        parts.append(Text(f"ERROR {line}", style="red"))
    if len(errors) > MAX_ERROR_LINES:
        parts.append(Text(f"ERROR and {len(errors) - MAX_ERROR_LINES} more (distbreaker ls)",
                          style="red"))
    hidden = [h for i, h in enumerate(HEADERS) if i not in shown and h not in without]
    if hidden and doc["breakers"]:
        parts.append(Text(f"hidden at {width} columns: {', '.join(hidden)} (a wider "
                          "terminal, or distbreaker ls, shows them)", style="dim"))
    parts.append(Text(LEGEND, style="dim"))
    if any(r.get("schema") == "v1" for r in doc["breakers"]):
        parts.append(Text(V1_LEGEND, style="dim"))
    return Group(*parts)


def column_width(index: int, rows: Sequence[Sequence[str]]) -> int:
    """The width column `index` needs for its header and every cell."""
    return max([len(HEADERS[index]), *(len(cells[index]) for cells in rows)])


def fitting_columns(rows: Sequence[Sequence[str]], width: int,
                    without: Sequence[str] = ()) -> list[int]:
    """The indexes of the columns shown at `width`: all of them (but `without`) when they
    fit (NAME at its minimum), else without the columns of DROP_ORDER, one by one, until
    they do."""
    shown = [i for i, header in enumerate(HEADERS) if header not in without]

    def needed() -> int:
        return sum((NAME_MIN if i == 0 else column_width(i, rows)) + 1 for i in shown) - 1

    for header in DROP_ORDER:
        if needed() <= width:
            break
        if HEADERS.index(header) in shown:
            shown.remove(HEADERS.index(header))
    return shown


class Outage:
    """Since when Redis has not answered (local clock: the server's is out of reach)."""

    def __init__(self, error: BaseException, url: str) -> None:
        self.since_ms = int(time.time() * 1000)
        self.attempts = 1
        self.url = url
        self.error = error

    def line(self) -> str:
        why = explain(self.error, self.url) or str(self.error)
        return (f"Redis unreachable since {clock(self.since_ms, date=False)} "
                f"({self.attempts} attempt{'s' if self.attempts != 1 else ''}; {why}); "
                "retrying, the table below is the last one read")


UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


def read(app: App, states: Sequence[str], patterns: Sequence[str] = (),
         top: int | None = None) -> dict[str, Any]:
    doc = collect(app, states, patterns, top=top)
    doc["_filtered"] = bool(states or patterns or top)
    return doc


@cli.command("watch")
@click.argument("patterns", nargs=-1, metavar="[NAME_GLOB]...")
@click.option("--interval", default=2.0, show_default=True,
              type=click.FloatRange(0.05), help="Seconds between refreshes.")
@click.option("--state", "states", multiple=True, type=click.Choice(STATE_CHOICES,
              case_sensitive=False), help="Only breakers in this state (repeatable).")
@click.option("--top", type=click.IntRange(1), metavar="N", help="Only the N breakers with "
              "the highest failure rate (thousands of names: a brief read of each ranks "
              "them, only N are read in full).")
@click.option("--iterations", type=click.IntRange(1), help="Stop after N refreshes.")
@click.pass_obj
def watch_command(app: App, patterns: tuple[str, ...], interval: float,
                  states: tuple[str, ...], top: int | None, iterations: int | None) -> None:
    """A live table of every breaker (or those a NAME_GLOB matches), worst first:
    FORCED_OPEN, OPEN, HALF_OPEN, then by failure rate (Ctrl-C to stop). Keeps retrying
    while Redis is unreachable."""
    from rich.console import Console
    from rich.live import Live

    console = Console(highlight=False)
    live: Live | None = None
    if console.is_terminal:
        live = Live(console=console, auto_refresh=False, screen=True,
                    vertical_overflow="ellipsis")
        live.start()
    doc: dict[str, Any] | None = None
    outage: Outage | None = None
    done = 0
    try:
        while iterations is None or done < iterations:
            try:
                doc = read(app, states, patterns, top)
                outage = None
            except UNREACHABLE as exc:
                app.close()  # reconnect on the next refresh
                if outage is None:
                    outage = Outage(exc, app.url)
                else:
                    outage.attempts += 1
                    outage.error = exc
            frame = render(doc, app.prefix, interval, console.width, outage)
            if live is not None:
                live.update(frame, refresh=True)
            else:
                console.print(frame)
            done += 1
            if iterations is None or done < iterations:
                if live is None:
                    console.print()
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
