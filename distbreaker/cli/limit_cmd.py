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
@click.pass_obj
def limit_command(app: App, name: str, limit_for_period: int | None, refresh: str | None,
                  burst: int | None, reset: bool, reason: str | None, actor: str,
                  as_json: bool) -> None:
    """Change rate limiter NAME's limit fleet-wide, at once: it governs every worker,
    whatever its own config, until `limit NAME --reset` or the key expires (a keyed
    instance is NAME:KEY). `ls` and `show` mark an operator's limit with !."""
    if reset == any(v is not None for v in (limit_for_period, refresh, burst)):
        raise click.UsageError("give --limit-for-period / --refresh / --burst, or --reset")
    try:
        period = to_seconds(refresh, "--refresh", positive=True) if refresh else None
        result = operate.change_limit(app.client, app.prefix, name,
                                      reason or default_reason("limit"), actor,
                                      limit_for_period=limit_for_period, refresh=period,
                                      burst=burst, reset=reset)
    except operate.UnknownLimiter as exc:
        from .actions import did_you_mean

        raise NotFound(f"unknown rate limiter {name!r} under prefix {app.prefix!r}"
                       + did_you_mean(exc.suggestions)) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        emit_json(result, lines=True)
    else:
        click.echo(limit_text(result))
