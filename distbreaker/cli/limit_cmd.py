"""`distbreaker limit NAME`: a rate limiter's limit changed fleet-wide at run time.

The change itself is `operate.change_limit` (one script call, recorded with actor and
reason in the limiter's hash); this module parses options and prints the result.
"""

from __future__ import annotations

from typing import Any

import click

from .. import operate
from .._runtime.options import to_seconds
from .app import App, NotFound, check_name, cli, default_actor, default_reason, emit_json
from .fmt import duration


def limit_text(r: dict[str, Any]) -> str:
    """'llm: limit 50 -> 20 per 1s (burst 20)  (limit by dana@box: quota cut)'."""
    was = r["previous"]

    def shape(limit: Any, period_ms: Any, burst: Any) -> str:
        per = duration((period_ms or 0) / 1000)
        return f"{limit} per {per}" + (f" (burst {burst})" if burst != limit else "")

    now = shape(r["limit_for_period"], r["limit_refresh_period_ms"], r["burst"])
    head = (f"limit {shape(was['limit_for_period'], was['limit_refresh_period_ms'], was['burst'])}"
            f" -> {now}")
    if r["action"] == "limit_reset":
        head = (f"operator limit dropped: each worker's own config governs again "
                f"({now} as last sent by a worker)")
    by = f"by {r['actor']}" if r["actor"] else "by an unnamed operator"
    return f"{r['name']}: {head}  ({r['action']} {by}: {r['reason']})"


@cli.command("limit")
@click.argument("name", callback=check_name)
@click.option("--limit-for-period", type=click.IntRange(1), metavar="N",
              help="Permits per period, fleet-wide (Resilience4j's changeLimitForPeriod).")
@click.option("--refresh", metavar="DURATION", help="The period (limit_refresh_period): "
              "1s, 500ms, 1m, PT1M.")
@click.option("--burst", type=click.IntRange(1), help="The bucket in permits (default: "
              "follows the limit when it did).")
@click.option("--reset", "reset", is_flag=True, help="Drop the operator's limit: each "
              "worker's own config governs again.")
@click.option("--reason", help="Why (stored with the limit; default: which command, "
              "from the CLI).")
@click.option("--actor", default=default_actor, show_default="user@host",
              help="Who (stored with the limit).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output "
              "(docs/CLI_JSON.md).")
@click.option("--dry-run", is_flag=True, help="Only list the rate limiters a selector "
              "matches, with their limits now; change nothing.")
@click.option("--yes", is_flag=True, help="Change every rate limiter a selector matches "
              "without asking.")
@click.option("--confirm-over", type=click.IntRange(0), default=None, show_default="10, "
              "or $DISTBREAKER_CONFIRM_OVER", help="A selector matching more names than "
              "this asks first.")
@click.option("--exact", is_flag=True, help="NAME is one name even when it holds * ? or [.")
@click.pass_obj
def limit_command(app: App, name: str, limit_for_period: int | None, refresh: str | None,
                  burst: int | None, reset: bool, reason: str | None, actor: str,
                  as_json: bool, dry_run: bool, yes: bool, confirm_over: int | None,
                  exact: bool) -> None:
    """Change rate limiter NAME's limit fleet-wide, at once: it governs every worker,
    whatever its own config, until `limit NAME --reset` or the key expires (a keyed
    instance is NAME:KEY; a NAME with * ? or [ selects every matching one, as the
    breaker actions do). `ls` and `show` mark an operator's limit with !."""
    from .. import readside as view
    from .actions import confirm_many, confirm_over_default, did_you_mean

    if reset == any(v is not None for v in (limit_for_period, refresh, burst)):
        raise click.UsageError("give --limit-for-period / --refresh / --burst, or --reset")
    names = [name]
    selector = view.is_selector(name) and not exact
    if selector:
        known = [n for n, parts in view.scan_names(app.client, app.prefix).items()
                 if "rate_limiter" in parts]
        names = view.matching(known, [name])
        if not names:
            raise NotFound(f"no rate limiter under prefix {app.prefix!r} matches {name!r}")
        if dry_run:
            for row in view.read_summaries(app.client, app.prefix,
                                           {n: {"rate_limiter"} for n in names}):
                rl = row["rate_limiter"] or {}
                plan = {"name": row["name"], "action": "limit_reset" if reset else "limit",
                        "dry_run": True, "limit_for_period": rl.get("limit_for_period"),
                        "limit_refresh_period_ms": rl.get("limit_refresh_period_ms"),
                        "burst": rl.get("burst"), "overridden": rl.get("overridden"),
                        "error": row["error"]}
                if as_json:
                    emit_json(plan, lines=True)
                else:
                    click.echo(f"{row['name']}: {plan['limit_for_period']} per "
                               f"{duration((plan['limit_refresh_period_ms'] or 0) / 1000)}"
                               + ("!" if plan["overridden"] else "") + "  (would change)")
            if not as_json:
                click.echo(f"dry run: limit would change {len(names)} rate limiter(s) "
                           f"matching {name!r}; nothing was changed", err=True)
            return
        confirm_many("limit", "rate limiters", names, name, yes,
                     confirm_over_default() if confirm_over is None else confirm_over)
    elif dry_run:
        raise click.UsageError("--dry-run applies to a selector (NAME with * ? or [)")
    why = reason or default_reason("limit" + (f" {name}" if selector else ""))
    try:
        period = to_seconds(refresh, "--refresh", positive=True) if refresh else None
        for each in names:
            result = operate.change_limit(app.client, app.prefix, each, why, actor,
                                          limit_for_period=limit_for_period, refresh=period,
                                          burst=burst, reset=reset)
            if as_json:
                emit_json(result, lines=True)
            else:
                click.echo(limit_text(result))
    except operate.UnknownLimiter as exc:
        raise NotFound(f"unknown rate limiter {exc.name!r} under prefix {app.prefix!r}"
                       + did_you_mean(exc.suggestions)) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
