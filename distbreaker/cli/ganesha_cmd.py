"""`distbreaker ganesha ...`: list, show and reset services of a PHP Ganesha fleet.

Ganesha's keys are `{prefix}{service}{suffix}` (see distbreaker.ganesha); the
status key marks a service. Reading never trims or writes (Ganesha's own
readers trim); reset deletes the service's four keys, which Ganesha reads as
a calmed-down service with an empty window.
"""

from __future__ import annotations

import time
from typing import Any

import click

from .._runtime.scripts import text
from ..ganesha.config import GaneshaConfig
from .app import App, NotFound, cli, emit_json


def _config(prefix: str) -> GaneshaConfig:
    try:
        return GaneshaConfig(prefix=prefix)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--ganesha-prefix") from None


def _glob(value: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)


def _services(client: Any, config: GaneshaConfig) -> list[str]:
    pattern = _glob(config.prefix) + "*" + _glob(config.status_suffix)
    found = set()
    for key in client.scan_iter(match=pattern, count=500):
        key = text(key)
        service = key[len(config.prefix):len(key) - len(config.status_suffix)]
        if service:
            found.add(service)
    return sorted(found)


def _describe(client: Any, config: GaneshaConfig, service: str) -> dict[str, Any]:
    success, failure, rejection, status = config.keys(service)
    pipe = client.pipeline(transaction=False)
    for key in (success, failure, rejection):
        pipe.zcard(key)
    pipe.zrevrange(failure, 0, 0)
    pipe.get(status)
    s, f, r, newest, state = pipe.execute()
    last = None
    if newest:
        digits = ""
        for ch in text(newest[0]):
            if not ch.isdigit():
                break
            digits += ch
        last = int(digits) if digits else None
    return {"service": service, "status": {"1": "calmed_down", "2": "tripped"}.get(
        text(state) if state is not None else "1", text(state)),
        "successes": s, "failures": f, "rejections": r, "last_failure_at": last,
        "seconds_since_last_failure": (int(time.time()) - last) if last else None}


@cli.group("ganesha")
@click.option("--ganesha-prefix", default="ganesha_", show_default=True,
              help="The PHP Ganesha Redis adapter's key prefix.")
@click.pass_context
def ganesha(ctx: click.Context, ganesha_prefix: str) -> None:
    """Services of an existing PHP Ganesha fleet (Rate strategy, Redis adapter)."""
    ctx.meta["ganesha_config"] = _config(ganesha_prefix)


@ganesha.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def ganesha_ls(ctx: click.Context, as_json: bool) -> None:
    """Every Ganesha service under the prefix (counts are as stored, untrimmed)."""
    app: App = ctx.find_object(App)
    config: GaneshaConfig = ctx.meta["ganesha_config"]
    rows = [_describe(app.client, config, s) for s in _services(app.client, config)]
    if as_json:
        emit_json(rows)
        return
    click.echo(f"{'SERVICE':30} {'STATUS':12} {'FAIL':>6} {'OK':>6} {'REJ':>6}")
    for row in rows:
        click.echo(f"{row['service']:30} {row['status']:12} {row['failures']:>6} "
                   f"{row['successes']:>6} {row['rejections']:>6}")


@ganesha.command("show")
@click.argument("service")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def ganesha_show(ctx: click.Context, service: str, as_json: bool) -> None:
    """One Ganesha service: status, stored counts, last failure."""
    app: App = ctx.find_object(App)
    config: GaneshaConfig = ctx.meta["ganesha_config"]
    if not any(app.client.exists(key) for key in config.keys(service)):
        raise NotFound(f"unknown Ganesha service {service!r} under prefix {config.prefix!r}")
    row = _describe(app.client, config, service)
    if as_json:
        emit_json(row)
        return
    for key, value in row.items():
        click.echo(f"{key}: {value}")


@ganesha.command("reset")
@click.argument("service")
@click.option("--yes", is_flag=True, help="Confirm: delete the service's keys.")
@click.pass_context
def ganesha_reset(ctx: click.Context, service: str, yes: bool) -> None:
    """Delete the service's Ganesha keys (it reads as calmed down with an empty window)."""
    if not yes:
        raise click.UsageError("reset deletes the service's keys: add --yes to confirm")
    app: App = ctx.find_object(App)
    config: GaneshaConfig = ctx.meta["ganesha_config"]
    deleted = sum(app.client.delete(key) for key in config.keys(service))
    if not deleted:
        raise NotFound(f"unknown Ganesha service {service!r} under prefix {config.prefix!r}")
    click.echo(f"deleted {deleted} key(s) of Ganesha service {service!r}")
