"""The `distbreaker` click group: connection options, error translation, output helpers.

Expected failures (Redis unreachable, authentication, ACL refusal, foreign
data, unknown name) become one line on stderr and exit code 1; click's own
usage errors exit 2. Nothing else is caught: a traceback means a bug.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import re
import socket
from typing import Any

import click
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .._runtime.connection import DEFAULT_URL
from .._runtime.keys import DEFAULT_PREFIX, validate_name, validate_prefix
from ..errors import SchemaError

SOCKET_TIMEOUT = 5.0


class Failure(click.ClickException):
    """An expected failure: one line on stderr, exit code 1."""

    exit_code = 1


class NotFound(Failure):
    """The name has no keys under the prefix."""


def redact(url: str) -> str:
    """The URL with its password hidden, for messages."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def default_url() -> str:
    return os.environ.get("DISTBREAKER_REDIS_URL") or os.environ.get("REDIS_URL") or DEFAULT_URL


def default_actor() -> str:
    """Who is acting, for the history: user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


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
        if self._client is not None:
            self._client.close()


def _options() -> dict[str, Any]:
    return {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": SOCKET_TIMEOUT,
            "retry": Retry(NoBackoff(), 0), "health_check_interval": 0}


def connect(url: str) -> Any:
    """A client for `url`: a RedisCluster client when the server runs in cluster mode."""
    try:
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
    where = redact(url)
    msg = str(exc).strip().rstrip(".")
    if isinstance(exc, redis.AuthenticationError) or re.match(r"(WRONGPASS|NOAUTH)", msg):
        return f"authentication failed at {where}: {msg}"
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


class Group(click.Group):
    """Translates expected failures of any subcommand into one line and exit 1."""

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


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", default=default_url, show_default="$DISTBREAKER_REDIS_URL, "
              "$REDIS_URL, redis://localhost:6379/0",
              help="Redis URL; TLS (rediss://), ACL user and password go here.")
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


def main() -> None:
    """Console-script entry point (`distbreaker`, `python -m distbreaker`)."""
    cli(prog_name="distbreaker")
