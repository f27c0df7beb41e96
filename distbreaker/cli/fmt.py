"""Human forms of what the CLI prints: server times with their time zone, durations, rates,
state colours. Raw milliseconds stay in `--json`; these are for people.
"""

from __future__ import annotations

import datetime
from typing import Any

import click

STATE_COLOURS = {"CLOSED": "green", "OPEN": "red", "HALF_OPEN": "yellow",
                 "FORCED_OPEN": "magenta", "DISABLED": "blue", "METRICS_ONLY": "cyan"}
STATE_WIDTH = max(len(s) for s in STATE_COLOURS)


def printable(value: str) -> str:
    """`value` with control characters escaped, so a foreign key's name cannot drive the
    terminal (JSON output keeps it as it is)."""
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)


def zone_name(moment: datetime.datetime) -> str:
    """The zone's abbreviation (CET, UTC), or its offset when it has none (UTC+03:00)."""
    name = moment.tzname() or ""
    if name.isalpha():
        return name
    offset = moment.strftime("%z")
    return f"UTC{offset[:3]}:{offset[3:]}" if offset else "UTC"


def clock(ms: int | None, *, date: bool = True, millis: bool = False) -> str:
    """A server time (epoch ms) in the local time zone, with the zone: 2026-11-01 14:03:05 CET."""
    if ms is None or ms <= 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc).astimezone()
    text = moment.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S")
    if millis:
        text += f".{ms % 1000:03d}"
    return f"{text} {zone_name(moment)}"


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


def seconds_setting(value: float) -> str:
    """A configured duration in seconds as written: 60s, 0.05s, 1800s (30m)."""
    text = f"{value:g}s"
    return text if value < 120 else f"{text} ({duration(value)})"


def percent(value: float | None) -> str:
    """A rate in percent; '-' below the minimum number of calls (-1) or unknown."""
    return "-" if value is None or value < 0 else f"{value:g}%"


def coloured(state: str | None, width: int = 0) -> str:
    """The state name in its colour, padded to `width` before colouring (so columns align)."""
    text = state or "-"
    return click.style(text.ljust(width), fg=STATE_COLOURS.get(text))


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def describe_counts(counts: dict[str, Any]) -> str:
    """'3 CLOSED, 1 HALF_OPEN' from a state -> count mapping (most first)."""
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{n} {state}" for state, n in items)


#: Short forms of why an adaptive bulkhead limit last moved (lua/bulkhead.lua's a_why).
WHY_SHORT = {"initial": "initial", "failure or timeout": "failures",
             "overload (429)": "429", "overload (429): increases paused": "429 pause",
             "latency above its long-run level": "latency", "latency normal: growing": "growing",
             "restart after a recovery": "restart"}


def why_short(why: str) -> str:
    """A table cell's form of why an adaptive limit last moved (unknown text: its first
    word, so a newer script's reason still shows)."""
    return WHY_SHORT.get(why) or printable(why.split(" ")[0] if why else "?")
