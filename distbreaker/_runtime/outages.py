"""Which Redis refusals and misdirections are an outage, what caused each, how to fix it.

A wrong URL (a database the server lacks, a Sentinel URL at a plain server, a port
that does not speak Redis), a read-only replica, an ACL refusal (NOPERM, or "can't run
this command" from inside a script), a full Redis (OOM), a loading, busy or
primary-less server: none of these is a bug of the caller, and none may escape a
protected call (the on_redis_error policy applies). Each is named here once, with its
fix, so that `RedisHealth` logs it once per process at ERROR, `check()` raises it at
start-up, and `distbreaker doctor` fails on it.
"""

from __future__ import annotations

import logging
import threading
from typing import NamedTuple

from redis.exceptions import (
    BusyLoadingError,
    InvalidResponse,
    MasterDownError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

logger = logging.getLogger("distbreaker")


class Cause(NamedTuple):
    """An outage's kind (a short tag), what it means, and how to fix it."""

    kind: str
    what: str
    fix: str


class RedisRefused(RedisConnectionError):
    """Redis (or whatever answers at the URL) refuses to serve distbreaker.

    A ConnectionError subclass, so every front end treats it as "Redis unavailable"
    (the on_redis_error policy), never as an error of the protected call.
    """

    def __init__(self, text: str, cause: Cause) -> None:
        super().__init__(text)
        self.cause = cause


_ACL_FIX = ("grant what is missing: `distbreaker doctor` (as that user) or `distbreaker "
            "doctor --user NAME` (as an admin) prints the ACL SETUSER line; "
            "docs/OPERATIONS.md, The minimal ACL")

DB_RANGE = Cause("db-out-of-range", "the URL names a database this server does not have",
                 "use a database number below the server's `databases` setting (default 16)")
NOT_SENTINEL = Cause("not-sentinel", "a redis+sentinel:// URL points at a plain Redis server, "
                     "not a Sentinel", "use redis://host:port/db for a plain server, or the "
                     "Sentinels' addresses (usually port 26379) in the sentinel URL")
NOT_REDIS = Cause("not-redis", "what answers at the URL does not speak the Redis protocol",
                  "check the host and port of the URL (another service listens there)")
NO_SCRIPTS = Cause("no-scripts", "the server at the URL does not run Lua scripts (a Sentinel's "
                  "port? a proxy?)", "point the URL at a Redis server; for Sentinel use a "
                  "redis+sentinel:// URL naming the service")
READ_ONLY = Cause("read-only", "the URL points at a read-only replica: every script that "
                  "writes is refused, so the fleet shares nothing",
                  "point the URL at the primary, or use a redis+sentinel:// URL that "
                  "follows failovers")
ACL = Cause("acl", "the Redis user is missing a permission distbreaker needs (a command, "
            "key or channel)", _ACL_FIX)
OOM = Cause("oom", "Redis is full (used memory > maxmemory with noeviction): writes are "
            "refused", "raise maxmemory or free memory; docs/OPERATIONS.md, Memory")
LOADING = Cause("loading", "Redis is loading its dataset into memory",
                "wait for the load to finish (nothing to change if it ends)")
MASTERDOWN = Cause("masterdown", "the replica lost its link to its primary (MASTERDOWN)",
                   "point the URL at the primary or a Sentinel URL, or fix the replication "
                   "link")
BUSY = Cause("busy", "Redis is busy running a long script (BUSY)",
             "find the long script (SLOWLOG) and SCRIPT KILL or FUNCTION KILL it")
MISCONF = Cause("misconf", "Redis refuses writes because it cannot persist (MISCONF)",
                "fix the RDB/AOF write error on the server (disk space, permissions)")
NOREPLICAS = Cause("noreplicas", "Redis refuses writes: not enough good replicas "
                   "(min-replicas-to-write)", "restore the replicas or lower "
                   "min-replicas-to-write")

#: Error codes that start a reply (redis-py leaves them in a plain ResponseError's text).
_BY_CODE = {"BUSY": BUSY, "MISCONF": MISCONF, "NOREPLICAS": NOREPLICAS, "LOADING": LOADING,
            "MASTERDOWN": MASTERDOWN, "READONLY": READ_ONLY, "OOM": OOM, "NOPERM": ACL}


def cause_of(error: BaseException) -> Cause | None:
    """The cause of a Redis refusal or misdirection; None for anything else (a dead or
    slow Redis, a bug, foreign data)."""
    if isinstance(error, RedisRefused):
        return error.cause
    if isinstance(error, InvalidResponse):
        return NOT_REDIS
    for kind, cause in ((ReadOnlyError, READ_ONLY), (OutOfMemoryError, OOM),
                        (NoPermissionError, ACL), (BusyLoadingError, LOADING),
                        (MasterDownError, MASTERDOWN)):
        if isinstance(error, kind):
            return cause
    if not isinstance(error, ResponseError):
        return None
    text = str(error)
    lowered = text.lower()
    if text.split(" ", 1)[0] in _BY_CODE:
        return _BY_CODE[text.split(" ", 1)[0]]
    if "db index is out of range" in lowered or "invalid database" in lowered:
        return DB_RANGE
    if "unknown command 'sentinel'" in lowered or "unknown command `sentinel`" in lowered:
        return NOT_SENTINEL
    if "unknown command" in lowered and any(f"'{c}'" in lowered for c in ("evalsha", "eval")):
        return NO_SCRIPTS
    if "can't run this command" in lowered or "no permissions to" in lowered:
        return ACL
    return None


def as_outage(error: BaseException) -> BaseException:
    """`error` as the library treats it: a refusal that redis-py leaves a plain
    ResponseError or an InvalidResponse becomes a `RedisRefused` (an ACL refusal from
    inside a script: a NoPermissionError, as NOPERM is); anything else is returned
    unchanged."""
    if isinstance(error, RedisRefused | NoPermissionError | RedisConnectionError):
        return error
    cause = cause_of(error)
    if cause is None or isinstance(error, ReadOnlyError | OutOfMemoryError | MasterDownError):
        return error
    made: BaseException = (NoPermissionError(str(error)) if cause is ACL
                           else RedisRefused(str(error), cause))
    made.__cause__ = error
    return made


#: Causes already logged by this process (each once: they do not fix themselves).
_logged: set[str] = set()
_lock = threading.Lock()


def log_once(error: BaseException) -> bool:
    """Log a refusal's cause and fix once per process at ERROR (an ACL refusal once per
    missing permission); False when `error` is no refusal (the caller logs it)."""
    cause = cause_of(error)
    if cause is None:
        return False
    text = str(error).split(" script:", 1)[0]
    seen = f"{cause.kind}:{text}" if cause is ACL else cause.kind
    with _lock:
        if seen in _logged:
            return True
        _logged.add(seen)
    logger.error("distbreaker: Redis refuses to serve distbreaker: %s (%s: %s). Protected "
                 "calls follow the on_redis_error policy until it is fixed. Fix: %s.",
                 cause.what, type(error).__name__, text, cause.fix)
    return True
