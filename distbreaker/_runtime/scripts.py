"""Loading the Lua scripts shipped with the package, running them, decoding their text.

Every script in ``lua/`` is one source of truth with two generated forms:

* a **function** in the Redis Functions library ``distbreaker_<hash>`` (Redis 7+):
  called with FCALL, its helpers are compiled and defined once, at FUNCTION LOAD;
  loaded on first use and again whenever a server answers "Function not found"
  (a restart without persistence, FUNCTION FLUSH, a failover to a replica that
  never had it, a new cluster primary). The hash in the library's and the
  functions' names is that of the library text, so workers of two versions
  coexist during a rolling deploy, each calling its own functions.
* an **EVAL script** (EVALSHA, then EVAL after NOSCRIPT) for servers without
  Functions (Redis < 7, fakeredis: the local fallback and ``memory://``), for
  clients whose ACL does not allow FCALL / FUNCTION LOAD, and for the PHP client.

A script file is either a *module* (its first line is ``--!module``): a chunk
that defines its helpers once and returns the entry ``function(KEYS, ARGV)``; or a
plain script body (it reads ``KEYS`` / ``ARGV`` and returns the reply), which is
wrapped in a function of those two parameters. A *library module* (``lua/lib/NAME.lua``,
first line ``--!lib``) is a chunk returning a value (a table of helpers or constants)
that scripts share; a script or library module names what it uses on its first line
(``--!module needs prelude record_layout``, ``--!lib needs prelude``), and its chunk
gets each library module's value as a local of that name. A `PendingCall` is a component's
call with its reply and outage handling; `send` / `send_async` are its one sync
and asyncio driver.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from redis.exceptions import (
    AskError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ResponseError,
)

from ..errors import SchemaError
from .health import UNAVAILABLE_ERRORS
from .outages import DB_RANGE, NOT_REDIS, NOT_SENTINEL, RedisRefused, as_outage, cause_of

logger = logging.getLogger("distbreaker")

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_CANDIDATES = (_PACKAGE_DIR / "lua", _PACKAGE_DIR.parent / "lua")

#: The scripts of the library, in the order the library defines them.
SCRIPT_NAMES = ("breaker", "bulkhead", "budget", "ganesha", "finish", "ratelimiter",
                "inject", "pool")
MODULE_MARKER = "--!module"
LIB_MARKER = "--!lib"
NEEDS = " needs "


def lua_dir() -> Path:
    """The folder holding the scripts: ``distbreaker/lua/`` in a wheel, else the source
    tree's top-level ``lua/``."""
    for candidate in _CANDIDATES:
        if (candidate / "breaker.lua").is_file():
            return candidate
    raise FileNotFoundError("distbreaker's lua/ folder is missing from the installation")


def _read(name: str) -> str:
    return (lua_dir() / f"{name}.lua").read_text(encoding="utf-8")


def _is_module(source: str) -> bool:
    return source.startswith(MODULE_MARKER)


def needs(source: str) -> list[str]:
    """What a module uses (its first line ``--!module needs a b`` or ``--!lib needs a
    b``), in order: scripts (called as functions, defined before it) and library modules
    (``lua/lib/``, their values passed to its chunk)."""
    first = source.split("\n", 1)[0]
    if not first.startswith((MODULE_MARKER, LIB_MARKER)) or NEEDS not in first:
        return []
    return first.split(NEEDS, 1)[1].split()


def _is_lib(name: str) -> bool:
    return name not in SCRIPT_NAMES


def _lib_order(names: Sequence[str], read: Callable[[str], str]) -> list[str]:
    """The library modules `names` use, directly or through others, each after the ones
    it needs (the order the generated code defines them)."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        source = read(name) if name in SCRIPT_NAMES else read(f"lib/{name}")
        for used in needs(source):
            if _is_lib(used):
                visit(used)
        if _is_lib(name):
            order.append(name)

    for name in names:
        visit(name)
    return order


def sources(name: str, read: Callable[[str], str] | None = None) -> list[str]:
    """The text of ``lua/<name>.lua`` and of every library module it uses, directly or
    through others (what runs when the script runs, less the scripts it calls)."""
    read = read or _read
    return [read(name), *(read(f"lib/{lib}") for lib in _lib_order([name], read))]


def _chunk_call(source: str) -> str:
    """A call of a module's chunk, its library modules passed as locals of their names."""
    libs = [n for n in needs(source) if _is_lib(n)]
    return (f"(function({', '.join(libs)})\n{source}\nend)"
            f"({', '.join(f'{n}()' for n in libs)})")


def _lib_form(name: str, source: str) -> str:
    """The definition of one library module: a local function answering its value,
    made by the chunk at its first use (never at FUNCTION LOAD, see `_function_form`)."""
    if not source.startswith(LIB_MARKER):
        raise ValueError(f"lua/lib/{name}.lua does not start with {LIB_MARKER}")
    return (f"local {name}_value\n"
            f"local function {name}()\n"
            f"  if {name}_value == nil then {name}_value = {_chunk_call(source)} end\n"
            f"  return {name}_value\n"
            f"end\n")


def _libs_form(names: Sequence[str], read: Callable[[str], str]) -> str:
    return "".join(_lib_form(n, read(f"lib/{n}")) for n in _lib_order(names, read))


def eval_form(source: str, read: Callable[[str], str] | None = None) -> str:
    """The EVAL script of a source file: a plain body as it is; a module called with
    the script's KEYS and ARGV, after the definitions of the library modules and the
    scripts it needs."""
    if not _is_module(source):
        return source
    read = read or _read
    scripts = [n for n in needs(source) if not _is_lib(n)]
    libs = _libs_form([*scripts, *(n for n in needs(source) if _is_lib(n))], read)
    used = "".join(_function_form(n, read(n)) for n in scripts)
    return f"{libs}{used}local main = {_chunk_call(source)}\nreturn main(KEYS, ARGV)\n"


def _function_form(name: str, source: str) -> str:
    """The library's definition of one script: a local function named after it.

    A module's chunk runs at the function's first call, not at FUNCTION LOAD: Redis
    runs the library's top level in a sandbox without the Lua standard library
    (``math``, ``string``, ``tonumber``, ``redis.call`` ...), which the module's
    helpers capture. Its entry is kept in an upvalue for every later call.
    """
    if _is_module(source):  # `...`: the server time a merged call passes (lua/finish.lua)
        return (f"local {name}_entry\n"
                f"local function {name}(KEYS, ARGV, ...)\n"
                f"  if not {name}_entry then {name}_entry = {_chunk_call(source)} end\n"
                f"  return {name}_entry(KEYS, ARGV, ...)\n"
                f"end\n")
    return f"local function {name}(KEYS, ARGV)\n{source}\nend\n"


@dataclasses.dataclass(frozen=True)
class Library:
    """The Redis Functions library holding every script: its name and code."""

    name: str
    code: str

    def function(self, script: str) -> str:
        """The FCALL name of a script in this library."""
        return f"{self.name}_{script}"


@functools.cache
def library() -> Library:
    """The library, built once per process from the script files."""
    bodies = _libs_form(SCRIPT_NAMES, _read) + "".join(_function_form(n, _read(n))
                                                       for n in SCRIPT_NAMES)
    # the name covers the registrations too (their flags), not only the bodies
    registration = "redis.register_function{{function_name='{name}_{n}', callback={n}}}\n"
    template = "".join(registration.format(name="<name>", n=n) for n in SCRIPT_NAMES)
    digest = hashlib.sha1((bodies + template).encode()).hexdigest()[:12]
    name = f"distbreaker_{digest}"
    # No allow-oom: with it Redis lets a function write past maxmemory. Without it a
    # full Redis refuses the FCALL (the function did not run); that call then runs the
    # EVAL form, which answers what needs no memory and meets the refusal at its first
    # write, as on Redis < 7 (function_error "oom").
    registrations = "".join(registration.format(name=name, n=n) for n in SCRIPT_NAMES)
    return Library(name, f"#!lua name={name}\n{bodies}{registrations}")


@dataclasses.dataclass(frozen=True)
class LuaScript:
    """One script: its name, EVAL source and SHA1 (the EVALSHA handle), and its
    function's FCALL name in the library."""

    name: str
    source: str
    sha: str
    function: str = ""


@functools.cache
def load_script(name: str) -> LuaScript:
    """Read ``lua/<name>.lua`` once per process."""
    source = eval_form(_read(name))
    function = library().function(name) if name in SCRIPT_NAMES else ""
    return LuaScript(name, source, hashlib.sha1(source.encode()).hexdigest(), function)


class _FunctionSupport:
    """Which clients call functions (FCALL) and which fell back to EVAL.

    Per client object (weakly held): a server without Functions (Redis < 7,
    fakeredis) or an ACL without FCALL / FUNCTION LOAD makes that client use the
    EVAL form from then on, logged once per process.
    """

    def __init__(self) -> None:
        self._eval_only: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._logged = False

    def usable(self, client: Any) -> bool:
        try:
            return client not in self._eval_only
        except TypeError:  # not weakly referenceable: always try
            return True

    def give_up(self, client: Any, why: str) -> None:
        with self._lock:
            try:
                self._eval_only[client] = True
            except TypeError:
                pass
            if not self._logged and "unknown command" not in why.lower():
                self._logged = True
                logger.warning("distbreaker: Redis Functions unusable (%s); running the "
                               "EVAL form of the scripts instead", why)


FUNCTIONS = _FunctionSupport()


def function_error(exc: ResponseError) -> str | None:
    """What an FCALL / FUNCTION LOAD error says about Functions: "missing" (load the
    library, then call again), "unusable" (use EVAL), "oom" (Redis is full: run this
    call's EVAL form), or None (a script's own error)."""
    if isinstance(exc, OutOfMemoryError):
        return "oom"
    text = str(exc)
    lowered = text.lower()
    if "function not found" in lowered:
        return "missing"
    if cause_of(exc) in (DB_RANGE, NOT_SENTINEL):  # a wrong URL: no command can run
        return None
    if isinstance(exc, NoPermissionError) or "unknown command" in lowered \
            or "unknown subcommand" in lowered:
        return "unusable"
    return None


def loaded(exc: ResponseError | None) -> bool:
    """Whether a FUNCTION LOAD that raised `exc` (None: it did not raise) left the
    library on the server (another worker may have loaded it first)."""
    return exc is None or "already exists" in str(exc)


#: Redis answered but cannot serve us now (BUSY script, MISCONF, NOREPLICAS, a db out of
#: range, ...): a ConnectionError subclass, so every front end treats it as "Redis
#: unavailable" (outages.py names each cause and its fix).
RedisBusyError = RedisRefused


#: What redis-py makes of these error codes at the top level of a reply; an error
#: nested in an array (lua/finish.lua's replies) can arrive as a plain ResponseError
#: (hiredis has one class for them all), so its code is read here.
_NESTED_CLASSES: dict[str, type[ResponseError]] = {"OOM": OutOfMemoryError,
                                                   "NOPERM": NoPermissionError}


def translate_error(exc: ResponseError) -> Exception:
    """Turn a script's error reply into the library's own exception type."""
    text = str(exc)
    if type(exc) is ResponseError and text.split(" ", 1)[0] in _NESTED_CLASSES:
        return _NESTED_CLASSES[text.split(" ", 1)[0]](text)
    if isinstance(exc, AskError):  # MOVED/ASK: a plain client talking to a cluster node
        return TypeError(f"Redis answered {type(exc).__name__} ({text}): it is a Redis Cluster "
                         "node; pass a redis.cluster.RedisCluster client as redis=")
    outage = as_outage(exc)
    if outage is not exc:  # a refusal or misdirection (outages.py)
        return outage
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


def _fcall_args(script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
    return ("FCALL", script.function, len(keys), *keys, *args)


def _load_library_sync(client: Any) -> str | None:
    """Load the library; None when it is on the server now, else why it cannot be."""
    try:
        client.function_load(library().code)
    except ResponseError as exc:
        if loaded(exc):
            return None
        return str(exc)
    return None


async def _load_library_async(client: Any) -> str | None:
    try:
        await client.function_load(library().code)
    except ResponseError as exc:
        if loaded(exc):
            return None
        return str(exc)
    return None


def _call_flow(client: Any, script: LuaScript) -> Any:
    """The steps of one script call for both drivers: yields "fcall", "load",
    "evalsha" or "eval" and is sent back (True, reply) or (False, the ResponseError it
    met; for "load": why the library cannot be loaded, None when it is); returns the
    reply or raises the error to report."""
    if script.function and FUNCTIONS.usable(client):
        for attempt in (1, 2):
            ok, value = yield "fcall"
            if ok:
                return value
            kind = function_error(value)
            if kind is None:
                raise value
            if kind == "oom":  # a full Redis refuses functions: the EVAL form answers
                break
            why = str(value)
            if kind == "missing" and attempt == 1:
                _, why = yield "load"
            if why is not None:
                FUNCTIONS.give_up(client, why)
                break
    ok, value = yield "evalsha"
    if not ok and isinstance(value, NoScriptError):
        ok, value = yield "eval"
    if ok:
        return value
    raise value


def _step(step: str, script: LuaScript, keys: Sequence[str],
          args: Sequence[Any]) -> tuple[Any, ...]:
    """The command of one step of `_call_flow` ("load" is the library's own)."""
    if step == "fcall":
        return _fcall_args(script, keys, args)
    if step == "evalsha":
        return ("EVALSHA", script.sha, len(keys), *keys, *args)
    return ("EVAL", script.source, len(keys), *keys, *args)


def run_script(client: Any, script: LuaScript, keys: Sequence[str],
               args: Sequence[Any]) -> Any:
    """Run a script on a sync redis-py client: its function (loading the library when the
    server lacks it), else its EVAL form (reloaded after NOSCRIPT)."""
    flow = _call_flow(client, script)
    try:
        step = next(flow)
        while True:
            if step == "load":
                answer: tuple[bool, Any] = (True, _load_library_sync(client))
            else:
                try:
                    answer = (True, client.execute_command(*_step(step, script, keys, args)))
                except ResponseError as exc:
                    answer = (False, exc)
            step = flow.send(answer)
    except StopIteration as done:
        return done.value
    except ResponseError as exc:
        _raise_translated(exc)
    except MALFORMED as exc:
        _raise_not_redis(exc)


async def run_script_async(client: Any, script: LuaScript, keys: Sequence[str],
                           args: Sequence[Any]) -> Any:
    """The asyncio twin of `run_script`."""
    flow = _call_flow(client, script)
    try:
        step = next(flow)
        while True:
            if step == "load":
                answer: tuple[bool, Any] = (True, await _load_library_async(client))
            else:
                try:
                    answer = (True, await client.execute_command(
                        *_step(step, script, keys, args)))
                except ResponseError as exc:
                    answer = (False, exc)
            step = flow.send(answer)
    except StopIteration as done:
        return done.value
    except ResponseError as exc:
        _raise_translated(exc)
    except MALFORMED as exc:
        _raise_not_redis(exc)


def _fcall(client: Any, script: LuaScript, keys: Sequence[str],
           args: Sequence[Any]) -> tuple[Any, ...] | None:
    """The FCALL command of a hot call, None when Functions are not usable here."""
    if script.function and FUNCTIONS.usable(client):
        return ("FCALL", script.function, len(keys), *keys, *args)
    return None


@contextlib.contextmanager
def _functions_trouble_falls_through() -> Iterator[None]:
    """Around a hot FCALL: our script errors and a reply that is not Redis's raise as
    `run_script` raises them; Functions trouble (no library, no FCALL) is swallowed, so
    the caller goes on to `run_script`'s whole flow."""
    try:
        yield
    except ResponseError as exc:
        if function_error(exc) is None:
            _raise_translated(exc)
    except MALFORMED as exc:
        _raise_not_redis(exc)


def run_function(client: Any, script: LuaScript, keys: Sequence[str],
                 args: Sequence[Any]) -> Any:
    """`run_script` for a hot call: its function called at once (the usual case, the
    library loaded: no call flow to step through); any Functions trouble takes
    `run_script`'s whole flow (loading the library, or the EVAL form)."""
    command = _fcall(client, script, keys, args)
    if command is not None:
        with _functions_trouble_falls_through():
            return client.execute_command(*command)
    return run_script(client, script, keys, args)


async def run_function_async(client: Any, script: LuaScript, keys: Sequence[str],
                             args: Sequence[Any]) -> Any:
    """The asyncio twin of `run_function`."""
    command = _fcall(client, script, keys, args)
    if command is not None:
        with _functions_trouble_falls_through():
            return await client.execute_command(*command)
    return await run_script_async(client, script, keys, args)


@dataclasses.dataclass(frozen=True)
class ScriptCall:
    """KEYS and ARGV of one script call, as a component's core builds them (the shell
    sends them with the component's script)."""

    keys: Sequence[str]
    args: Sequence[Any]


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

    def reply(self, raw: Any) -> Any:
        """`on_reply(raw)`; a reply no distbreaker script gives (not an array, where the
        decoder expected one: a server that speaks the Redis protocol but is not Redis, a
        proxy, a mock...) takes the outage path instead of escaping as an AttributeError or
        IndexError. (An array it cannot decode is raised: a bug, or foreign data.)"""
        try:
            return self.on_reply(raw)
        except MALFORMED as error:
            if isinstance(raw, list):
                raise
            return self.on_unavailable(malformed(raw, error))


#: What decoding a reply of the wrong shape raises (foreign *data* raises SchemaError).
MALFORMED = (AttributeError, IndexError, TypeError, KeyError)


def raised_by_redis_py(exc: BaseException) -> bool:
    """Whether redis-py itself raised `exc` (e.g. choking on a connection handshake's reply
    from a server that is not Redis), not distbreaker's code."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and f"{os.sep}redis{os.sep}" in frames[-1].filename


def _raise_not_redis(exc: BaseException) -> NoReturn:
    if not raised_by_redis_py(exc):
        raise exc
    raise malformed("(a reply to the connection's handshake)", exc) from exc


def malformed(raw: Any, error: BaseException | None = None) -> RedisRefused:
    """The outage a reply of the wrong shape means."""
    made = RedisRefused(f"a reply distbreaker's scripts never give: {raw!r:.120}", NOT_REDIS)
    made.__cause__ = error
    return made


def send(client: Any, pending: PendingCall) -> Any:
    """Send one pending call on a sync client: the result of its reply handler, or of its
    outage path (Redis in backoff, or unavailable). Other errors are raised."""
    if not pending.usable():
        return pending.on_unavailable(None)
    try:
        raw = run_script(client, pending.script, pending.keys, pending.args)
    except UNAVAILABLE_ERRORS as error:
        return pending.on_unavailable(error)
    return pending.reply(raw)


async def send_async(client: Any, pending: PendingCall) -> Any:
    """The asyncio twin of `send`."""
    if not pending.usable():
        return pending.on_unavailable(None)
    try:
        raw = await run_script_async(client, pending.script, pending.keys, pending.args)
    except UNAVAILABLE_ERRORS as error:
        return pending.on_unavailable(error)
    return pending.reply(raw)


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


#: How a pipeline sends a call: by function, by EVALSHA, or by EVAL with the source.
FCALL, EVALSHA, EVAL = "fcall", "evalsha", "eval"


def _queue(client: Any, calls: Sequence[ScriptCallSpec], indices: Sequence[int],
           how: str) -> Any:
    """A non-transactional pipeline holding the given calls, sent `how`.

    Queued with execute_command: redis-py's cluster pipelines block the
    `evalsha` method (for its NOSCRIPT handling, which is done here), not the command.
    """
    pipe = client.pipeline(transaction=False)
    for i in indices:
        script, keys, args = calls[i]
        if how == FCALL and script.function:
            pipe.execute_command(*_fcall_args(script, keys, args))
        elif how == EVAL:
            pipe.execute_command("EVAL", script.source, len(keys), *keys, *args)
        else:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    return pipe


def _first_how(client: Any) -> str:
    return FCALL if FUNCTIONS.usable(client) else EVALSHA


def _rerun(results: list[Any], how: str) -> tuple[list[int], str, str | None]:
    """Which calls to send again, and how: after FCALL, the calls whose function was
    missing (FCALL again once the library is loaded: `needs_load`), unusable or refused
    by a full Redis (by EVALSHA); after EVALSHA, those that met NOSCRIPT (by EVAL). Such
    calls did not run, so sending them again is safe. Returns (indices, how, why
    Functions are unusable)."""
    if how == FCALL:
        kinds = [function_error(r) if isinstance(r, ResponseError) else None for r in results]
        unusable = [i for i, k in enumerate(kinds) if k == "unusable"]
        if unusable:
            return ([i for i, k in enumerate(kinds) if k], EVALSHA, str(results[unusable[0]]))
        if "oom" in kinds:  # Redis is full: no library load, the EVAL form for these
            return [i for i, k in enumerate(kinds) if k], EVALSHA, None
        return [i for i, k in enumerate(kinds) if k == "missing"], FCALL, None
    if how == EVALSHA:
        return [i for i, r in enumerate(results) if isinstance(r, NoScriptError)], EVAL, None
    return [], EVAL, None


def _merge(results: list[Any], indices: Sequence[int], rerun: Sequence[Any]) -> None:
    for i, result in zip(indices, rerun, strict=True):
        results[i] = result


def each_result(results: Sequence[Any]) -> list[Any]:
    """Every call's reply, or its error (translated) in its place."""
    return [_translated(result) if isinstance(result, ResponseError) else result
            for result in results]


def _translated(exc: ResponseError) -> Exception:
    translated = translate_error(exc)
    if translated is not exc:
        translated.__cause__ = exc
    return translated


def _pipeline_flow(client: Any, calls: Sequence[ScriptCallSpec]) -> Any:
    """The steps of `run_scripts_each` for both drivers: yields ("send", indices, how)
    to get those calls' results, ("load", None, None) to get FUNCTION LOAD's refusal
    (None: loaded); returns every call's reply or error."""
    how = _first_how(client)
    results = list((yield ("send", range(len(calls)), how)))
    todo = list(range(len(calls)))
    for _ in range(3):
        indices, next_how, unusable = _rerun([results[i] for i in todo], how)
        indices = [todo[i] for i in indices]
        if not indices:
            break
        if unusable is not None:
            FUNCTIONS.give_up(client, unusable)
        elif next_how == FCALL:
            why = yield ("load", None, None)
            if why is not None:
                FUNCTIONS.give_up(client, why)
                next_how = EVALSHA
        _merge(results, indices, (yield ("send", indices, next_how)))
        todo, how = indices, next_how
    return each_result(results)


def run_scripts_each(client: Any, calls: Sequence[ScriptCallSpec]) -> list[Any]:
    """Several script calls in one round trip (a pipeline, not a transaction): each
    call's reply, or the exception it met in its place (the others ran regardless).

    Calls whose function or script the server lacks are sent again once it is loaded
    (one more round trip, after a restart, FUNCTION FLUSH or SCRIPT FLUSH). Raises only
    when the pipeline as a whole fails (connection errors).
    """
    flow = _pipeline_flow(client, calls)
    answer: Any = None
    try:
        while True:
            step, indices, how = flow.send(answer)
            answer = (_queue(client, calls, indices, how).execute(raise_on_error=False)
                      if step == "send" else _load_library_sync(client))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except ResponseError as exc:  # the pipeline as a whole: e.g. a db out of range
        _raise_translated(exc)
    except MALFORMED as exc:
        _raise_not_redis(exc)


async def run_scripts_each_async(client: Any, calls: Sequence[ScriptCallSpec]) -> list[Any]:
    """The asyncio twin of `run_scripts_each`."""
    flow = _pipeline_flow(client, calls)
    answer: Any = None
    try:
        while True:
            step, indices, how = flow.send(answer)
            answer = (await _queue(client, calls, indices, how).execute(raise_on_error=False)
                      if step == "send" else await _load_library_async(client))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except ResponseError as exc:  # the pipeline as a whole: e.g. a db out of range
        _raise_translated(exc)
    except MALFORMED as exc:
        _raise_not_redis(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m distbreaker._runtime.scripts --eval-form NAME [--lua-dir DIR]``: print
    the EVAL form of ``lua/NAME.lua`` (what the PHP client ships, via scripts/sync_php_lua,
    so that the EVAL form is generated from the one source, never kept by hand)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m distbreaker._runtime.scripts",
                                     description="Print a generated form of a Lua script.")
    parser.add_argument("--eval-form", metavar="NAME", required=True,
                        help="the script's name (lua/NAME.lua)")
    parser.add_argument("--lua-dir", metavar="DIR", type=Path, default=None,
                        help="the folder holding the sources (default: the package's lua/)")
    options = parser.parse_args(argv)
    name = options.eval_form
    if options.lua_dir is None:
        if name not in SCRIPT_NAMES:
            parser.error(f"unknown script {name!r}; known: {', '.join(SCRIPT_NAMES)}")
        source = load_script(name).source
    else:
        path = options.lua_dir / f"{name}.lua"
        if not path.is_file():
            parser.error(f"{path} does not exist")
        lua = options.lua_dir
        source = eval_form(path.read_text(encoding="utf-8"),
                           lambda n: (lua / f"{n}.lua").read_text(encoding="utf-8"))
    sys.stdout.write(source)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
