"""Read-only commands: ls, show, events (watch is in `watch`). All reads go through
distbreaker.readside; times are shown in the local time zone, with the zone."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import click
import redis

from .. import readside as view
from .._runtime.keys import BreakerKeys, events_channel
from ..breaker.state import State
from ..errors import SchemaError
from .app import App, NotFound, check_name, cli, emit_json
from .fmt import (
    STATE_WIDTH,
    clock,
    coloured,
    describe_counts,
    duration,
    percent,
    plural,
    printable,
    seconds_setting,
    why_short,
)

STATE_CHOICES = [s.value.lower() for s in State]


def table(headers: Sequence[str], rows: Iterable[Sequence[str]],
          colour_col: int | None = None) -> str:
    """Left-aligned columns; the `colour_col` cell is coloured by state after padding."""
    rows = [list(r) for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=True)]
        if colour_col is not None:
            state = r[colour_col].split(" ")[0]
            cells[colour_col] = cells[colour_col].replace(state, coloured(state), 1)
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# -- ls ------------------------------------------------------------------------------
#: `ls --json` is indented up to this many rows; a longer listing is printed on one line
#: (the indenting encoder is pure Python: 5x the time of the whole read at 10,000 names).
JSON_INDENT_ROWS = 1000


def collect(app: App, states: Sequence[str] = (), patterns: Sequence[str] = (),
            limit: int | None = None, page: int = 1, top: int | None = None,
            by: str = "failure-rate") -> dict[str, Any]:
    """The `ls` document: every name under the prefix (or those the glob `patterns`
    match), optionally filtered by state, one page of `limit` rows, or the `top` names
    by `by` (docs/CLI_JSON.md).

    With a state filter, a page or a top, every name is first read briefly (its state
    record's header and meta hash: `readside.read_brief`) and only the rows shown are
    read in full, so 10,000 names cost two commands each plus the page.
    `_counts` (not part of the JSON) counts the states of every row, so an empty
    filtered listing can say what there is instead.
    """
    client, prefix = app.client, app.prefix
    found = view.scan(client, prefix)
    if patterns:
        keep = set(view.matching({*found.names, *found.legacy, *found.invalid}, patterns))
        found = view.Scan({n: p for n, p in found.names.items() if n in keep},
                          {n: k for n, k in found.invalid.items() if n in keep},
                          {n: p for n, p in found.legacy.items() if n in keep})
    wanted = {s.upper() for s in states}
    paging: dict[str, Any] | None = None
    if top is None and limit is None and not wanted:  # the whole listing, every row read
        rows = view.read_rows(client, prefix, found)
        counts = Counter(_count_key(r) for r in rows)
        total = len(rows)
    else:
        rows, counts, total, paging = _brief_listing(app, found, wanted, limit, page, top, by)
    return {"schema": view.JSON_SCHEMA_VERSION, "prefix": prefix,
            "server_time_ms": view.server_now_ms(client), "breakers": rows,
            "total": total, "page": paging, "match": list(patterns),
            "top": None if top is None else {"n": top, "by": by},
            "_counts": dict(counts)}


def _count_key(row: dict[str, Any]) -> str:
    return row["state"] or ("ERROR" if row["error"] else "no breaker")


def _brief_listing(app: App, found: view.Scan, wanted: set[str], limit: int | None,
                   page: int, top: int | None, by: str
                   ) -> tuple[list[dict[str, Any]], Counter[str], int, dict[str, Any] | None]:
    """(rows shown, state counts of every row, rows matching, the page) from a brief read
    of every v2 breaker, the v1 rows (few: workers not yet upgraded) read in full."""
    client, prefix = app.client, app.prefix
    briefs: dict[str, dict[str, Any] | None] = {}
    if wanted or top is not None:  # a page of every name needs no state to choose rows
        briefs = view.read_brief(client, prefix, [n for n, p in found.names.items()
                                                  if "breaker" in p])
    legacy = {r["name"]: r for r in view.read_summaries(client, prefix, found.legacy,
                                                        schema=view.V1)}
    counts: Counter[str] = Counter()
    for name in found.names:
        b = briefs.get(name)
        counts[b["state"] if b else "no breaker"] += 1
    counts.update(_count_key(r) for r in legacy.values())
    counts["ERROR"] += len(found.invalid)
    if not counts["ERROR"]:
        del counts["ERROR"]

    def shown(state: str | None) -> bool:
        return not wanted or state in wanted

    if top is not None:
        chosen = view.rank({n: b for n, b in briefs.items() if b and shown(b["state"])},
                           by, top)
        rows = sorted(view.read_summaries(client, prefix, {n: found.names[n] for n in chosen}),
                      key=lambda r: view.rank_key(r, by))
        return [r for r in rows if shown(r["state"])], counts, len(chosen), None
    # (name, key schema) of every row, in `read_rows` order, filtered by state
    entries = [(n, view.V2) for n in found.names
               if shown((briefs.get(n) or {}).get("state"))]
    entries += [(n, view.V1) for n, r in legacy.items() if shown(r["state"])]
    if not wanted:
        entries += [(n, view.V2 if n not in found.legacy else view.V1) for n in found.invalid]
    entries.sort(key=lambda e: (e[0], view.SCHEMAS.index(e[1])))
    total = len(entries)
    paging = None
    if limit is not None:
        pages = max(1, -(-total // limit))
        paging = {"limit": limit, "page": page, "pages": pages,
                  "next_page": page + 1 if page < pages else None}
        entries = entries[(page - 1) * limit:page * limit]
    v2 = {n: found.names[n] for n, schema in entries
          if schema == view.V2 and n in found.names}
    full = {(r["name"], view.V2): r for r in view.read_summaries(client, prefix, v2)}
    rows = []
    for name, schema in entries:
        if (name, schema) in full:
            row = full[(name, schema)]
        elif schema == view.V1 and name in legacy:
            row = legacy[name]
        else:
            row = view.invalid_row(name, found.invalid.get(name, []), prefix)
        if shown(row["state"]):
            rows.append(row)
    return rows, counts, total, paging


def public(doc: dict[str, Any]) -> dict[str, Any]:
    """The documented JSON document (without the helper fields)."""
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def probe_due(b: dict[str, Any]) -> bool:
    """An OPEN whose wait is over: the next call makes it HALF_OPEN and probes."""
    return b.get("state") == "OPEN" and b.get("retry_in_s") == 0


def state_cell(row: dict[str, Any]) -> str:
    b = row["breaker"] or {}
    if probe_due(b):
        return "OPEN (due)"
    quorum = b.get("quorum") or {}
    if quorum.get("pending"):
        return f"{row['state']} ({quorum['text']})"
    return row["state"] or "-"


def retry_in(breaker: dict[str, Any]) -> str:
    """When a call may next be tried; blank where calls pass (CLOSED, DISABLED, ...)."""
    state = breaker.get("state")
    seconds = breaker.get("retry_in_s")
    left = breaker.get("override_left_s")
    if left is not None:  # an operator's override that ends by itself
        return f"held {duration(left)}"
    if state == "FORCED_OPEN":
        return "held open"
    if state == "OPEN":
        return "next call" if not seconds else duration(seconds)
    if state == "HALF_OPEN":
        return "probe free" if not seconds else duration(seconds)
    return "-"


def budget_cell(rb: dict[str, Any] | None) -> str:
    """+requests -retries =retries left (the legend of `watch` says so)."""
    if rb is None or rb["deposits"] is None:
        return "-"
    left = "" if rb.get("balance") is None else f" ={rb['balance']}"
    return f"+{rb['deposits']} -{rb['withdrawals']}{left}"


def rate_cell(rl: dict[str, Any] | None) -> str:
    """permits available now/limit per period: 12/50 per 1s; ! when an operator changed the
    limit; negative while waiting calls hold reservations."""
    if rl is None or rl["limit_for_period"] is None:
        return "-"
    available = "?" if rl["available"] is None else rl["available"]
    per = duration((rl["limit_refresh_period_ms"] or 0) / 1000)
    return f"{available}/{rl['limit_for_period']} per {per}" + ("!" if rl["overridden"] else "")


def name_cell(r: dict[str, Any]) -> str:
    """The name, marked ``[v1]`` for a row read from key schema v1 (workers not yet
    upgraded; v2 rows are unmarked)."""
    return printable(r["name"]) + (" [v1]" if r.get("schema") == view.V1 else "")


V1_LEGEND = ("[v1]: key schema v1, kept by workers not yet upgraded; they do not share "
             "state with v2 workers (docs/OPERATIONS.md, Rolling deploy)")


def bulkhead_cell(bh: dict[str, Any] | None) -> str:
    """in use/limit; an adaptive limit adds why it last moved and when: 3/8 (growing 12s)."""
    if bh is None:
        return "-"
    cell = f"{bh['in_use']}/{bh['limit'] or '?'}"
    a = bh.get("adaptive")
    if a is not None:
        when = "" if a["moved_ago_s"] is None else f" {duration(a['moved_ago_s'])}"
        cell += f" ({why_short(a['why'])}{when})"
    return cell


def adaptive_line(a: dict[str, Any], now_ms: int) -> str:
    """`show`'s line about an adaptive limit: where it is, why and when it last moved."""
    moved = ("never moved since it started" if a["moved_at_ms"] is None else
             f"last moved {duration(a['moved_ago_s'])} ago ({clock(a['moved_at_ms'])})")
    parts = [f"adaptive:  limit {a['limit']:g}, {moved}: {printable(a['why'] or '?')}"]
    if a["paused_until_ms"] is not None:
        parts.append(f"increases paused for {duration((a['paused_until_ms'] - now_ms) / 1000)}")
    if a["rtt_short_ms"] is not None and a["rtt_long_ms"] is not None:
        parts.append(f"latency {a['rtt_short_ms']:g} ms last window, "
                     f"{a['rtt_long_ms']:g} ms no-load")
    return "; ".join(parts)


def row_cells(r: dict[str, Any]) -> list[str]:
    b, bh = r["breaker"] or {}, r["bulkhead"]
    bulk = bulkhead_cell(bh)
    if r["error"]:
        # the error goes last, so its length widens no other column
        return [name_cell(r), "ERROR", "", "", "", "", "", "", "", printable(r["error"])]
    return [name_cell(r), state_cell(r), duration(b.get("in_state_s")),
            percent(b.get("failure_rate")), percent(b.get("slow_rate")),
            str(b.get("calls", "-")), retry_in(b) if b else "-", bulk,
            rate_cell(r.get("rate_limiter")), budget_cell(r["budget"])]


def ls_rows(doc: dict[str, Any]) -> list[list[str]]:
    return [row_cells(r) for r in doc["breakers"]]


LS_HEADERS = ["NAME", "STATE", "IN STATE", "FAIL", "SLOW", "CALLS", "RETRY IN", "BULKHEAD",
              "RATE", "BUDGET"]


def empty_message(app: App, doc: dict[str, Any], states: Sequence[str]) -> str:
    counts = doc["_counts"]
    paging = doc.get("page")
    if paging and paging["page"] > paging["pages"] and doc.get("total"):
        return (f"page {paging['page']} is past the last page ({paging['pages']} of "
                f"{paging['limit']} rows: {plural(doc['total'], 'name')})")
    where = f"under prefix {app.prefix!r}" + (
        f" matching {' or '.join(repr(p) for p in doc['match'])}" if doc.get("match") else "")
    if not states or not counts:
        return f"no breakers, bulkheads, rate limiters or budgets {where}"
    wanted = " or ".join(s.upper() for s in states)
    return (f"no breaker is {wanted} {where} "
            f"({plural(sum(counts.values()), 'name')}: {describe_counts(counts)})")


def page_footer(doc: dict[str, Any]) -> str | None:
    """Where a page or a top listing stands, for stderr (None for a whole listing)."""
    paging, top = doc.get("page"), doc.get("top")
    if top is not None:
        return (f"top {len(doc['breakers'])} by {top['by']} of "
                f"{plural(sum(doc['_counts'].values()), 'name')}")
    if paging is None:
        return None
    shown = len(doc["breakers"])
    line = (f"page {paging['page']} of {paging['pages']} ({shown} of "
            f"{plural(doc['total'], 'row')})")
    if paging["next_page"] is not None:
        line += f"; next: --page {paging['next_page']}"
    return line


@cli.command("ls")
@click.argument("patterns", nargs=-1, metavar="[NAME_GLOB]...")
@click.option("--state", "states", multiple=True, type=click.Choice(STATE_CHOICES,
              case_sensitive=False), help="Only breakers in this state (repeatable).")
@click.option("--limit", type=click.IntRange(1), help="Rows per page (with --page); "
              "only the rows shown are read in full.")
@click.option("--page", type=click.IntRange(1), default=1, show_default=True,
              help="Which page of --limit rows (sorted by name).")
@click.option("--top", type=click.IntRange(1), metavar="N", help="Only the N breakers with "
              "the highest --by (a brief read of every name ranks them).")
@click.option("--by", type=click.Choice(list(view.RANK_FIELDS)), default="failure-rate",
              show_default=True, help="What --top ranks by (rejections: calls Redis refused).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output "
              "(docs/CLI_JSON.md).")
@click.pass_obj
def ls_command(app: App, patterns: tuple[str, ...], states: tuple[str, ...],
               limit: int | None, page: int, top: int | None, by: str, as_json: bool) -> None:
    """List every breaker, bulkhead, rate limiter and retry budget under the prefix (SCAN,
    never KEYS), or those whose names match a NAME_GLOB ('llm:*', 'tenant:?7').

    RATE is permits available now/limit per period (! an operator's limit; negative:
    reserved by waiting calls); BUDGET is +requests -retries =retries left; OPEN (due)
    is an OPEN whose wait is over (the next call probes). Names marked [v1] are read
    from key schema v1 (workers not yet upgraded, read-only).
    """
    if top is not None and limit is not None:
        raise click.UsageError("give --top or --limit, not both")
    if page != 1 and limit is None:
        raise click.UsageError("--page needs --limit")
    doc = collect(app, states, patterns, limit, page, top, by)
    if as_json:
        emit_json(public(doc), lines=len(doc["breakers"]) > JSON_INDENT_ROWS)
    elif not doc["breakers"]:
        click.echo(empty_message(app, doc, states), err=True)
    else:
        click.echo(table(LS_HEADERS, ls_rows(doc), colour_col=1))
        if any(r.get("schema") == view.V1 for r in doc["breakers"]):
            click.echo(V1_LEGEND, err=True)
        footer = page_footer(doc)
        if footer:
            click.echo(footer, err=True)


# -- show ----------------------------------------------------------------------------
def _outcomes(buckets: list[dict[str, Any]]) -> str:
    return "".join("F" if b["failed"] else "S" if b["slow"] else "." for b in buckets)


def _next_call(b: dict[str, Any], now_ms: int) -> str:
    state, seconds = b["state"], b["retry_in_s"]
    left = b.get("override_left_s")
    if left is not None:
        after = "half-open probes" if state == "FORCED_OPEN" else "CLOSED"
        head = "rejected" if state == "FORCED_OPEN" else "every call passes"
        return (f"{head}; the override ends in {duration(left)} "
                f"(at {clock(b['override_until_ms'])}), then {after}")
    if state == "FORCED_OPEN":
        return "rejected until an operator closes or resets it"
    if state == "OPEN":
        if seconds:
            return (f"rejected; probes start in {duration(seconds)} "
                    f"(at {clock(b['open_until_ms'])})")
        over = (now_ms - (b["open_until_ms"] or now_ms)) / 1000
        return (f"the open wait ended {duration(over)} ago: the next call becomes a "
                "half-open probe")
    if state == "HALF_OPEN":
        if seconds:
            return f"every probe slot is leased; one frees in {duration(seconds)}"
        return "a probe slot is free: the next call probes"
    return "every call passes" + (", nothing recorded" if state == "DISABLED" else "")


def _config_line(c: dict[str, Any]) -> str:
    half_open = ("no limit (until every probe reports)" if not c["max_wait_in_half_open_s"]
                 else seconds_setting(c["max_wait_in_half_open_s"]))
    return (f"config:    {c['sliding_window_type']} window of {c['sliding_window_size']}, "
            f"min {c['minimum_number_of_calls']} calls, failure >= "
            f"{c['failure_rate_threshold']:g}%, slow >= {c['slow_call_rate_threshold']:g}% "
            f"(> {seconds_setting(c['slow_call_duration_s'])}), open wait "
            f"{seconds_setting(c['wait_duration_in_open_state_s'])}, "
            f"{c['permitted_calls_in_half_open']} probes (lease "
            f"{seconds_setting(c['half_open_lease_s'])}, max half-open {half_open}), "
            f"key TTL {seconds_setting(c['key_ttl_s'])}")


def drift_lines(name: str, b: dict[str, Any]) -> list[str]:
    drift = b.get("config_drift")
    if not drift:
        return []
    from ..breaker.config import BreakerConfig, config_differences

    seen = clock(drift["seen_at_ms"])
    try:
        fields = config_differences(BreakerConfig.from_wire(drift["config"]["wire"]),
                                    BreakerConfig.from_wire(b["config"]["wire"]))
        differs = "; ".join(f"{f} {a!r} (stored {s!r})" for f, a, s in fields)
    except (KeyError, ValueError):
        differs = f"wire {drift['config'].get('wire')!r}"
    return [f"drift:     a worker runs another config (last seen {seen}): {differs}",
            f"           the config in force governs it; `distbreaker config adopt {name}` "
            "promotes a deployed config (window and state kept)"]


def config_lines(name: str, b: dict[str, Any]) -> list[str]:
    """`show`'s rollout lines: which config is in force (since when, why) and every
    config deployed, by how many workers (hellos in the last minute)."""
    configs, in_force = b.get("configs") or [], b.get("config_in_force")
    if not configs:
        return []
    lines = []
    if in_force:
        how = ", ".join(p for p in (
            f"since {clock(in_force['since_ms'])}" if in_force["since_ms"] else "",
            in_force["why"] or "", f"by {in_force['actor']}" if in_force["actor"] else "")
            if p)
        lines.append(f"in force:  config {in_force['fingerprint']}" + (f" ({how})" if how
                                                                     else ""))
    for c in configs:
        deployed = clock(c["deployed_at_ms"]) if c["deployed_at_ms"] else "?"
        version = f", config_version {c['version']}" if c["version"] else ""
        lines.append(f"deployed:  config {c['fingerprint']}"
                     f"{' (in force)' if c['in_force'] else ''}: "
                     f"{plural(c['workers'], 'worker')} in the last minute, deployed "
                     f"{deployed}{version}; wire {c['wire'] or '?'}")
    if any(not c["in_force"] and c["workers"] for c in configs):
        lines.append(f"           workers on another config obey the one in force; "
                     f"`distbreaker config adopt {name}` promotes the newest")
    return lines


def show_text(d: dict[str, Any]) -> str:
    now = d["server_time_ms"]
    schema = d.get("schema", view.V2)
    lines = [f"{d['name']}  (prefix {d['prefix']}, key schema {schema}, "
             f"server time {clock(now)})"]
    if schema == view.V1:
        lines.append("schema:    v1 keys of workers not yet upgraded: read-only here, they do "
                     "not share state with v2 workers (docs/OPERATIONS.md, Rolling deploy)")
    for other in d.get("other_schemas") or ():
        lines.append(f"schema:    {d['name']!r} also has {other} keys "
                     f"(distbreaker show --schema {other} {d['name']})")
    if d.get("error"):
        lines.append(f"error:     {printable(d['error'])} (left unread)")
    b = d["breaker"]
    if b is None:
        lines.append("breaker:   none stored")
    else:
        c, w = b["config"], b["window"]
        lines += [
            f"state:     {coloured(b['state'])} for {duration(b['in_state_s'])} "
            f"(since {clock(b['since_ms'])}, generation {b['generation']})",
            f"next call: {_next_call(b, now)}",
            *([f"reason:    {printable(b['reason'])}"
               + (f" (by {printable(b['actor'])})" if b.get("actor") else "")]
              if b.get("reason") else []),
            *([f"override:  ended at {clock(b['override_ended_ms'])}; the next call records "
               "it in the history, stamped with that time"]
              if b.get("override_ended_ms") else []),
            f"window:    {w['calls']} calls, {w['failures']} failed, {w['slow']} slow; "
            f"failure rate {percent(b['failure_rate'])}, slow rate {percent(b['slow_rate'])}"
            + ("" if b["failure_rate"] is None or b["failure_rate"] >= 0 else
               f" (below the minimum of {c['minimum_number_of_calls']} calls)"),
            f"rejected:  {b['rejected']} calls refused by Redis since the keys were created "
            "(workers that already know it is OPEN reject without asking Redis: their "
            "count is distbreaker_rejections_total)",
            _config_line(c),
            f"wire:      {c['wire']}",
        ]
        lines += drift_lines(d["name"], b)
        lines += config_lines(d["name"], b)
        quorum = b.get("quorum")
        if quorum:
            lines.append("quorum:    " + (quorum["text"] or (
                f"{quorum['failing_workers']} of {quorum['min_failing_workers']} workers "
                "failing")) + (f" ({', '.join(quorum['workers'])})" if quorum["workers"]
                               else "") + "; only a worker whose own calls fail opens its "
                         "own view until the quorum is met")
        buckets = w["buckets"]
        if c["sliding_window_type"] == "COUNT_BASED":
            lines.append(f"outcomes:  {_outcomes(buckets) or '(empty)'}  "
                         "(oldest first; . ok, F failed, S slow)")
        else:
            lines.append("buckets:   " + (", ".join(
                f"-{x['age_s']}s {x['calls']}c/{x['failures']}f/{x['slow']}s"
                for x in buckets) or "(empty)") + "  (age, calls/failed/slow)")
        if b["state"] == "HALF_OPEN":
            h = b["half_open"]
            lines.append(f"half-open: {h['issued']} of {c['permitted_calls_in_half_open']} "
                         f"probes issued, {h['done']} reported, {h['failed']} failed, "
                         f"{h['slow']} slow")
        for p in b["probes"]:
            ends = ("expired (reaped by the next call)" if p["expires_in_s"] <= 0
                    else f"ends in {duration(p['expires_in_s'])}")
            lines.append(f"probe:     {p['token']} lease {ends}")
        lines.append(f"history:   {plural(b['history_length'], 'transition')} "
                     f"(distbreaker events {d['name']})")
        if d.get("shadows"):  # candidate configs fed the live outcomes (cli/shadow_cmd.py)
            from .shadow_cmd import shadow_lines

            lines.append(f"shadows:   {len(d['shadows'])} (distbreaker events --shadow "
                         f"{d['name']})")
            lines += shadow_lines(d["shadows"], "  ")
    bh = d["bulkhead"]
    if bh is not None:
        lines.append(f"bulkhead:  {bh['in_use']}/{bh['limit'] or '?'} in use, "
                     f"{bh['waiting']} waiting, {bh['rejected'] or 0} rejected, "
                     f"{bh['lost'] or 0} leases lost")
        if bh.get("adaptive") is not None:
            lines.append(adaptive_line(bh["adaptive"], d["server_time_ms"]))
        for h in bh["holders"]:
            state = "EXPIRED" if h["expired"] else f"ends in {duration(h['expires_in_s'])}"
            lines.append(f"holder:    {h['token']} lease {state}")
    rb = d["budget"]
    if rb is not None:
        lines.append(f"budget:    {rb['deposits']} deposits, {rb['withdrawals']} retries in "
                     f"the window ({rb['slices']} slices of {rb['slice_ms']} ms), "
                     f"balance {'?' if rb.get('balance') is None else rb['balance']} "
                     "retries left")
    rl = d.get("rate_limiter")
    if rl is not None:
        lines.append(f"rate:      {rate_cell(rl)}, burst {rl['burst']}"
                     f"{' (changed by an operator)' if rl['overridden'] else ''}; "
                     f"{rl['calls']} calls granted ({rl['permits']} permits, {rl['waited']} "
                     f"after a wait), {rl['rejected']} refused; reservations reach "
                     f"{duration((rl['reserved_ahead_ms'] or 0) / 1000)} ahead")
        if rl.get("changed_at_ms"):
            what = "limit by: " if rl["overridden"] else "reset by: "
            lines.append(f"{what} {printable(rl['changed_by'] or 'an unnamed operator')} "
                         f"at {clock(rl['changed_at_ms'])}: "
                         f"{printable(rl['changed_reason'] or '')}"
                         + ("" if rl["overridden"] else " (the operator's limit dropped: "
                            "each worker's own config governs)"))
    for key, ttl in d["ttls"].items():
        lines.append(f"ttl:       {key}  {'no expiry' if ttl is None else duration(ttl)}")
    return "\n".join(lines)


def unknown(app: App, name: str, what: str = "name") -> NotFound:
    """NotFound for a name without keys, with the closest existing names."""
    from .. import operate  # the actions' module: only for this message
    from .actions import did_you_mean

    known = list(view.scan_names(app.client, app.prefix))
    return NotFound(f"unknown {what} {name!r}: no keys under prefix {app.prefix!r}"
                    + did_you_mean(operate.close_names(name, known)))


@cli.command("show")
@click.argument("name", callback=check_name)
@click.option("--schema", type=click.Choice(list(view.SCHEMAS)), help="Read this key "
              "schema (default: v2, or v1 when only v1 keys exist).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def show_command(app: App, name: str, schema: str | None, as_json: bool) -> None:
    """Everything stored about one name: state, config, window, probes, bulkhead, budget.

    Reads key schema v2; a name with only v1 keys (workers not yet upgraded) is read
    from v1, and the output says which schema it shows.
    """
    detail = view.read_detail_any(app.client, app.prefix, name, schema)
    if not detail["exists"]:
        raise unknown(app, name)
    if (detail.get("breaker") or {}).get("shadowed"):
        detail["shadows"] = view.read_shadows(
            app.client, app.prefix, name,
            clock=None if as_json else (lambda ms: clock(ms, date=False)))
    if as_json:
        emit_json(detail)
    else:
        click.echo(show_text(detail))


# -- events ----------------------------------------------------------------------------
#: History kinds (`--kind`): "transition" (kind "" in the stream) and the entries that are
#: not transitions (docs/CLI_JSON.md).
KINDS = ("transition", "override", "override_end", "restart", "reset")


def kind_of(event: dict[str, Any]) -> str:
    return event.get("kind") or "transition"


def event_line(e: dict[str, Any], name_width: int = 0) -> str:
    """One aligned, coloured line: time with zone, name, from -> to (or what an entry
    that is not a transition did), reason, actor."""
    if e.get("error"):
        return (f"{'-':<27}  {printable(e['name']).ljust(name_width)}  ERROR  "
                f"{printable(e['error'])}")
    who = f" by {e['actor']}" if e["actor"] else ""
    kind = kind_of(e)
    if kind == "transition":
        what = f"{coloured(e['from'], STATE_WIDTH)} -> {coloured(e['to'], STATE_WIDTH)}"
    else:
        until = f" until {clock(e['until_ms'])}" if e.get("until_ms") else ""
        if kind == "override" and not e.get("until_ms"):
            until = " (no end)"
        what = f"{coloured(e['to'], STATE_WIDTH)} [{kind}{until}]".ljust(2 * STATE_WIDTH + 4)
    late = ""
    if e.get("recorded_ms"):
        late = f" (recorded {clock(e['recorded_ms'], millis=True)})"
    return (f"{clock(e['at_ms'], millis=True)}  {e['name'].ljust(name_width)}  "
            f"{what}  {e['reason']}{who}{late}")


MAX_NAME_COLUMN = 40


def name_width(names: Iterable[str]) -> int:
    return min(MAX_NAME_COLUMN, max((len(n) for n in names), default=0))


def recent_events(app: App, name: str | None, count: int,
                  kinds: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The last `count` history entries (of `kinds`, default all) of NAME (or of every
    breaker, merged by time), after one error line per breaker whose keys are foreign
    (and, without NAME, per name part that is not a valid name): a foreign key never
    stops the history of the others."""
    client = app.client
    if count == 0:
        return []
    invalid: dict[str, list[str]] = {}
    schema = view.V2
    if name is not None:
        if not client.exists(BreakerKeys.build(name, app.prefix).state,
                             BreakerKeys.build(name, app.prefix).history):
            from ..operate import has_v1_breaker

            if not has_v1_breaker(client, app.prefix, name):
                raise unknown(app, name, "breaker")
            schema = view.V1  # only a worker not yet upgraded wrote it: its v1 history
        names = [name]
    else:
        found = view.scan(client, app.prefix)
        names = sorted(n for n, parts in found.names.items() if "breaker" in parts)
        invalid = found.invalid
    errors = {r["name"]: r["error"] for r in view.read_summaries(
        client, app.prefix, {n: {"breaker"} for n in names}, schema=schema) if r["error"]}
    errors.update((n, view.invalid_row(n, keys)["error"]) for n, keys in invalid.items())
    merged: list[dict[str, Any]] = []
    # a stream keeps at most 1000 entries: with a filter, read them all, then keep `count`
    depth = count if not kinds else 1000
    for n in names:
        try:
            merged.extend(e for e in view.read_history(client, app.prefix, n, depth, schema)
                          if not kinds or kind_of(e) in kinds)
        except SchemaError as exc:  # the history stream holds another type
            if str(exc) not in (errors.get(n) or ""):  # the summary names the type too
                errors[n] = "; ".join(e for e in (errors.get(n), str(exc)) if e)
    merged.sort(key=lambda e: (_entry_ms(e), e["id"] or ""))
    return [view.error_event(n, errors[n]) for n in sorted(errors)] + merged[-count:]


def _entry_ms(e: dict[str, Any]) -> int:
    """When an entry was written (its stream id; a live event: its time)."""
    if e.get("id"):
        return int(str(e["id"]).split("-")[0])
    return e.get("at_ms") or 0


def _stream_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = str(entry_id).partition("-")
    return int(ms), int(seq or 0)


#: How often `events --follow` reads the history of the names it follows for the
#: entries that are not published (override, override_end, restart, reset), seconds.
HISTORY_POLL_S = 1.0


def _poll_history(app: App, name: str | None, show: EventPrinter, since_ms: int) -> int:
    """Print the history entries written since the last read of each followed name (one
    pipelined XRANGE per name); how many were printed."""
    names = [name] if name is not None else list(show.last_ids)
    if not names:
        return 0
    after = {n: show.last_ids.get(n) or f"{since_ms}-0" for n in names}
    printed = 0
    for entries in view.read_history_after(app.client, app.prefix, after).values():
        for entry in entries:
            printed += bool(show(entry))
    return printed


class EventPrinter:
    """Prints events as JSON lines or aligned text, each at most once: a history entry by
    its stream id; a transition (the only kind published) also by (name, generation),
    as it may arrive twice (history and channel)."""

    def __init__(self, as_json: bool, width: int, kinds: Sequence[str] = ()) -> None:
        self.as_json, self.width, self.kinds = as_json, width, tuple(kinds)
        self.seen: set[tuple[str, Any]] = set()
        self.newest_ms = 0
        #: per name, the newest history entry id read (where `--follow` polls from)
        self.last_ids: dict[str, str] = {}

    def __call__(self, event: dict[str, Any]) -> bool:
        if event.get("id") and not event.get("error"):
            known = self.last_ids.get(event["name"])
            if not known or _stream_key(event["id"]) > _stream_key(known):
                self.last_ids[event["name"]] = event["id"]
        elif not event.get("error"):
            self.last_ids.setdefault(event["name"], "")
        if self.kinds and not event.get("error") and kind_of(event) not in self.kinds:
            return False
        keys = []
        if event.get("id"):
            keys.append((event["name"], event["id"]))
        if kind_of(event) == "transition" and event["generation"] is not None:
            # the channel's at_ms is when the script ran: the entry's recorded_ms (an
            # override's end stamped earlier), else its at_ms
            keys.append((event["name"], event["generation"],
                         event.get("recorded_ms") or event["at_ms"]))
        if any(k in self.seen for k in keys):
            return False
        self.seen.update(keys)
        self.newest_ms = max(self.newest_ms, _entry_ms(event))
        if self.as_json:
            emit_json(event, lines=True)
        else:
            click.echo(event_line(event, self.width))
        sys.stdout.flush()
        return True


UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)
#: Backoff between reconnection attempts of `events --follow` (seconds, doubling).
RECONNECT_MIN, RECONNECT_MAX = 0.2, 5.0


def follow(app: App, name: str | None, count: int, as_json: bool, max_events: int | None,
           timeout: float | None, kinds: Sequence[str] = ()) -> None:
    """Print the last `count` history entries, then live transitions from the channel,
    until interrupted or a bound is reached. Subscribed before reading the history, so
    no transition falls in between; one seen in both is printed once. The entries that
    are not published (override, restart, reset...) are read from the followed names'
    history every `HISTORY_POLL_S`. When Redis goes
    away it reconnects (as `watch` does, with backoff, saying so on stderr) and prints
    the entries written meanwhile from the history before following again."""
    show: EventPrinter | None = None
    seen, started_ms = 0, 0
    deadline = None if timeout is None else time.monotonic() + timeout
    backoff, down_since = RECONNECT_MIN, None
    first = True

    def left() -> float:
        return 1.0 if deadline is None else deadline - time.monotonic()

    try:
        while (max_events is None or seen < max_events) and left() > 0:
            pubsub = None
            try:
                pubsub = app.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(events_channel(app.prefix))
                if first:
                    show = _replay_history(app, name, count, as_json, kinds)
                    started_ms = show.newest_ms
                    if not as_json:
                        click.echo(f"-- live transitions on {events_channel(app.prefix)} "
                                   "(Ctrl-C to stop)", err=True)
                    first = False
                else:
                    assert show is not None
                    _catch_up(app, name, show, kinds)
                if down_since is not None:
                    click.echo("-- Redis answers again; following", err=True)
                backoff, down_since = RECONNECT_MIN, None
                poll_at = time.monotonic() + HISTORY_POLL_S
                while (max_events is None or seen < max_events) and left() > 0:
                    message = pubsub.get_message(timeout=min(left(), HISTORY_POLL_S))
                    assert show is not None
                    if time.monotonic() >= poll_at:
                        seen += _poll_history(app, name, show, started_ms)
                        poll_at = time.monotonic() + HISTORY_POLL_S
                    if not message or message.get("type") != "message":
                        continue
                    event = view.decode_event_message(message["data"])
                    if event is None or (name is not None and event["name"] != name):
                        continue
                    assert show is not None
                    if show(event):
                        seen += 1
            except UNREACHABLE as exc:
                app.close()  # reconnect on the next attempt
                if down_since is None:
                    down_since = time.monotonic()
                    click.echo(f"-- Redis unreachable ({type(exc).__name__}: {exc}); "
                               "reconnecting", err=True)
                time.sleep(max(0.0, min(backoff, left())))
                backoff = min(RECONNECT_MAX, backoff * 2)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except UNREACHABLE:
                        pass
    except KeyboardInterrupt:
        pass


def _replay_history(app: App, name: str | None, count: int, as_json: bool,
                    kinds: Sequence[str]) -> EventPrinter:
    try:
        history = recent_events(app, name, count, kinds)
    except NotFound as exc:  # no keys yet: follow it all the same (planned maintenance)
        history = []
        if not as_json:
            click.echo(f"{exc.message}; following it anyway", err=True)
    width = name_width([name] if name else [e["name"] for e in history]
                       or _breaker_names(app))
    show = EventPrinter(as_json, width, kinds)
    show.newest_ms = view.server_now_ms(app.client)
    for event in history:
        show(event)
    return show


def _breaker_names(app: App) -> list[str]:
    return sorted(n for n, parts in view.scan_names(app.client, app.prefix).items()
                  if "breaker" in parts)


def _catch_up(app: App, name: str | None, show: EventPrinter, kinds: Sequence[str]) -> None:
    """After a reconnection: the entries written since the newest one printed."""
    since = show.newest_ms
    try:
        missed = recent_events(app, name, 1000, kinds)
    except NotFound:
        return
    for event in missed:
        if not event.get("error") and _entry_ms(event) >= since:
            show(event)


@cli.command("events")
@click.argument("name", required=False, callback=check_name)
@click.option("-n", "--count", default=20, show_default=True, type=click.IntRange(0, 10_000),
              help="How many past history entries to show (0 with --follow: none).")
@click.option("-f", "--follow", "live", is_flag=True,
              help="After the history, print live transitions from every worker.")
@click.option("--max-events", type=click.IntRange(1), help="With --follow: stop after N "
              "live events.")
@click.option("--timeout", type=click.FloatRange(0, min_open=True),
              help="With --follow: stop after S seconds.")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KINDS),
              help="Only history entries of this kind (repeatable; default: every kind).")
@click.option("--shadow", is_flag=True, help="The shadow configs' history of NAME instead "
              "(would-be transitions; shadows set, declared, cleared, expired).")
@click.option("--shadow-name", metavar="SHADOW", help="With --shadow: only SHADOW's.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def events_command(app: App, name: str | None, count: int, live: bool,
                   max_events: int | None, timeout: float | None, kinds: tuple[str, ...],
                   as_json: bool, shadow: bool = False, shadow_name: str | None = None,
                   ) -> None:
    """History (oldest first, local time with its zone): transitions and the entries that
    are not (override, override_end, restart, reset); then live transitions with
    --follow, reconnecting while Redis is unreachable. With --shadow: the shadow
    configs' history of NAME."""
    if shadow or shadow_name:
        from .shadow_cmd import shadow_events

        shadow_events(app, name, count, as_json, shadow_name)
        return
    if live:
        follow(app, name, count, as_json, max_events, timeout, kinds)
        return
    if max_events is not None or timeout is not None:
        raise click.UsageError("--max-events and --timeout only apply with --follow")
    if count == 0:
        raise click.BadParameter("0 only applies with --follow (to skip the history)",
                                 param_hint="'-n' / '--count'")
    events = recent_events(app, name, count, kinds)
    if not events and not as_json:
        click.echo("no history recorded" + (f" for {name!r}" if name else
                   f" under prefix {app.prefix!r}"), err=True)
    show = EventPrinter(as_json, name_width(e["name"] for e in events), kinds)
    for event in events:
        show(event)
