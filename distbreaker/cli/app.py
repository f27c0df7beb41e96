"""The `distbreaker` click group: connection options, error translation, output helpers.

Expected failures (Redis unreachable, authentication, ACL refusal, foreign
data, unknown name) become one line on stderr and exit code 1; click's own
usage errors exit 2. Nothing else is caught: a traceback means a bug.
"""

from __future__ import annotations

import dataclasses
import difflib
import getpass
import importlib
import json
import os
import platform
import re
import socket
import sys
from collections.abc import Iterable
from typing import Any

import click

from .. import __version__
from .._runtime.keys import DEFAULT_PREFIX, SCHEMA_VERSION, validate_name, validate_prefix

# redis-py (and the library's components) are imported where a command needs them, not
# here: importing them costs most of a second on a busy machine, and `--version` or a
# mistyped command should not pay it (scripts/bench_cli_start.py measures it).

SOCKET_TIMEOUT = 5.0


class Failure(click.ClickException):
    """An expected failure: one line on stderr, exit code 1."""

    exit_code = 1


class NotFound(Failure):
    """The name has no keys under the prefix."""


def suggest(wanted: str, known: Iterable[str]) -> str:
    """" Did you mean 'x'?" for the closest known names (empty when none is close)."""
    close = difflib.get_close_matches(wanted, sorted(set(known)), n=3, cutoff=0.6)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


def redact(url: str) -> str:
    """The URL with its password hidden, for messages."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def default_url() -> str:
    from .._runtime.connection import DEFAULT_URL

    return os.environ.get("DISTBREAKER_REDIS_URL") or os.environ.get("REDIS_URL") or DEFAULT_URL


def default_actor() -> str:
    """Who is acting, for the history: user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def default_reason(command: str) -> str:
    """The reason recorded when an operator gives none: which command, from where."""
    return f"{command} from the distbreaker CLI (no --reason given)"


@dataclasses.dataclass
class App:
    """Per-invocation settings and the lazily opened client."""

    url: str
    prefix: str
    _client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect(self.url)
        return self._client

    def close(self) -> None:
        """Close the client; the next use of `client` connects again."""
        if self._client is not None:
            client, self._client = self._client, None
            client.close()


def _options() -> dict[str, Any]:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": SOCKET_TIMEOUT,
            "retry": Retry(NoBackoff(), 0), "health_check_interval": 0}


def connect(url: str) -> Any:
    """A client for `url`, built as the library builds one from the same URL.

    ``redis+sentinel://`` (and ``rediss+sentinel://``) URLs go through Sentinel
    (the primary is looked up on the first command); any other URL names one
    server, and a server in cluster mode is used through a RedisCluster client.
    """
    import redis

    from .._runtime.connection import parse_sentinel_url, sync_client

    try:
        if parse_sentinel_url(url) is not None:
            client = sync_client(url, SOCKET_TIMEOUT)
            return client
        client = redis.Redis.from_url(url, **_options())
    except ValueError as exc:
        raise click.UsageError(f"bad --url {redact(url)!r}: {exc}") from None
    try:
        info = client.info("cluster")
    except redis.exceptions.NoPermissionError:  # a user without INFO: assume standalone
        return client
    if str(info.get("cluster_enabled", 0)) == "1":
        client.close()
        from redis.cluster import RedisCluster

        client = RedisCluster.from_url(url, socket_timeout=SOCKET_TIMEOUT,
                                       socket_connect_timeout=SOCKET_TIMEOUT)
    return client


def explain(exc: BaseException, url: str) -> str | None:
    """One clear line for an expected failure, None for anything else."""
    import redis
    from redis.sentinel import MasterNotFoundError

    from .._runtime.connection import parse_sentinel_url
    from .._runtime.outages import ACL, NOT_REDIS, cause_of
    from .._runtime.scripts import MALFORMED, raised_by_redis_py
    from ..errors import SchemaError

    where = redact(url)
    msg = str(exc).strip().rstrip(".")
    cause = cause_of(exc)
    if cause is None and isinstance(exc, MALFORMED) and raised_by_redis_py(exc):
        cause = NOT_REDIS  # redis-py choking on a reply: what answers is not Redis
    if cause is not None and cause is not ACL:  # a refusal or misdirection: cause and fix
        return f"{cause.what} ({where}: {msg}); fix: {cause.fix}"
    if isinstance(exc, redis.AuthenticationError) or re.match(r"(WRONGPASS|NOAUTH)", msg):
        return f"authentication failed at {where}: {msg}"
    if isinstance(exc, MasterNotFoundError):
        spec = parse_sentinel_url(url)
        service = spec.service if spec is not None else "?"
        return (f"no sentinel at {where} named a reachable primary for service {service!r} "
                "(the sentinels are down, or do not monitor that service)")
    if isinstance(exc, redis.TimeoutError):
        return f"Redis at {where} did not answer within {SOCKET_TIMEOUT:g}s: {msg}"
    if isinstance(exc, redis.ConnectionError):
        return f"cannot reach Redis at {where}: {msg}"
    if isinstance(exc, redis.exceptions.NoPermissionError) or msg.startswith("NOPERM"):
        return f"the Redis ACL user may not do this: {msg}"
    if isinstance(exc, SchemaError):
        return f"foreign data under the prefix: {msg}"
    if isinstance(exc, redis.ResponseError) and msg.startswith("WRONGTYPE"):
        return f"a distbreaker key holds the wrong type: {msg}"
    if isinstance(exc, redis.RedisError):
        return f"Redis error at {where}: {msg}"
    return None


# Every command and the module of distbreaker.cli that defines it: a command's module
# is imported only when that command runs (or help lists them all), so `--version` and
# `ls` import what they use and no more. tests/unit/test_cli_lazy.py checks this table
# against what the modules register.
COMMAND_MODULES: dict[str, str] = {
    "ls": "views", "show": "views", "events": "views", "watch": "watch",
    "open": "actions", "trip": "actions", "disable": "actions", "metrics-only": "actions",
    "close": "actions", "reset": "actions", "release-stale": "actions", "config": "actions",
    "doctor": "doctor", "ganesha": "ganesha_cmd", "dashboard": "dashboard_cmd",
    "demo": "demo_cmd", "inject": "inject_cmd", "limit": "limit_cmd", "pool": "pool_cmd",
    "record": "record_cmd", "replay": "replay_cmd", "shadow": "shadow_cmd",
}


class Group(click.Group):
    """Translates expected failures of any subcommand into one line and exit 1,
    suggests the closest command for a mistyped one (on every click version), and
    imports a command's module when the command is first asked for."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMAND_MODULES.get(cmd_name)
        if module is not None and cmd_name not in self.commands:
            importlib.import_module(f"{__package__}.{module}")
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(COMMAND_MODULES))

    def load_all(self) -> dict[str, click.Command]:
        """Every command, all modules imported (for docs and tests)."""
        for module in sorted(set(COMMAND_MODULES.values())):
            importlib.import_module(f"{__package__}.{module}")
        return dict(self.commands)

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if (name and not name.startswith("-") and not ctx.resilient_parsing
                and self.get_command(ctx, name) is None):
            raise click.UsageError(f"No such command {name!r}."
                                   f"{suggest(name, self.list_commands(ctx))}",
                                   ctx)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            app = ctx.find_object(App)
            line = explain(exc, app.url if app else "")
            if line is None:
                raise
            raise Failure(line) from None
        finally:
            app = ctx.find_object(App)
            if app is not None:
                app.close()


def check_name(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """click callback: a valid protected name (or None)."""
    if value is None:
        return None
    try:
        return validate_name(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def check_prefix(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return validate_prefix(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        redis_py = version("redis")  # its metadata: importing redis-py costs ~0.2 s
    except PackageNotFoundError:
        import redis

        redis_py = redis.__version__
    return (f"distbreaker {__version__} (key schema v{SCHEMA_VERSION}, redis-py "
            f"{redis_py}, Python {platform.python_version()})")


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(version_text())
        ctx.exit(0)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version, help="Show the version and exit.")
@click.option("--url", default=default_url, show_default="$DISTBREAKER_REDIS_URL, "
              "$REDIS_URL, redis://localhost:6379/0",
              help="Redis URL, as the library takes it: redis://, rediss:// (TLS), unix://, "
              "redis+sentinel://host[:port][,host...]/service[/db]; a cluster node's URL "
              "is used as a cluster. ACL user and password go here.")
@click.option("--prefix", default=DEFAULT_PREFIX, show_default=True, callback=check_prefix,
              help="Key prefix the breakers were created with.")
@click.pass_context
def cli(ctx: click.Context, url: str, prefix: str) -> None:
    """Inspect and operate distbreaker's fleet-wide breakers, bulkheads and retry budgets."""
    ctx.obj = App(url=url, prefix=prefix)


def emit_json(value: Any, lines: bool = False) -> None:
    """Stable JSON on stdout: sorted keys; `lines` for one compact object per line."""
    if lines:
        click.echo(json.dumps(value, sort_keys=True, separators=(",", ":")))
    else:
        click.echo(json.dumps(value, sort_keys=True, indent=2))


def _import_redis_without_otel() -> None:
    """Import redis-py with the OpenTelemetry SDK hidden, when it is not loaded yet.

    redis-py 7+ imports the OpenTelemetry SDK at import time when it is installed
    (the `otel` extra), only to note that it is available: a tenth of a second of
    every command's start. The CLI never turns redis-py's own metrics on, so its
    process imports redis-py without it; the SDK stays importable afterwards.
    """
    if "redis" in sys.modules or "opentelemetry" in sys.modules:
        return
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # import fails: skipped
    try:
        import redis  # noqa: F401
    except ImportError:  # a redis-py that needs the SDK after all: import it as usual
        for module in [m for m in sys.modules if m == "redis" or m.startswith("redis.")]:
            del sys.modules[module]
    finally:
        del sys.modules["opentelemetry"]


def main() -> None:
    """Console-script entry point (`distbreaker`, `python -m distbreaker`)."""
    if len(sys.argv) > 1 and sys.argv[1] not in ("--version", "-h", "--help"):
        _import_redis_without_otel()
    cli(prog_name="distbreaker")
