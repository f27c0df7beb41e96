"""`distbreaker replay`: a recorded timeline against candidate configs, on the real
breaker script run by a throwaway redis-server (docs/guides/tuning.md).

Loading configs (a registry file or a plain mapping of BreakerConfig fields), sweeps
and printing are here; the replay itself is `recording.replay` over the pure
`recording.replay_core`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from ..breaker.config import BreakerConfig
from ..recording import report
from ..recording.replay import Replayer
from ..recording.replay_core import ReplayResult, Truth, parse_sweep, sweep_changes, weights
from ..recording.timeline import TimelineError, read_jsonl
from ..registry.config import RegistryConfigError, RegistrySpec, convert, load_file
from .app import Failure, cli, emit_json

_FIELDS = {f.name: str(f.type) for f in dataclasses.fields(BreakerConfig)}


def load_config(path: str, name: str) -> BreakerConfig:
    """`path`'s config for breaker `name`: a registry file (``breakers:`` section: the
    instance `name`, or the default config) or a mapping of BreakerConfig fields. The
    environment does not override it (a replay is about the file)."""
    data = load_file(path)
    if "breakers" not in data:
        data = {"breakers": {"configs": {"default": dict(data)}}}
    spec = RegistrySpec(data, source=path, environ={})
    return spec.resolve("breaker", name).config  # type: ignore[no-any-return]


def with_changes(config: BreakerConfig, changes: dict[str, Any]) -> BreakerConfig:
    fields = {}
    for field, value in changes.items():
        if field not in _FIELDS:
            raise click.UsageError(f"--sweep: BreakerConfig has no field {field!r}")
        try:
            fields[field] = convert(_FIELDS[field], value)
        except ValueError as exc:
            raise click.UsageError(f"--sweep {field}: {exc}") from None
    try:
        return config.replace(**fields)
    except ValueError as exc:
        raise click.UsageError(f"--sweep: {exc}") from None


#: The most truth buckets a replay judges with (timeline span / --truth-window).
MAX_BUCKETS = 10_000_000


def _finite(param: Any, value: float) -> float:
    """click callback: NaN passes FloatRange's bounds; refuse it."""
    if math.isnan(value):
        raise click.BadParameter("must be a number, got nan", param=param)
    return value


@contextlib.contextmanager
def throwaway_redis() -> Iterator[Any]:
    """A client of a fresh local redis-server (fakeredis when none is installed): the
    replay never writes to a Redis of the fleet."""
    import redis

    from ..demo.embedded import FakeRedisServer, RedisServer

    server: Any = RedisServer() if shutil.which("redis-server") else FakeRedisServer()
    server.start()
    client = redis.Redis.from_url(server.url)
    try:
        yield client
    finally:
        client.close()
        server.stop()


@cli.command("replay")
@click.argument("timeline", type=click.File("r"))
@click.option("--config", "configs", multiple=True, metavar="FILE",
              help="A candidate config (YAML/TOML/JSON: a registry file or BreakerConfig "
              "fields); repeat to compare. Default: BreakerConfig's defaults.")
@click.option("--sweep", "sweeps", multiple=True, metavar="FIELD=FROM..TO:STEP",
              help="Replay the (first) config with FIELD at each value, e.g. "
              "failure_rate_threshold=30..70:10 or wait_duration_in_open_state=10,30,60.")
@click.option("--target-failure-rate", "target", type=click.FloatRange(0, 100),
              default=20.0, show_default=True, callback=lambda c, p, v: _finite(p, v),
              help="Percent: a trip while the recorded failure rate was under it is false; "
              "a stretch at or above it is an incident to detect.")
@click.option("--truth-window", type=click.FloatRange(0.001, 86_400), default=5.0,
              show_default=True, callback=lambda c, p, v: _finite(p, v),
              help="Seconds: the buckets the recorded failure rate is judged in.")
@click.option("--truth-min-calls", type=click.IntRange(1), default=10, show_default=True,
              help="Calls a bucket needs to judge the failure rate (fewer: the previous "
              "bucket's rate stands).")
@click.option("--name", help="The breaker's name in registry files (default: the "
              "timeline's).")
@click.option("--no-scale", is_flag=True, help="Replay each sample as one call (default: "
              "as 1 / its sample rate calls).")
@click.option("--plot", "plot", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              help="Plot the states over time: in the terminal, or as a PNG to FILE "
              "(needs the `plot` extra).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def replay_command(timeline: Any, configs: tuple[str, ...], sweeps: tuple[str, ...],
                   target: float, truth_window: float, truth_min_calls: int,
                   name: str | None, no_scale: bool,
                   plot: str | None, as_json: bool) -> None:
    """What each config would have done with a recorded timeline (JSONL from
    `distbreaker record export`): trips, time open, calls rejected, failures let
    through, false trips, time to detect."""
    try:
        samples = read_jsonl(timeline)
    except TimelineError as exc:
        raise Failure(f"{timeline.name}: {exc}") from None
    if not samples:
        raise Failure(f"{timeline.name}: no samples")
    span_s = (samples[-1].t_ms - samples[0].t_ms) / 1000
    if span_s / truth_window > MAX_BUCKETS:
        raise Failure(f"{timeline.name}: the timeline spans {span_s:.0f}s, more than "
                      f"{MAX_BUCKETS:,} buckets of --truth-window {truth_window:g}s: widen "
                      "--truth-window, or cut the timeline")
    name = name or samples[0].name or "replay"
    try:
        stems = [Path(p).stem for p in configs]
        candidates = [(stem if stems.count(stem) == 1 else p, load_config(p, name))
                      for stem, p in zip(stems, configs, strict=True)] \
            or [("defaults", BreakerConfig())]
        parsed = [parse_sweep(s) for s in sweeps]
    except (RegistryConfigError, ValueError, OSError) as exc:
        raise click.UsageError(str(exc)) from None
    runs: list[tuple[str, BreakerConfig, dict[str, Any]]] = []
    if parsed:
        base = candidates[0][1]
        for changes in sweep_changes(parsed):
            label = " ".join(f"{k}={v}" for k, v in changes.items())
            runs.append((label, with_changes(base, changes), changes))
    else:
        runs = [(label, config, {}) for label, config in candidates]
    truth_ms = max(1, round(truth_window * 1000))
    results: list[ReplayResult] = []
    with throwaway_redis() as client:
        replayer = Replayer(client)
        for label, config, changes in runs:
            results.append(replayer.run(samples, config, target=target,
                                        truth_window_ms=truth_ms,
                                        truth_min_calls=truth_min_calls, scale=not no_scale,
                                        label=label, changes=changes))
    truth = Truth(samples, weights(samples, not no_scale), truth_ms, truth_min_calls)
    if plot and plot != "-":
        try:
            report.png_plot(plot, results, truth, target)
        except RuntimeError as exc:
            raise Failure(str(exc)) from None
        except OSError as exc:
            raise Failure(f"--plot {plot}: cannot write it: {exc.strerror or exc}") from None
    if as_json:
        emit_json({"target_failure_rate": target, "samples": len(samples),
                   "truth_window_s": truth_window,
                   "results": [r.to_json() for r in results]})
        return
    click.echo(f"{len(samples)} samples over {(samples[-1].t_ms - samples[0].t_ms) / 1000:.0f}s,"
               f" target failure rate {target:g}%")
    click.echo(report.table(results))
    if plot == "-":
        click.echo("")
        click.echo(report.terminal_plot(results, truth, target))
    elif plot:
        click.echo(f"plot written to {plot}", err=True)
    sys.stdout.flush()
