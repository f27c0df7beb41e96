"""`check()`: can this Redis serve a component? For apps that would rather fail at
start-up than run on local fallbacks because of a wrong URL, a replica or an ACL.

One PING (the connection itself: database, protocol, Sentinel, password, LOADING),
then one EVAL of a `#!lua` script that writes nothing: Redis refuses a script that
may write on a read-only replica (READONLY) or past maxmemory (OOM) before it runs,
and inside it `redis.acl_check_cmd` asks, for every command the component's scripts
run, whether the connected user may run it on the component's key and channel (the
scripts run with the caller's permissions). Nothing is executed, nothing written.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from ..errors import CheckFailed
from .outages import ACL, NOT_REDIS, as_outage, cause_of
from .scripts import MALFORMED, lua_dir, malformed, raised_by_redis_py, sources, text

#: Commands a worker sends itself besides the scripts, by script: a breaker's process
#: listens on the transitions channel, a bulkhead waiter blocks on BLPOP.
CLIENT_COMMANDS = {"breaker": ("SUBSCRIBE",), "bulkhead": ("BLPOP",)}
#: The scripts' forms: EVALSHA (EVAL after NOSCRIPT) always works where FCALL does not.
SCRIPT_COMMANDS = ("EVALSHA", "EVAL")

#: Names a script binds `redis.call` / `redis.pcall` to (``local rcall = redis.call``).
_ALIAS = re.compile(r"^\s*local\s+([\w\s,]+?)\s*=\s*([\w\s.,]+?)\s*$", re.M)
#: A command built as a table before being unpacked into a call: ``{'XADD', K_HIST, ...}``.
_TABLE_CALL = re.compile(r"\{\s*'([A-Z]+)'\s*,\s*K_")

#: ARGV: per command, its argument count and the command with its arguments. Each runs
#: through `redis.acl_check_cmd` (nothing executed); the names refused are returned.
#: (Redis 7.0 does not check the arity there and reads past a short argv: every command
#: gets its key or channel repeated `_REPEAT` times, more than any key position it has.)
CHECK_SOURCE = """#!lua
local denied = {}
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local args = {}
  for j = 1, n do args[j] = ARGV[i + j] end
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(args))
  if ok and not allowed then denied[#denied + 1] = args[1] end
  i = i + n + 1
end
return denied
"""
_REPEAT = 6


def commands_of(source: str) -> list[str]:
    """Every Redis command a script calls: through ``redis.call`` / ``redis.pcall``, a local
    alias of either, or a table unpacked into one."""
    callers = ["redis.call", "redis.pcall"]
    for names, values in _ALIAS.findall(source):
        pairs = zip((n.strip() for n in names.split(",")),
                    (v.strip() for v in values.split(",")), strict=False)
        callers += [n for n, v in pairs if v in ("redis.call", "redis.pcall")]
    call = re.compile(r"(?<![\w.])(?:" + "|".join(re.escape(c) for c in callers)
                      + r")\(\s*['\"]([A-Za-z]+)['\"]")
    return sorted({m.upper() for m in call.findall(source) + _TABLE_CALL.findall(source)})


@functools.cache
def script_commands() -> dict[str, list[str]]:
    """Every Redis command each lua/*.lua script calls (itself or through the library
    modules it uses, lua/lib/), by script name."""
    return {path.stem: commands_of("\n".join(sources(path.stem)))
            for path in sorted(lua_dir().glob("*.lua"))}


def needed_commands(scripts: Sequence[str]) -> list[str]:
    """What a worker running `scripts` must be allowed: its own commands, then every
    command those scripts run inside Redis."""
    found = script_commands()
    own = ["PING", *SCRIPT_COMMANDS, *(c for s in scripts for c in CLIENT_COMMANDS.get(s, ()))]
    return [*own, *sorted({c for s in scripts for c in found.get(s, ())} - set(own))]


def check_args(scripts: Sequence[str], key: str, channel: str) -> list[str]:
    """ARGV of CHECK_SOURCE: each needed command with arguments acting on `key` (or,
    for PUBLISH and SUBSCRIBE, `channel`)."""
    args: list[str] = []
    for command in needed_commands(scripts):
        if command in ("EVALSHA", "EVAL"):
            line = [command, "0" * 40 if command == "EVALSHA" else "return 1", "1", key]
        else:
            target = channel if command in ("PUBLISH", "SUBSCRIBE") else key
            line = [command, *[target] * _REPEAT]
        args += [str(len(line)), *line]
    return args


def _failed(component: str, error: BaseException) -> CheckFailed:
    outage = (malformed(None, error) if isinstance(error, MALFORMED)
              and raised_by_redis_py(error) else as_outage(error))
    cause = cause_of(outage)
    if cause is None:
        return CheckFailed(component, f"Redis unreachable ({type(error).__name__}: {error}); "
                           "fix: check the URL, and that Redis runs")
    return CheckFailed(component, f"{cause.what} ({type(error).__name__}: {error}); "
                       f"fix: {cause.fix}", cause)


def _denied(component: str, denied: Sequence[Any], key: str, channel: str) -> CheckFailed:
    """A refusal by `acl_check_cmd`: the command, or its key or channel (it does not say
    which), so the fix grants all three (granting what is granted changes nothing)."""
    names = [text(c).lower() for c in denied]
    grants = [f"~{key.split(':{', 1)[0]}:*"]
    if channel and {"publish", "subscribe"} & set(names):
        grants.append(f"&{channel}")
    grants += [f"+{n}" for n in names]
    return CheckFailed(component, f"{ACL.what}: the user may not run {', '.join(names)} on "
                       f"{key} (the scripts run these inside Redis with the caller's "
                       f"permissions); fix: ACL SETUSER <user> {' '.join(grants)} "
                       "(docs/OPERATIONS.md, The minimal ACL)", ACL)


def _verdict(component: str, pong: Any, denied: Any, key: str, channel: str) -> bool:
    """True when PONG and the check script's list of refused commands say all is well."""
    if pong is not True or not isinstance(denied, list):  # speaks RESP, is not Redis
        raise CheckFailed(component, f"{NOT_REDIS.what} (PING answered {pong!r:.60}, a "
                          f"script {denied!r:.60}); fix: {NOT_REDIS.fix}", NOT_REDIS)
    if denied:
        raise _denied(component, denied, key, channel)
    return True


def _without_acl_check(error: ResponseError) -> bool:
    """Redis < 7 (no `#!lua` scripts, no acl_check_cmd): the permissions go unchecked."""
    lowered = str(error).lower()
    return "acl_check_cmd" in lowered or "unexpected symbol" in lowered \
        or "#!" in lowered or "error compiling script" in lowered


def preflight(client: Any, component: str, scripts: Sequence[str], key: str,
              channel: str) -> bool:
    """Raise `CheckFailed` naming the cause and the fix unless Redis serves `component`;
    False when only the connection could be checked (Redis < 7)."""
    try:
        pong = client.ping()
        denied = client.eval(CHECK_SOURCE, 1, key, *check_args(scripts, key, channel))
    except ResponseError as error:
        if cause_of(error) is None and _without_acl_check(error):
            return False
        raise _failed(component, error) from error
    except Exception as error:
        raise _failed(component, error) from error
    return _verdict(component, pong, denied, key, channel)


async def preflight_async(client: Any, component: str, scripts: Sequence[str], key: str,
                          channel: str) -> bool:
    """The asyncio twin of `preflight`."""
    try:
        pong = await client.ping()
        denied = await client.eval(CHECK_SOURCE, 1, key, *check_args(scripts, key, channel))
    except ResponseError as error:
        if cause_of(error) is None and _without_acl_check(error):
            return False
        raise _failed(component, error) from error
    except Exception as error:
        raise _failed(component, error) from error
    return _verdict(component, pong, denied, key, channel)
