"""What the sync and asyncio pools share, written once for asyncio.

scripts/unasync.py writes `_shell_sync.py` from this file; the front ends add only
their docstrings.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Concatenate, ParamSpec, TypeVar

from .._runtime.connection import LoopClients
from .._runtime.health import redis_unavailable_as
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.preflight import preflight_async
from .._runtime.scripts import run_script_async, send_async
from ..errors import NoPoolMember, RedisUnavailable
from .config import PoolConfig
from .core import MemberChange, Pick, PoolCore, PoolStatus, decode_change

P = ParamSpec("P")
T = TypeVar("T")


class PoolUse:
    """``with pool.use() as pick:``: a pick, and its outcome recorded when the block ends
    (an exception: classified, then raised on; none: success, or what the block set on
    the pick: `status`, `headers`, `outcome`)."""

    def __init__(self, pool: PoolShell, key: Any, avoid: Iterable[str]) -> None:
        self._pool = pool
        self._key = key
        self._avoid = avoid
        self.pick: Pick | None = None

    async def __aenter__(self) -> Pick:
        self.pick = await self._pool.pick(self._key, avoid=self._avoid)
        return self.pick

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        pick = self.pick
        if pick is None or pick.recorded:
            return None
        if exc is not None and not isinstance(exc, Exception):  # cancelled, interrupted
            await self._pool.release(pick)
        else:
            await self._pool.record(pick, exc)
        return None


class PoolShell(PoolCore):
    """The pool's picks, records and operator actions around their I/O."""

    def __init__(self, name: str, redis: Any = None, config: PoolConfig | None = None,
                 *, prefix: str = DEFAULT_PREFIX, **overrides: Any) -> None:
        super().__init__(name, config, prefix, overrides, redis)
        self._clients = LoopClients(redis, self.config.redis_timeout)

    @property
    def _client(self) -> Any:
        """The client (asyncio: the running event loop's; a URL's is shared)."""
        return self._clients.get()

    # -- choosing a member, recording how it went -------------------------------------------
    async def pick(self, key: Any = None, *, avoid: Iterable[str] = (),
                   track: bool = True) -> Pick:
        """Choose a member: power of two choices among the members not ejected
        (fleet-wide in-flight counts or latency, by weight), all of them in panic; `key`:
        stickiness (the same key, the same member while it is healthy); `avoid`: members
        not to choose unless nothing else is left (a retry's). One script call; the pick
        holds a lease counted in the member's in-flight count until it is recorded
        (`track=False`: no lease, no in-flight count). Raises `NoPoolMember`."""
        found: Pick | None = await send_async(self._client,
                                              self.pick_pending(key, avoid, track))
        if found is None and self.members_to_restore and not self.local_fallback_active:
            try:  # the keys had expired (or a new Redis): this process's members go back
                await self._members("init", self.members_to_restore)
            except RedisUnavailable:
                found = self.local_pick(key, avoid)
            else:
                found = await send_async(self._client, self.pick_pending(key, avoid, track))
        if found is None:
            raise NoPoolMember(self.name)
        self.learn(found)
        return found

    async def record(self, pick: Pick | str, error: BaseException | None = None, *,
                     status: int | None = None, headers: Any = None,
                     outcome: str | None = None, duration: float | None = None,
                     eject_for: float | None = None) -> MemberChange | None:
        """Record how a picked call went, once (one script call, which may eject the member
        for the whole fleet). `error` the exception it raised (classified: an HTTP status
        it carries, no response = local-origin failure, else 5xx); or `status` (502, 503,
        504: gateway failure; other 5xx and 429: failure; else success) with `headers`
        (a Retry-After on a 429/503 ejects the member that long); or `outcome` ("success",
        "5xx", "gateway", "local"). `duration` defaults to the time since the pick.
        `eject_for` seconds: eject the member now (within the cap). A member name instead
        of a pick records without a lease. None while Redis is unreachable (dropped)."""
        code, duration, eject_for = self.finish(pick, error, status, headers, outcome,
                                                duration, eject_for)
        change: MemberChange | None = await send_async(
            self._client, self.record_pending(pick, code, duration, eject_for))
        return change

    async def repick(self, previous: Pick, error: BaseException | None = None, *,
                     status: int | None = None, headers: Any = None,
                     outcome: str | None = None, duration: float | None = None,
                     eject_for: float | None = None, key: Any = None,
                     avoid: Iterable[str] = (), track: bool = True) -> Pick:
        """A retry on another member: record how `previous` went (as `record`) and pick
        again, `previous.member` avoided (and `avoid`) unless nothing else is left, in
        ONE script call on one server time. Raises `NoPoolMember`."""
        code, duration, eject_for = self.finish(previous, error, status, headers, outcome,
                                                duration, eject_for)
        found: Pick | None = await send_async(self._client, self.repick_pending(
            previous, code, duration, eject_for, key, avoid, track))
        if found is None:
            raise NoPoolMember(self.name)
        self.learn(found)
        return found

    async def release(self, pick: Pick) -> None:
        """Give a pick back without an outcome (the call was abandoned): only its lease
        (and in-flight count) goes."""
        if not pick.recorded:
            pick.recorded = True
            await send_async(self._client, self.record_pending(pick, "n", None, None))

    def use(self, key: Any = None, *, avoid: Iterable[str] = ()) -> PoolUse:
        """``with pool.use() as pick: call(pick.member)``: picks on entry, records on exit."""
        return PoolUse(self, key, avoid)

    async def call(self, fn: Callable[Concatenate[str, P], Awaitable[T]], /, *args: P.args,
                   **kwargs: P.kwargs) -> T:
        """Await ``fn(member, *args, **kwargs)`` on a picked member and record the outcome
        (an exception: classified as in `record`)."""
        async with self.use() as pick:
            return await fn(pick.member, *args, **kwargs)

    # -- members ---------------------------------------------------------------------------
    async def _members(self, mode: str, members: Any) -> int:
        normalized = self.normalize(members)
        with redis_unavailable_as(f"pool {self.name!r}"):
            raw = await send_async(self._client, self.members_pending(mode, normalized))
        if mode != "init":
            self.remember(mode, normalized)
        return int(raw[0])

    async def set_members(self, members: Any) -> int:
        """Replace the pool's members fleet-wide (names, (name, weight) pairs or a mapping
        name -> weight). Members kept keep their health record; new ones start healthy;
        members left out are forgotten. Answers how many members the pool has."""
        return await self._members("replace", members)

    async def add_members(self, members: Any) -> int:
        """Add members (or change their weights), fleet-wide."""
        return await self._members("add", members)

    async def remove_members(self, members: Any) -> int:
        """Remove members, fleet-wide (their records and in-flight counts go)."""
        return await self._members("remove", members)

    # -- operator actions and reads (Redis only: RedisUnavailable while it cannot answer) --
    async def _run(self, args: list[str]) -> Any:
        with redis_unavailable_as(f"pool {self.name!r}"):
            return await run_script_async(self._client, self._script, self.keys.script_keys,
                                          args)

    async def eject(self, member: str, duration: float | None = None, *,
                    actor: str = "") -> MemberChange:
        """Eject `member` for `duration` seconds (None: until `uneject`), fleet-wide; an
        operator's ejection is not bound by max_ejection_percent."""
        raw = await self._run(self.eject_args(member, duration, actor))
        return self.note_change(decode_change(member, raw))

    async def uneject(self, member: str, *, actor: str = "") -> MemberChange:
        """Put `member` back at once, healthy, its ejection count forgotten (Envoy #6016);
        ends an exemption too."""
        raw = await self._run(self.uneject_args(member, actor))
        return self.note_change(decode_change(member, raw))

    async def exempt(self, member: str, duration: float | None = None, *,
                     actor: str = "") -> MemberChange:
        """Put `member` back at once and never eject it by the rules (consecutive failures,
        success rate, ...) for `duration` seconds (None: until `uneject`); an operator's
        `eject` still works. For a member known good whose errors are expected (a canary,
        a maintenance window): a breaker's DISABLED."""
        raw = await self._run(self.exempt_args(member, duration, actor))
        return self.note_change(decode_change(member, raw))

    async def status(self) -> PoolStatus:
        """Every member as the fleet sees it (one script call, nothing written)."""
        return self.decode_status(await self._run(self.status_args()))

    async def members(self) -> list[str]:
        """The pool's members in Redis, sorted."""
        return [m.member for m in (await self.status()).members]

    async def history(self, member: str | None = None, count: int = 100) -> list[dict[str, str]]:
        """The pool's last events, newest first (of `member` only, when given): each a dict
        of id, member, event, why, until (server ms), actor."""
        with redis_unavailable_as(f"pool {self.name!r}"):
            entries = await self._client.xrevrange(self.keys.history, count=count if member
                                                   is None else max(count, 1000))
        return self.decode_history(entries, member, count)

    async def reset(self) -> None:
        """Forget the pool in Redis: members, health records, leases and history."""
        with redis_unavailable_as(f"pool {self.name!r}"):
            await self._client.delete(*self.keys.script_keys)

    async def check(self) -> None:
        """Raise `CheckFailed` (a `RedisUnavailable` naming the cause and its fix) unless
        Redis can serve this pool (a wrong URL, a replica, a missing ACL permission, a full
        Redis): for an app that would rather fail at start-up than pick locally. Writes
        nothing; picks never raise it."""
        await preflight_async(self._client, f"pool {self.name!r}", ("pool",),
                              self.keys.members, "")

    async def aclose(self) -> None:
        """Close the client this pool built from a URL (a client given to it is yours)."""
        await self._clients.release()
