"""`distbreaker shadow`: set, clear and list a breaker's shadow configs.

A shadow is a candidate config fed the live outcomes of the whole fleet without
deciding anything (docs/guides/shadow.md); the action is `operate.set_shadow` /
`clear_shadow`, one script call each, recorded with actor and reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .. import operate
from .. import readside as view
from .._runtime.keys import BreakerKeys
from ..breaker.shadow import MAX_SHADOWS, shadow_history_key, validate_shadow_name
from ..breaker.shadow import shadow_key as shadows_key
from ..registry.config import KINDS, RegistryConfigError, canonical_field, convert, load_file
from .actions import did_you_mean, parse_duration
from .app import App, NotFound, check_name, cli, default_actor, default_reason, emit_json
from .fmt import clock, coloured, printable


def candidate_changes(path: str) -> dict[str, Any]:
    """The breaker settings a candidate file (YAML, TOML or JSON) changes, by their
    canonical names, values converted as the registry converts them."""
    kind = KINDS["breaker"]
    known = kind.fields()
    changes: dict[str, Any] = {}
    for given, value in load_file(path).items():
        field = canonical_field(kind, str(given))
        if field is None or field == "shadow" or field not in known or field in (
                "base_config", "critical", "fail_readiness_when_open"):
            raise RegistryConfigError(path, "", str(given), "not a breaker setting")
        try:
            changes[field] = convert(known[field], value)
        except ValueError as error:
            raise RegistryConfigError(path, "", field, str(error)) from None
    return changes


def require_breaker(app: App, name: str) -> None:
    """NotFound (exit 1, with the closest names) for a name without a breaker: a
    mistyped name must not read as "no shadows"."""
    keys = BreakerKeys.build(name, app.prefix)
    if not app.client.exists(keys.state, shadows_key(keys.state)):
        known = operate.breaker_names(app.client, app.prefix)
        raise NotFound(f"unknown breaker {name!r} under prefix {app.prefix!r}"
                       + did_you_mean(operate.close_names(name, known)))


def local_clock(ms: int) -> str:
    """A server time in the local zone, without the date (summaries)."""
    return clock(ms, date=False)


def shadow_lines(shadows: list[dict[str, Any]], indent: str = "") -> list[str]:
    """Each shadow in two lines: what it is, and what it would have done."""
    lines = []
    for s in shadows:
        ends = f"until {clock(s['until_ms'])}" if s["until_ms"] else "no end"
        who = (f"by {printable(s['actor'])}" if s["actor"] else s["source"]) + (
            f": {printable(s['reason'])}" if s["reason"] and s["source"] == "operator" else "")
        rate = f"{s['failure_rate']}%" if s["failure_rate"] >= 0 else "-"
        lines.append(f"{indent}{s['name']}: would be {coloured(s['state'])}; window "
                     f"{s['calls']} calls, {s['failures']} failed ({rate}); {ends}; set "
                     f"{clock(s['set_at_ms'], date=False)} {who}")
        lines.append(f"{indent}  {s['summary']}")
        lines.append(f"{indent}  wire {s['wire']}")
    return lines


@cli.command("shadow")
@click.argument("name", callback=check_name)
@click.option("--config", "config_path", metavar="FILE",
              help="A candidate config: the breaker settings that differ from the config "
              "in force (YAML, TOML or JSON), e.g. `failure_rate_threshold: 30`.")
@click.option("--as", "shadow", metavar="SHADOW", help="The shadow's name (default: the "
              "config file's name without its suffix; with --off: every shadow).")
@click.option("--for", "for_text", metavar="DURATION", help="Drop the shadow after DURATION "
              "(1h, 30m, PT2H), by Redis server time (default: until --off).")
@click.option("--off", is_flag=True, help="Remove the shadow (or every shadow of NAME).")
@click.option("--reason", help="Why (recorded in the shadows' history).")
@click.option("--actor", default=default_actor, show_default="user@host",
              help="Who (recorded in the shadows' history).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def shadow_command(app: App, name: str, config_path: str | None, shadow: str | None,
                   for_text: str | None, off: bool, reason: str | None, actor: str,
                   as_json: bool) -> None:
    """Shadow configs of NAME: with --config, evaluate a candidate config on the live
    outcomes of the whole fleet (it never rejects a call); with --off, remove it; with
    neither, list them. At most 3 per breaker. `events --shadow NAME` shows
    their would-be transitions."""
    if config_path and off:
        raise click.UsageError("give --config or --off, not both")
    if for_text and not config_path:
        raise click.UsageError("--for applies with --config")
    why = reason or default_reason("shadow")
    if off:
        try:
            if shadow is not None:
                validate_shadow_name(shadow)
        except ValueError as exc:
            raise click.UsageError(f"--as: {exc}") from None
        require_breaker(app, name)
        result = operate.clear_shadow(app.client, app.prefix, name, shadow, why, actor)
        if as_json:
            emit_json(result, lines=True)
        elif not result["cleared"]:
            click.echo(f"{name}: no shadow {shadow!r}" if shadow else f"{name}: no shadows")
        else:
            for cleared in result["cleared"]:
                click.echo(f"{name}: shadow {cleared} removed ({result['summaries'][cleared]})")
        return
    if config_path:
        shadow = shadow or Path(config_path).stem
        try:
            changes = candidate_changes(config_path)
            for_ = parse_duration(for_text) if for_text else None
            result = operate.set_shadow(app.client, app.prefix, name, shadow, changes, why,
                                        actor, for_=for_)
        except operate.UnknownBreaker as exc:
            raise NotFound(f"unknown breaker {name!r} under prefix {app.prefix!r}"
                           + did_you_mean(exc.suggestions)) from None
        except RegistryConfigError as exc:
            raise click.UsageError(str(exc)) from None
        except UnicodeDecodeError:
            raise click.UsageError(f"{config_path}: not UTF-8 text") from None
        except ValueError as exc:  # an option's, or the candidate file's
            raise click.UsageError(str(exc) if str(exc).startswith("--")
                                   else f"{config_path}: {exc}") from None
        if as_json:
            emit_json(result, lines=True)
            return
        changed = ", ".join(f"{c['field']} {c['in_force']} -> {c['candidate']}"
                            for c in result["changes"]) or "the same as the config in force"
        ends = f"until {clock(result['until_ms'])}" if result["until_ms"] else "until --off"
        click.echo(f"{name}: shadow {shadow} set ({changed}); fed every live outcome {ends}; "
                   f"{result['shadows']} of {MAX_SHADOWS} shadows")
        return
    shadows = view.read_shadows(app.client, app.prefix, name,
                                clock=None if as_json else local_clock)
    if not shadows:
        require_breaker(app, name)
    if as_json:
        emit_json({"name": name, "shadows": shadows})
        return
    if not shadows:
        click.echo(f"{name}: no shadow configs (distbreaker shadow {name} --config FILE)")
        return
    click.echo("\n".join([f"{name}: {len(shadows)} shadow config(s)",
                          *shadow_lines(shadows, "  ")]))


def shadow_events(app: App, name: str | None, count: int, as_json: bool,
                  shadow: str | None) -> None:
    """`events --shadow NAME`: the shadows' history of NAME, oldest first."""
    from ..breaker.shadow import describe_event

    if name is None:
        raise click.UsageError("--shadow needs a NAME")
    events = view.read_shadow_history(app.client, app.prefix, name, count, shadow)
    if not events:
        keys = BreakerKeys.build(name, app.prefix)
        if not app.client.exists(shadow_history_key(keys.state)):
            require_breaker(app, name)
    if not events and not as_json:
        click.echo(f"no shadow history recorded for {name!r}", err=True)
    for event in events:
        if as_json:
            emit_json(event, lines=True)
        else:
            click.echo(f"{clock(event.get('at_ms'))}  {name}  "
                       f"{printable(describe_event(event, local_clock))}")
