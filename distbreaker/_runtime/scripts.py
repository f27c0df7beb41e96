"""Loading the Lua scripts shipped with the package, running them, decoding their text.

Scripts run with EVALSHA; after NOSCRIPT (Redis restarted, SCRIPT FLUSH) by source
with EVAL, which caches them again. A `PendingCall` is a component's call with its
reply and outage handling; `send` / `send_async` are its one sync and asyncio driver.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from redis.exceptions import AskError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from ..errors import SchemaError
from .health import UNAVAILABLE_ERRORS

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_CANDIDATES = (_PACKAGE_DIR / "lua", _PACKAGE_DIR.parent / "lua")


def lua_dir() -> Path:
    """The folder holding the scripts: ``distbreaker/lua/`` in a wheel, else the source
    tree's top-level ``lua/``."""
    for candidate in _CANDIDATES:
        if (candidate / "breaker.lua").is_file():
            return candidate
    raise FileNotFoundError("distbreaker's lua/ folder is missing from the installation")


@dataclasses.dataclass(frozen=True)
class LuaScript:
    """One script: its file name, source text and SHA1 (the EVALSHA handle)."""

    name: str
    source: str
    sha: str


@functools.cache
def load_script(name: str) -> LuaScript:
    """Read ``lua/<name>.lua`` once per process."""
    source = (lua_dir() / f"{name}.lua").read_text(encoding="utf-8")
    return LuaScript(name, source, hashlib.sha1(source.encode()).hexdigest())


class RedisBusyError(RedisConnectionError):
    """Redis answered but cannot serve us now (BUSY script, MISCONF, NOREPLICAS, ...).

    A ConnectionError subclass, so every front end treats it as "Redis unavailable".
    """


_UNAVAILABLE_REPLIES = ("BUSY", "MISCONF", "NOREPLICAS", "LOADING", "MASTERDOWN", "READONLY")


def translate_error(exc: ResponseError) -> Exception:
    """Turn a script's error reply into the library's own exception type."""
    text = str(exc)
    if isinstance(exc, AskError):  # MOVED/ASK: a plain client talking to a cluster node
        return TypeError(f"Redis answered {type(exc).__name__} ({text}): it is a Redis Cluster "
                         "node; pass a redis.cluster.RedisCluster client as redis=")
    if text.split(" ", 1)[0] in _UNAVAILABLE_REPLIES:
        return RedisBusyError(text)
    marker = "DISTBREAKER_SCHEMA "
    if marker in text:
        detail = text.split(marker, 1)[1].split(" script:", 1)[0].strip()
        key = detail.split(" ", 1)[0]
        return SchemaError(f"foreign or corrupt data: {detail}", key=key)
    if "DISTBREAKER_ARGS " in text:
        return ValueError(text.split("DISTBREAKER_ARGS ", 1)[1].split(" script:", 1)[0])
    if text.startswith("WRONGTYPE"):
        return SchemaError(f"a distbreaker key holds the wrong type: {text}")
    return exc


def _raise_translated(exc: ResponseError) -> NoReturn:
    translated = translate_error(exc)
    if translated is exc:
        raise exc
    raise translated from exc


def run_script(client: Any, script: LuaScript, keys: Sequence[str],
               args: Sequence[Any]) -> Any:
    """Run a script on a sync redis-py client, reloading it after NOSCRIPT."""
    try:
        try:
            return client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(script.source, len(keys), *keys, *args)
    except ResponseError as exc:
        _raise_translated(exc)


async def run_script_async(client: Any, script: LuaScript, keys: Sequence[str],
                           args: Sequence[Any]) -> Any:
    """Run a script on a redis.asyncio client, reloading it after NOSCRIPT."""
    try:
        try:
            return await client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await client.eval(script.source, len(keys), *keys, *args)
    except ResponseError as exc:
        _raise_translated(exc)


ScriptCallSpec = tuple[LuaScript, Sequence[str], Sequence[Any]]


@dataclasses.dataclass(frozen=True)
class PendingCall:
    """A component's script call to be sent later, maybe pipelined with others.

    `on_reply(raw)` takes the reply; `on_unavailable(error)` runs the
    component's outage path (error None: Redis was in backoff and not tried).
    """

    script: LuaScript
    keys: Sequence[str]
    args: Sequence[Any]
    usable: Callable[[], bool]
    on_reply: Callable[[Any], Any]
    on_unavailable: Callable[[BaseException | None], Any]

    @property
    def spec(self) -> ScriptCallSpec:
        return (self.script, self.keys, self.args)


def send(client: Any, pending: PendingCall) -> Any:
    """Send one pending call on a sync client: the result of its reply handler, or of its
    outage path (Redis in backoff, or unavailable). Other errors are raised."""
    if not pending.usable():
        return pending.on_unavailable(None)
    try:
        raw = run_script(client, pending.script, pending.keys, pending.args)
    except UNAVAILABLE_ERRORS as error:
        return pending.on_unavailable(error)
    return pending.on_reply(raw)


async def send_async(client: Any, pending: PendingCall) -> Any:
    """The asyncio twin of `send`."""
    if not pending.usable():
        return pending.on_unavailable(None)
    try:
        raw = await run_script_async(client, pending.script, pending.keys, pending.args)
    except UNAVAILABLE_ERRORS as error:
        return pending.on_unavailable(error)
    return pending.on_reply(raw)


def text(value: Any) -> str:
    """A reply element as str, whatever the client's decode_responses setting (bytes
    that are not UTF-8, i.e. foreign data, are shown with replacement characters)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


class Owed(NamedTuple):
    """A call a component still owes Redis, and the client it must go through."""

    client: Any
    call: PendingCall


def _queue(client: Any, calls: Sequence[ScriptCallSpec], indices: Sequence[int],
           by_source: bool) -> Any:
    """A non-transactional pipeline holding the given calls (EVALSHA, or EVAL by source).

    Queued with execute_command: redis-py's cluster pipelines block the
    `evalsha` method (for its NOSCRIPT handling, which is done here), not the command.
    """
    pipe = client.pipeline(transaction=False)
    for i in indices:
        script, keys, args = calls[i]
        if by_source:
            pipe.execute_command("EVAL", script.source, len(keys), *keys, *args)
        else:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    return pipe


def _missing(results: list[Any]) -> list[int]:
    """Indices whose script was not cached (NOSCRIPT: it did not run, so rerunning is safe)."""
    return [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]


def _each(results: list[Any], missing: list[int], rerun: Sequence[Any]) -> list[Any]:
    """Every call's reply, or its error (translated) in its place."""
    for i, result in zip(missing, rerun, strict=True):
        results[i] = result
    return [_translated(result) if isinstance(result, ResponseError) else result
            for result in results]


def _translated(exc: ResponseError) -> Exception:
    translated = translate_error(exc)
    if translated is not exc:
        translated.__cause__ = exc
    return translated


def _merged(results: list[Any]) -> list[Any]:
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


def run_scripts_each(client: Any, calls: Sequence[ScriptCallSpec]) -> list[Any]:
    """Several script calls in one round trip (a pipeline, not a transaction): each
    call's reply, or the exception it met in its place (the others ran regardless).

    Calls whose script is missing from the server's cache are rerun by source
    (one more round trip, once after a restart or SCRIPT FLUSH). Raises only
    when the pipeline as a whole fails (connection errors).
    """
    results = list(_queue(client, calls, range(len(calls)), False).execute(raise_on_error=False))
    missing = _missing(results)
    rerun = _queue(client, calls, missing, True).execute(raise_on_error=False) if missing else []
    return _each(results, missing, rerun)


def run_scripts(client: Any, calls: Sequence[ScriptCallSpec]) -> list[Any]:
    """`run_scripts_each`, raising the first call's error (the other calls did run)."""
    return _merged(run_scripts_each(client, calls))


async def run_scripts_each_async(client: Any, calls: Sequence[ScriptCallSpec]) -> list[Any]:
    """The asyncio twin of `run_scripts_each`."""
    pipe = _queue(client, calls, range(len(calls)), False)
    results = list(await pipe.execute(raise_on_error=False))
    missing = _missing(results)
    rerun = (await _queue(client, calls, missing, True).execute(raise_on_error=False)
             if missing else [])
    return _each(results, missing, rerun)


async def run_scripts_async(client: Any, calls: Sequence[ScriptCallSpec]) -> list[Any]:
    """The asyncio twin of `run_scripts`."""
    return _merged(await run_scripts_each_async(client, calls))
