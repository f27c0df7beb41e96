"""`distbreaker demo`: the fleet demo (see `distbreaker.demo`) from the CLI.

The group's `--url` counts only when given on the command line or through
$DISTBREAKER_REDIS_URL / $REDIS_URL; otherwise the demo starts its own Redis
(the group's default localhost URL would point at the user's real Redis).
"""

from __future__ import annotations

import os

import click

from .app import App, check_name, cli


@cli.command("demo")
@click.option("--workers", default=4, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes per fleet (WITH distbreaker, and WITHOUT).")
@click.option("--duration", default=30.0, show_default=True, type=click.FloatRange(4, 600),
              help="Seconds of the upstream's timeline: ok, failing, slow, recovering.")
@click.option("--name", default="payments", show_default=True, callback=check_name,
              help="Breaker name.")
@click.option("--json", "as_json", is_flag=True,
              help="Result as JSON on stdout (the live timeline goes to stderr).")
@click.option("--plot", "plot_path", metavar="FILE.png", help="Draw the timeline (matplotlib).")
@click.pass_context
def demo_command(ctx: click.Context, workers: int, duration: float, name: str,
                 as_json: bool, plot_path: str | None) -> None:
    """A fleet sharing one breaker vs. the same fleet with naive retries (flaky upstream).

    Starts an embedded Redis unless --url, $DISTBREAKER_REDIS_URL or $REDIS_URL
    names one. Exit code 0 when the breaker tripped once, every worker failed
    fast, the upstream got at least 3x fewer calls and the breaker closed again.
    """
    from ..demo import fleet as demo

    app = ctx.find_object(App)
    parent = ctx.parent
    given = parent is not None and \
        parent.get_parameter_source("url") is click.core.ParameterSource.COMMANDLINE
    url = app.url if app is not None and (
        given or os.environ.get("DISTBREAKER_REDIS_URL") or os.environ.get("REDIS_URL")) \
        else None
    prefix = app.prefix if app is not None else "distbreaker"
    code = demo.run(workers, duration, name, url=url, prefix=prefix, as_json=as_json,
                    plot_path=plot_path)
    ctx.exit(code)
