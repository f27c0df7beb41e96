"""The bulkhead's pure core, shared by the sync and asyncio front ends.

Configuration, script arguments, reply decoding and the waiting arithmetic
(how long a waiter may block on the notify list). No I/O happens here; the
front ends (`distbreaker.bulkhead`, `distbreaker.aio.bulkhead`) do it. The
semaphore itself lives in ``lua/bulkhead.lua`` (see its header for the keys,
ARGV and reply).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import threading
from collections.abc import Sequence
from typing import Any

from .._runtime import forking
from .._runtime.health import RedisHealth
from .._runtime.keys import DEFAULT_PREFIX, BulkheadKeys, validate_name
from .._runtime.options import to_ms
from .._runtime.scripts import LuaScript, PendingCall, load_script
from ..breaker.core import ScriptCall
from ..errors import BulkheadFull
from .config import BulkheadConfig

logger = logging.getLogger("distbreaker")
SCRIPT_NAME = "bulkhead"

#: A registered waiter stays counted this long after the deadline it announced,
#: covering the round trip between its wake-up and its next acquire.
WAITER_GRACE_MS = 1000
#: Never ask BLPOP for less than this (a timeout that rounds to 0 blocks forever).
MIN_BLOCK = 0.002
#: Extra time after the next lease deadline before trying again (clock granularity).
DEADLINE_SLACK = 0.005






@dataclasses.dataclass(eq=False)
class BulkheadPermit:
    """One permit: `token` is the lease holder id in Redis (empty for a local permit).

    `lost` turns True when a renewal or the release found the lease gone (it
    expired or was deleted): the call ran without a fleet-wide permit for a while.
    """

    token: str
    local: bool = False
    acquired_at: float = 0.0
    lost: bool = False
    released: bool = False


@dataclasses.dataclass(frozen=True)
class BulkheadReply:
    """A decoded bulkhead script reply (see the header of lua/bulkhead.lua)."""

    ok: bool
    in_use: int
    limit: int
    waiting: int
    rejected: int
    next_deadline_ms: int
    now_ms: int
    lost: int
    acquired: int


@dataclasses.dataclass(frozen=True)
class BulkheadMetrics:
    """Fleet-wide figures from Redis, plus this process's own counters.

    `rejected`, `lost` and `acquired` are fleet-wide totals since the keys were
    created (they expire with the keys after `key_ttl` of idleness).
    """

    max_concurrent_calls: int
    in_use: int
    available: int
    waiting: int
    rejected: int
    lost: int
    acquired: int
    rejected_here: int
    lost_here: int
    fallback_in_use: int


def decode_reply(raw: Sequence[Any]) -> BulkheadReply:
    """Decode the script's reply array."""
    v = [int(x) for x in raw]
    return BulkheadReply(ok=bool(v[0]), in_use=v[1], limit=v[2], waiting=v[3], rejected=v[4],
                         next_deadline_ms=v[5], now_ms=v[6], lost=v[7], acquired=v[8])


def blocking_cap(client: Any) -> float:
    """The longest one blocking call may take on `client` before its socket times out."""
    kwargs: dict[str, Any] = {}
    # A Redis client's pool; a RedisCluster's node manager (sync) or itself (asyncio).
    for owner in (getattr(client, "connection_pool", None),
                  getattr(client, "nodes_manager", None), client):
        found = getattr(owner, "connection_kwargs", None)
        if isinstance(found, dict):
            kwargs = found
            break
    timeout = kwargs.get("socket_timeout")
    if not timeout:
        return math.inf
    return max(MIN_BLOCK, timeout - min(0.1, timeout / 5))


class BulkheadCodec:
    """Everything about one bulkhead that is neither I/O nor a front end."""

    def __init__(self, name: str, config: BulkheadConfig, prefix: str = DEFAULT_PREFIX) -> None:
        self.name = validate_name(name)
        self.config = config
        self.keys = BulkheadKeys.build(name, prefix)
        self.script: LuaScript = load_script(SCRIPT_NAME)
        self.health = RedisHealth(config.redis_retry_max_backoff)
        self._lease_ms = max(1, to_ms(config.lease))
        self._ttl_ms = max(1, to_ms(config.key_ttl))
        self._lock = threading.Lock()
        self.rejected_here = 0
        self.lost_here = 0
        self._orphans_lock = threading.Lock()
        self._orphans: list[str] = []
        forking.register(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock and this process's own (zero) counts."""
        self._lock = threading.Lock()
        self.rejected_here = 0
        self.lost_here = 0
        self._orphans_lock = threading.Lock()
        self._orphans = []  # the parent's to cancel, not ours

    # -- script calls -------------------------------------------------------------
    def _call(self, op: str, token: str, extra: int = 0) -> ScriptCall:
        keys = self.keys
        return ScriptCall((keys.leases, keys.meta, keys.notify),
                          (op, token, self.config.max_concurrent_calls, self._lease_ms,
                           self._ttl_ms, extra))

    @staticmethod
    def new_token() -> str:
        return secrets.token_hex(12)

    def acquire_call(self, token: str, remaining: float) -> ScriptCall:
        """Acquire; with time left, a refusal registers `token` as a waiter."""
        wait_ms = to_ms(remaining) + WAITER_GRACE_MS if remaining > 0 else 0
        return self._call("acquire", token, wait_ms)

    def release_call(self, token: str) -> ScriptCall:
        return self._call("release", token)

    def renew_call(self, token: str) -> ScriptCall:
        return self._call("renew", token)

    def cancel_call(self, token: str) -> ScriptCall:
        """Undo an interrupted acquire: drop the token's lease (if granted) and waiter entry."""
        return self._call("cancel", token)

    def metrics_call(self) -> ScriptCall:
        return self._call("metrics", "")

    # -- decisions -------------------------------------------------------------------
    def block_for(self, remaining: float, reply: BulkheadReply, cap: float) -> float:
        """How long a refused waiter blocks on the notify list before asking again.

        Bounded by the remaining wait, by the next lease deadline (a reaped lease
        frees a permit without any release) and by the client's socket timeout.
        """
        bound = remaining
        if reply.next_deadline_ms > 0:
            bound = min(bound, reply.next_deadline_ms / 1000.0 + DEADLINE_SLACK)
        return max(MIN_BLOCK, min(bound, cap))

    def after_acquire(self, reply: BulkheadReply, token: str, remaining: float,
                      started: float, now: float, cap: float) -> BulkheadPermit | float:
        """A granted permit, or how long to block before asking again; raises BulkheadFull."""
        if reply.ok:
            return BulkheadPermit(token, acquired_at=now)
        if remaining <= 0:
            raise self.full(reply.in_use, now - started if self.config.max_wait_duration else 0)
        return self.block_for(remaining, reply, cap)

    def after_renew(self, permit: BulkheadPermit, reply: BulkheadReply) -> bool:
        """Whether to keep renewing `permit`."""
        if reply.ok:
            return True
        self.mark_lost(permit, "renewal")
        return False

    def after_release(self, permit: BulkheadPermit, reply: BulkheadReply) -> None:
        if not reply.ok:
            self.mark_lost(permit, "release")

    def orphan(self, token: str) -> None:
        """An acquire whose reply was lost: Redis may hold its lease. Remembered (bounded)
        so the next acquire that reaches Redis cancels it instead of waiting a lease."""
        with self._orphans_lock:
            if len(self._orphans) < 1000:
                self._orphans.append(token)

    def take_orphans(self) -> list[str]:
        with self._orphans_lock:
            tokens, self._orphans = self._orphans, []
        return tokens

    def release_pending(self, permit: BulkheadPermit) -> PendingCall:
        """The release script call with its reply and outage handling (sent by a shell)."""
        call = self.release_call(permit.token)

        def released(raw: Any) -> None:
            self.health.succeeded()
            self.after_release(permit, decode_reply(raw))

        def unavailable(error: BaseException | None) -> None:
            if error is not None:
                self.health.failed(error)  # the lease expires on its own

        return PendingCall(self.script, call.keys, call.args, self.health.usable, released,
                           unavailable)

    def needs_release_call(self, permit: BulkheadPermit) -> bool:
        """Mark `permit` released; True when Redis must be told (it holds a live lease)."""
        if permit.released:
            return False
        permit.released = True
        return not permit.local and not permit.lost and self.health.usable()

    def full(self, in_use: int, waited: float, local: bool = False) -> BulkheadFull:
        with self._lock:
            self.rejected_here += 1
        limit = self.config.effective_fallback_limit if local else self.config.max_concurrent_calls
        return BulkheadFull(self.name, limit, in_use, waited, local)

    def mark_lost(self, permit: BulkheadPermit, when: str) -> None:
        """A lease was found gone: say so loudly, once per permit."""
        if permit.lost:
            return
        permit.lost = True
        with self._lock:
            self.lost_here += 1
        logger.warning("bulkhead %r: the lease of permit %s was lost (found gone at %s); "
                       "the call ran without a fleet-wide permit", self.name, permit.token, when)

    def metrics(self, reply: BulkheadReply, fallback_in_use: int) -> BulkheadMetrics:
        limit = self.config.max_concurrent_calls
        return BulkheadMetrics(
            max_concurrent_calls=limit, in_use=reply.in_use,
            available=max(0, limit - reply.in_use), waiting=reply.waiting,
            rejected=reply.rejected, lost=reply.lost, acquired=reply.acquired,
            rejected_here=self.rejected_here, lost_here=self.lost_here,
            fallback_in_use=fallback_in_use)
