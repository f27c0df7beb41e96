"""The bulkhead's pure core, shared by the sync and asyncio front ends (no I/O).

Script calls, reply decoding, and every decision of an acquire (`Acquisition`), a
renewal and a release. The semaphore itself is ``lua/bulkhead.lua``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

from .._runtime import forking
from .._runtime.connection import DEFAULT_URL, owns_client
from .._runtime.events import Event, Listeners
from .._runtime.health import RedisHealth, shared_health
from .._runtime.keys import DEFAULT_PREFIX, BulkheadKeys, validate_name
from .._runtime.options import to_ms
from .._runtime.scripts import LuaScript, PendingCall, ScriptCall, load_script
from ..errors import BulkheadFull
from .adaptive import SuccessBatch, outcome_of, priority_level, priority_share
from .config import BulkheadConfig, build_bulkhead_config

logger = logging.getLogger("distbreaker")
SCRIPT_NAME = "bulkhead"

#: A registered waiter stays counted this long after the deadline it announced,
#: covering the round trip between its wake-up and its next acquire.
WAITER_GRACE_MS = 1000
#: Never ask BLPOP for less than this (a timeout that rounds to 0 blocks forever).
MIN_BLOCK = 0.002
#: Extra time after the next lease deadline before trying again (clock granularity).
DEADLINE_SLACK = 0.005
#: How late Redis may end a blocking wait: it checks blocked clients' timeouts on its
#: timer (hz 10 by default, so up to 100 ms). The last stretch of a wait is slept
#: client-side instead, so max_wait_duration is kept (issue 23).
SERVER_TIMER = 0.1


#: The event kinds a bulkhead's listeners get (per process): permitted (`duration`:
#: the wait), rejected (`error`: the BulkheadFull, `reason`), finished (`duration`:
#: how long the permit was held).
EVENT_KINDS = ("permitted", "rejected", "finished")


@dataclasses.dataclass(eq=False)
class BulkheadPermit:
    """One permit: `token` is the lease holder id in Redis (empty for a local permit).

    `lost` turns True when a renewal or the release found the lease gone (it
    expired or was deleted): the call ran without a fleet-wide permit for a while.
    `acquired_at` is when the granting acquire was sent and `renewed_at` when the last
    successful renewal was (monotonic): the lease ends one `lease` after the later.
    `expired` turns True when the call was refused because that time had passed
    before it started.
    """

    token: str
    local: bool = False
    acquired_at: float = 0.0
    renewed_at: float = 0.0
    expired: bool = False
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
class LocalCounts:
    """This process's own figures (no Redis): calls it rejected, leases it found lost."""

    rejected: int
    lost: int


@dataclasses.dataclass(frozen=True)
class BulkheadMetrics:
    """Fleet-wide figures from Redis, plus this process's own counters.

    `rejected`, `lost` and `acquired` are fleet-wide totals since the keys were
    created (they expire with the keys after `key_ttl` of idleness). `limit` is the
    fleet-wide limit in force: `max_concurrent_calls`, or an adaptive limit's current
    value (`available` is counted from it).
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
    limit: int = 0


def decode_reply(raw: Sequence[Any] | int) -> BulkheadReply:
    """Decode the script's reply: the full array, or the integer 1 of a granted acquire
    or a release on the hot path (the figures it leaves out read as 0)."""
    v = [int(raw)] if isinstance(raw, int) else [int(x) for x in raw]
    v += [0] * (9 - len(v))
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
    """One bulkhead's protocol state: script calls, the Redis health, orphaned tokens
    and this process's counts, and the decisions on renewals and releases."""

    def __init__(self, name: str, config: BulkheadConfig, prefix: str = DEFAULT_PREFIX,
                 target: Any = None) -> None:
        self.name = validate_name(name)
        self.config = config
        self.keys = BulkheadKeys.build(name, prefix)
        self.script: LuaScript = load_script(SCRIPT_NAME)
        #: Shared with the process's other components of the same Redis (`target`).
        self.health: RedisHealth = shared_health(target, config.redis_retry_max_backoff)
        self._lease_ms = max(1, to_ms(config.lease))
        self._ttl_ms = max(1, to_ms(config.key_ttl))
        self._adaptive = config.adaptive.wire() if config.adaptive is not None else ""
        self._lock = threading.Lock()
        self.rejected_here = 0
        self.lost_here = 0
        self._orphans_lock = threading.Lock()
        self._orphans: list[str] = []
        self._owed: dict[str, float] = {}   # releases Redis did not get: token -> when
        self._successes = SuccessBatch(config.adaptive.batch if config.adaptive else 1)
        self.listeners = Listeners(EVENT_KINDS, default=EVENT_KINDS)
        forking.register(self)

    def event(self, kind: str, **fields: Any) -> None:
        """Emit one `Event` of `kind` if somebody listens (checked before building it)."""
        if kind in self.listeners.wanted:
            self.listeners.emit(Event(kind, "bulkhead", self.name, **fields))

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock and this process's own (zero) counts."""
        self._lock = threading.Lock()
        self.rejected_here = 0
        self.lost_here = 0
        self._orphans_lock = threading.Lock()
        self._orphans = []  # the parent's to cancel, not ours
        self._owed = {}
        self._successes = SuccessBatch(self._successes.size)

    # -- script calls -------------------------------------------------------------
    def _call(self, op: str, token: str, extra: int = 0, *tail: Any) -> ScriptCall:
        keys = self.keys
        args: tuple[Any, ...] = (op, token, self.config.max_concurrent_calls, self._lease_ms,
                                 self._ttl_ms)
        if tail or extra or self._adaptive:  # ARGV[6], [7] default to 0 and "" (each costs)
            args = (*args, extra, self._adaptive, *tail)
        # KEYS[3], the notify list, is derived by the script when it needs it
        return ScriptCall((keys.leases, keys.meta), args)

    @staticmethod
    def new_token() -> str:
        return secrets.token_hex(12)

    def acquire_call(self, token: str, remaining: float, share: int = 1_000_000) -> ScriptCall:
        """Acquire; with time left, a refusal registers `token` as a waiter. `share`: of
        the limit this call's priority may use (millionths)."""
        wait_ms = to_ms(remaining) + WAITER_GRACE_MS if remaining > 0 else 0
        if share >= 1_000_000:
            return self._call("acquire", token, wait_ms)
        return self._call("acquire", token, wait_ms, share)

    def release_call(self, token: str, outcome: str = "", latency_ms: int = 0,
                     retry_after_ms: int = 0, weight: float = 1.0) -> ScriptCall:
        """Release; an adaptive bulkhead also gets the call's outcome and latency (and,
        for a sampled success, how many successes it stands for)."""
        if not outcome or not self._adaptive:
            return self._call("release", token)
        if weight == 1:
            return self._call("release", token, 0, outcome, latency_ms, retry_after_ms)
        return self._call("release", token, 0, outcome, latency_ms, retry_after_ms,
                          f"{weight:g}")

    def restart_call(self) -> ScriptCall:
        """Slow start: an adaptive limit restarts at its minimum (after a recovery)."""
        return self._call("restart", "")

    def share(self, priority: str | int | None) -> int:
        """The share of the limit (millionths) a call of `priority` may use; a call
        without one may use all of it (as before priorities existed)."""
        if priority is None:
            return 1_000_000
        return priority_share(priority_level(priority), self.config.critical_reserve,
                              self.config.sheddable_share)

    def renew_call(self, token: str) -> ScriptCall:
        return self._call("renew", token)

    def cancel_call(self, token: str) -> ScriptCall:
        """Undo an interrupted acquire: drop the token's lease (if granted) and waiter entry."""
        return self._call("cancel", token)

    def metrics_call(self) -> ScriptCall:
        return self._call("metrics", "")

    # -- decisions -------------------------------------------------------------------
    def begin_acquire(self, priority: str | int | None = None) -> Acquisition:
        return Acquisition(self, self.share(priority))

    def block_for(self, remaining: float, reply: BulkheadReply, cap: float) -> float:
        """How long a refused waiter blocks on the notify list before asking again.

        Bounded by the remaining wait, by the next lease deadline (a reaped lease
        frees a permit without any release) and by the client's socket timeout.
        """
        bound = remaining
        if reply.next_deadline_ms > 0:
            bound = min(bound, reply.next_deadline_ms / 1000.0 + DEADLINE_SLACK)
        return max(MIN_BLOCK, min(bound, cap))

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

    def owe_release(self, token: str) -> None:
        """A release that did not reach Redis (an outage): its lease would be held until
        it expires, so it is sent again (`owed_releases`) as soon as Redis answers."""
        with self._orphans_lock:
            if len(self._owed) < 10_000:
                self._owed.setdefault(token, time.monotonic())

    def owed_tokens(self) -> list[str]:
        """The tokens whose release is still owed to Redis (sent as a cancel: it drops the
        lease without counting it lost if it expired meanwhile, and the outcome is not
        reported twice); `release_delivered` forgets one once Redis had it."""
        with self._orphans_lock:
            return list(self._owed)

    def release_delivered(self, token: str) -> None:
        with self._orphans_lock:
            self._owed.pop(token, None)

    @property
    def releases_owed(self) -> int:
        return len(self._owed)

    def take_orphans(self) -> list[str]:
        with self._orphans_lock:
            tokens, self._orphans = self._orphans, []
        return tokens

    def renew_pending(self, permit: BulkheadPermit) -> PendingCall | None:
        """The renewal of a held permit's lease (None once released). Its result: whether
        to keep renewing (Redis unavailable: yes, the next interval tries again)."""
        if permit.released:
            return None
        call = self.renew_call(permit.token)
        sent_at = time.monotonic()

        def renewed(raw: Any) -> bool:
            self.health.succeeded()
            keep = self.after_renew(permit, decode_reply(raw))
            if keep:
                permit.renewed_at = max(permit.renewed_at, sent_at)
            return keep

        def unavailable(error: BaseException | None) -> bool:
            if error is not None:
                self.health.failed(error)
            return True

        return PendingCall(self.script, call.keys, call.args, self.health.usable, renewed,
                           unavailable)

    def take_release(self, permit: BulkheadPermit) -> bool:
        """Mark `permit` released (releasing is idempotent); True when something must be
        given back: a local permit's semaphore slot, a Redis permit's lease (unless lost)."""
        if permit.released:
            return False
        permit.released = True
        if "finished" in self.listeners.wanted:
            self.event("finished", duration=time.monotonic() - permit.acquired_at,
                       reason="lost" if permit.lost else "")
        return permit.local or not permit.lost

    def release_pending(self, permit: BulkheadPermit,
                        error: BaseException | None = None) -> PendingCall | None:
        """Mark `permit` released; the release call Redis is still owed (sent by a shell
        or pipelined by a Policy), or None. Redis unavailable: the lease expires. `error`
        (None: the call returned) is what an adaptive limit learns from."""
        if not self.take_release(permit):
            return None
        adaptive = self.config.adaptive
        outcome, retry_after_ms = outcome_of(error) if adaptive is not None else ("", 0)
        batch: tuple[int, int] | None = None
        if outcome == "ok":
            batch = self._successes.add(max(0.0, (time.monotonic() - permit.acquired_at)
                                            * 1000))
            call = (self.release_call(permit.token) if batch is None else
                    self.release_call(permit.token, "ok", batch[1], 0, batch[0]))
        elif outcome:
            latency_ms = max(0, to_ms(time.monotonic() - permit.acquired_at))
            call = self.release_call(permit.token, outcome, latency_ms, retry_after_ms)
        else:
            call = self.release_call(permit.token)

        def released(raw: Any) -> None:
            self.health.succeeded()
            self.after_release(permit, decode_reply(raw))

        def unavailable(error: BaseException | None) -> None:
            if error is not None:
                self.health.failed(error)
            if batch is not None:
                self._successes.put_back(*batch)
            self.owe_release(permit.token)   # sent again once Redis answers

        return PendingCall(self.script, call.keys, call.args, self.health.usable, released,
                           unavailable)

    def expired_lease(self, permit: BulkheadPermit, now: float) -> BulkheadFull | None:
        """The refusal of a Redis permit whose lease ended before its call starts (the
        holder was paused, renewals too: another worker may hold the permit now), or None.
        """
        if permit.local or not permit.token or permit.released:
            return None
        if now < max(permit.acquired_at, permit.renewed_at) + self.config.lease:
            return None
        permit.expired = True
        with self._lock:
            self.rejected_here += 1
        return BulkheadFull(self.name, self.config.max_concurrent_calls, -1,
                            reason="permit lease expired before the call")

    def full(self, in_use: int, waited: float, local: bool = False,
             limit: int | None = None) -> BulkheadFull:
        """The refusal; `limit`: the one Redis applied (an adaptive bulkhead's)."""
        with self._lock:
            self.rejected_here += 1
        if limit is None:
            limit = self.config.effective_fallback_limit if local else \
                self.config.max_concurrent_calls
        full = BulkheadFull(self.name, limit, in_use, waited, local)
        if "rejected" in self.listeners.wanted:
            self.event("rejected", duration=waited, error=full,
                       reason=f"{in_use} of {limit} permits in use"
                              + (" (local fallback)" if local else ""))
        return full

    def mark_lost(self, permit: BulkheadPermit, when: str) -> None:
        """A lease was found gone: say so loudly, once per permit."""
        if permit.lost:
            return
        permit.lost = True
        if permit.expired:  # its call never ran: nothing ran without a permit
            return
        with self._lock:
            self.lost_here += 1
        logger.warning("bulkhead %r: the lease of permit %s was lost (found gone at %s); "
                       "the call ran without a fleet-wide permit", self.name, permit.token, when)

    def local_counts(self) -> LocalCounts:
        with self._lock:
            return LocalCounts(self.rejected_here, self.lost_here)

    def metrics(self, raw: Sequence[Any], fallback_in_use: int) -> BulkheadMetrics:
        """The metrics script call's reply, with this process's counters."""
        reply = decode_reply(raw)
        limit = reply.limit if self._adaptive else self.config.max_concurrent_calls
        return BulkheadMetrics(
            max_concurrent_calls=self.config.max_concurrent_calls, in_use=reply.in_use,
            available=max(0, limit - reply.in_use), waiting=reply.waiting,
            rejected=reply.rejected, lost=reply.lost, acquired=reply.acquired,
            rejected_here=self.rejected_here, lost_here=self.lost_here,
            fallback_in_use=fallback_in_use, limit=limit)


class Acquisition:
    """One `acquire()` in progress: its deadline and token, and the decision after each
    step. The shells only send the calls, block on the notify list and take semaphores.
    """

    def __init__(self, codec: BulkheadCodec, share: int = 1_000_000) -> None:
        self._codec = codec
        self._share = share
        self.started = time.monotonic()
        self.deadline = self.started + codec.config.max_wait_duration
        #: False: Redis is in backoff, the local fallback semaphore decides.
        self.via_redis = codec.health.usable()
        #: Earlier acquires whose reply was lost, to cancel before asking (see `orphan`).
        self.orphans = codec.take_orphans() if self.via_redis else []
        self.token = codec.new_token()
        self._remaining = 0.0
        self._sent_at = self.started
        self._refusal: BulkheadReply | None = None

    def remaining(self) -> float:
        """Seconds left to wait for a permit (<= 0: do not wait)."""
        return self.deadline - time.monotonic()

    def request(self) -> ScriptCall:
        """The next acquire call; with time left, a refusal registers us as a waiter."""
        self._remaining = self.remaining()
        self._sent_at = time.monotonic()
        return self._codec.acquire_call(self.token, self._remaining, self._share)

    def answer(self, raw: Sequence[Any]) -> BulkheadPermit | None:
        """The permit Redis granted, or None: wait `block_for()` on the notify list, then
        `request()` again. Raises BulkheadFull when no time is left."""
        codec = self._codec
        codec.health.succeeded()
        reply = decode_reply(raw)
        if reply.ok:
            return self._permitted(BulkheadPermit(self.token, acquired_at=self._sent_at))
        if self._remaining <= 0:
            raise codec.full(reply.in_use, self._waited(), limit=reply.limit)
        self._refusal = reply
        return None

    def block_for(self, cap: float) -> float:
        """How long to block on the notify list after the last refusal (`cap`: the
        longest one blocking call may take on the waiting client); 0: do not block in
        Redis, whose timeout may fire up to `SERVER_TIMER` late, but sleep `pause()`."""
        assert self._refusal is not None
        remaining = self.remaining()
        seconds = self._codec.block_for(remaining, self._refusal, cap)
        if seconds <= remaining - SERVER_TIMER:
            return seconds  # ends before the deadline even when Redis ends it late
        left = remaining - SERVER_TIMER
        return left if left > MIN_BLOCK else 0.0

    def pause(self) -> float:
        """The client-side sleep before asking again when `block_for` says 0: the end of
        the wait (or the next lease deadline), at most `SERVER_TIMER`."""
        assert self._refusal is not None
        bound = self._codec.block_for(self.remaining(), self._refusal, SERVER_TIMER)
        return max(0.0, min(bound, self.remaining()))

    def unavailable(self, error: BaseException) -> None:
        """Redis failed mid-acquire (the local fallback decides now); it may have granted
        the lease before the reply was lost, so the token is cancelled later."""
        self._codec.health.failed(error)
        self._codec.orphan(self.token)

    @staticmethod
    def must_cancel(error: BaseException) -> bool:
        """An acquire interrupted by anything but BulkheadFull (a cancellation, Ctrl-C)
        is cancelled in Redis: it may hold the token's lease or waiter entry."""
        return not isinstance(error, BulkheadFull)

    def local_full(self, in_use: int) -> BulkheadFull:
        """The local fallback semaphore stayed full for the whole wait."""
        return self._codec.full(in_use, self._waited(), local=True)

    def local_permit(self) -> BulkheadPermit:
        return self._permitted(BulkheadPermit("", local=True, acquired_at=time.monotonic()))

    def _permitted(self, permit: BulkheadPermit) -> BulkheadPermit:
        if "permitted" in self._codec.listeners.wanted:
            self._codec.event("permitted", duration=permit.acquired_at - self.started,
                              reason="local fallback" if permit.local else "")
        return permit

    def _waited(self) -> float:
        return time.monotonic() - self.started if self._codec.config.max_wait_duration else 0.0


class BulkheadCore:
    """What the sync and asyncio bulkheads share that is not I/O."""

    def __init__(self, name: str, redis: Any, config: BulkheadConfig | None, prefix: str,
                 overrides: dict[str, Any]) -> None:
        self.config = build_bulkhead_config(config, overrides)
        self._codec = BulkheadCodec(name, self.config, prefix, redis)
        #: A URL (the clients built from it are this bulkhead's) or a given client.
        self._target = DEFAULT_URL if redis is None else redis
        self._owns_clients = owns_client(redis)

    @property
    def name(self) -> str:
        return self._codec.name

    @property
    def keys(self) -> BulkheadKeys:
        """The Redis keys of this bulkhead (see lua/bulkhead.lua)."""
        return self._codec.keys

    def lease_rejection(self, permit: BulkheadPermit) -> BulkheadFull | None:
        """Checked immediately before the protected function is invoked: the refusal to
        raise (after releasing the permit) when its lease has already ended, else None."""
        return self._codec.expired_lease(permit, time.monotonic())

    @property
    def local_fallback_active(self) -> bool:
        """True while Redis is marked unreachable and the local limit governs this process."""
        return self._codec.health.down

    def local_counts(self) -> LocalCounts:
        """Calls this process rejected and leases it found lost (for exporters)."""
        return self._codec.local_counts()

    def add_listener(self, listener: Any, kinds: Any = None) -> None:
        """Call `listener(Event)` for this process's bulkhead events of `kinds`
        (default all of `EVENT_KINDS`: permitted, rejected, finished)."""
        self._codec.listeners.add(listener, kinds)

    def remove_listener(self, listener: Any) -> None:
        self._codec.listeners.remove(listener)

    def __repr__(self) -> str:
        return f"Bulkhead({self.name!r}, max_concurrent_calls={self.config.max_concurrent_calls})"
