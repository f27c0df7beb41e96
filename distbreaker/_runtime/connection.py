"""Turning the `redis=` argument (a URL or a redis-py client) into a client.

A URL builds a client with the config's short `redis_timeout` per command, a separate
connect timeout (`CONNECT_TIMEOUT`) and pool wait (`ASYNC_POOL_WAIT`), that never
retries on its own (distbreaker's backoff decides); a given client is used as it is, timeouts and
all. redis-py's pools open fresh connections in a forked child by themselves.

Components built from the same URL and timeouts in one process share one client (one
connection pool): `shared_sync_client` / `shared_async_client` hand out a
reference-counted client and `release_sync_client` / `release_async_client` close it
when its last user lets go. asyncio clients are shared per event loop (their
connections belong to the loop that opened them).

``memory://[name]`` is an in-process Redis for tests: a fakeredis server per
name (shared by every client of this process that names it, sync and asyncio
alike) running the very same Lua scripts. It lives as long as the process (use a
name per test for a fresh one); it is not shared with other processes (a forked
child has a copy).
"""

from __future__ import annotations

import asyncio as _asyncio
import dataclasses
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

DEFAULT_URL = "redis://localhost:6379/0"
ASYNC_MAX_CONNECTIONS = 32
#: Seconds a call may queue for a free asyncio connection. Queueing is local: a burst
#: of coroutines waits its turn (each command is bounded by `redis_timeout`), it is not
#: an outage; only a pool that stays exhausted this long counts as one.
ASYNC_POOL_WAIT = 5.0
#: Seconds a new connection may take (TCP connect and handshake), at least: a burst of
#: threads or coroutines opening connections on a busy machine is not an outage. A
#: command on an open connection is bounded by `redis_timeout`. The URL's
#: ``?socket_connect_timeout=`` overrides it.
CONNECT_TIMEOUT = 1.0
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379

MEMORY_SCHEME = "memory://"
#: Every memory:// server of this process, by name; kept for the process's lifetime, so a
#: breaker dropped and built again (or a Registry rebuilt) finds the same state.
_memory_servers: dict[str, Any] = {}
_memory_lock = threading.Lock()

_SYNC_TYPES: tuple[type, ...] = (redis.Redis, redis.cluster.RedisCluster)
_ASYNC_TYPES: tuple[type, ...] = (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)


def connect_timeout(timeout: float) -> float:
    """The connect timeout of URL-built clients whose command timeout is `timeout`."""
    return max(timeout, CONNECT_TIMEOUT)


def _url_options(timeout: float) -> dict[str, Any]:
    return {"socket_timeout": timeout, "socket_connect_timeout": connect_timeout(timeout),
            "retry_on_timeout": False, "health_check_interval": 0}


def _no_retry(asyncio: bool) -> Any:
    """No client-side retries: redis-py's default (10, with backoff) made one lookup
    of unreachable sentinels take about 4 s, inside a protected call."""
    return (AsyncRetry if asyncio else Retry)(NoBackoff(), 0)


@dataclasses.dataclass(frozen=True)
class SentinelURL:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    def master_options(self, timeout: float, asyncio: bool = False) -> dict[str, Any]:
        """Connection options of the primary's connections."""
        options = {"db": self.db, "username": self.username, "password": self.password,
                   **_url_options(timeout), "retry": _no_retry(asyncio)}
        if self.ssl:
            options["ssl"] = True
        return options

    def sentinel_options(self, timeout: float, asyncio: bool = False) -> dict[str, Any]:
        """Connection options of the connections to the sentinels themselves."""
        return {"socket_timeout": timeout, "socket_connect_timeout": connect_timeout(timeout),
                "username": self.sentinel_username, "password": self.sentinel_password,
                "retry": _no_retry(asyncio)}


def _host_port(item: str, url: str) -> tuple[str, int]:
    if item.startswith("["):  # [ipv6]:port
        host, _, rest = item[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
    if not host:
        raise ValueError(f"sentinel URL {url!r} has an empty host")
    try:
        return host, int(port) if port else DEFAULT_SENTINEL_PORT
    except ValueError:
        raise ValueError(f"sentinel URL {url!r} has a bad port {port!r}") from None


def parse_sentinel_url(url: str) -> SentinelURL | None:
    """The parts of a ``redis+sentinel://`` URL; None for any other scheme."""
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        return None
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    sentinels = tuple(_host_port(item, url) for item in hosts.split(",") if item)
    if not sentinels:
        raise ValueError(f"sentinel URL {url!r} names no sentinel host")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not 1 <= len(path) <= 2:
        raise ValueError(f"sentinel URL {url!r} must end in /<service name>[/<db>]")
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise ValueError(f"sentinel URL {url!r} has a bad database number {path[1]!r}") from None
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return SentinelURL(sentinels=sentinels, service=path[0], db=db,
                       username=unquote(username) or None, password=unquote(password) or None,
                       ssl=parts.scheme.startswith("rediss"),
                       sentinel_username=query.get("sentinel_username"),
                       sentinel_password=query.get("sentinel_password"))


def _sentinel_master(spec: SentinelURL, timeout: float, *, asyncio: bool,
                     pool_options: dict[str, Any] | None = None) -> Any:
    """A client of the primary that Sentinel names now (found again after a failover).

    Nothing connects here: the primary is looked up on the first command.
    `pool_options` override the connection pool's options (and its class).
    """
    module: Any = redis.asyncio.sentinel if asyncio else redis.sentinel
    manager = module.Sentinel(list(spec.sentinels),
                              sentinel_kwargs=spec.sentinel_options(timeout, asyncio))
    options = spec.master_options(timeout, asyncio)
    options.update(pool_options or {})
    return manager.master_for(spec.service, **options)


class _AsyncBlockingSentinelPool(redis.asyncio.sentinel.SentinelConnectionPool,
                                 redis.asyncio.BlockingConnectionPool):
    """Sentinel's pool that queues for a free connection (see `async_client`)."""


def _check_client(target: Any, wanted: tuple[type, ...], other: tuple[type, ...],
                  hint: str) -> Any:
    if isinstance(target, other) and not isinstance(target, wanted):
        raise TypeError(hint)
    if isinstance(target, (redis.sentinel.Sentinel, redis.asyncio.sentinel.Sentinel)):
        raise TypeError("redis must be a client, not a Sentinel: pass "
                        "sentinel.master_for(<service name>) or a redis+sentinel:// URL")
    if not hasattr(target, "evalsha"):
        raise TypeError(f"redis must be a URL or a redis-py client, got {type(target).__name__}")
    return target


def owns_client(target: Any) -> bool:
    """True when `target` is a URL (or None, the default URL): the client built from it
    belongs to the component, which closes it; a client given to a component is the
    caller's."""
    return target is None or isinstance(target, str)


def is_memory_url(target: Any) -> bool:
    """True for a ``memory://`` URL (the in-process fakeredis)."""
    return isinstance(target, str) and target.startswith(MEMORY_SCHEME)


def memory_client(url: str, asyncio: bool = False) -> Any:
    """A fakeredis client of the in-process server that ``memory://<name>`` names."""
    import fakeredis

    name = url[len(MEMORY_SCHEME):]
    with _memory_lock:
        server = _memory_servers.get(name)
        if server is None:
            server = _memory_servers[name] = fakeredis.FakeServer()
    # One host per server, so that clients of one server share what is keyed by host
    # (a batched breaker's subscriber) and clients of two servers do not.
    cls = fakeredis.FakeAsyncRedis if asyncio else fakeredis.FakeRedis
    return cls(server=server, host=f"distbreaker-memory-{name}")


def sync_client(target: Any, timeout: float) -> Any:
    """A sync redis-py client from a URL, or the given client (None: localhost).

    Accepted clients: ``redis.Redis`` (including ``Sentinel.master_for``'s) and
    ``redis.cluster.RedisCluster`` (a cluster is given as a client: building one
    connects at once, which a constructor must not do). Accepted URLs: ``redis://``,
    ``rediss://``, ``unix://`` and ``redis+sentinel://[user:password@]host[:port][,...]
    /service[/db]`` (``rediss+sentinel://`` for TLS to the primary; the query options
    ``sentinel_username`` and ``sentinel_password`` authenticate to the sentinels).
    """
    if target is None:
        target = DEFAULT_URL
    if is_memory_url(target):
        return memory_client(target)
    if isinstance(target, str):
        spec = parse_sentinel_url(target)
        if spec is not None:
            return _sentinel_master(spec, timeout, asyncio=False)
        return redis.Redis.from_url(target, **_url_options(timeout))
    return _check_client(target, _SYNC_TYPES, _ASYNC_TYPES,
                         "this is the sync breaker; use distbreaker.aio for an asyncio client")


def async_client(target: Any, timeout: float) -> Any:
    """An asyncio redis-py client from a URL, or the given client (None: localhost).

    The URLs of `sync_client`; clients: ``redis.asyncio.Redis`` and
    ``redis.asyncio.cluster.RedisCluster``.
    """
    if target is None:
        target = DEFAULT_URL
    if is_memory_url(target):
        return memory_client(target, asyncio=True)
    if isinstance(target, str):
        # redis.asyncio's default pool raises MaxConnectionsError (a ConnectionError) at once
        # beyond 100 calls in flight, which would pass for a Redis outage. Queue for one of a
        # few connections instead (opening many at once is slower than sharing few); the
        # queue is local, so its wait is bounded separately from the tight Redis timeouts.
        queue = {"max_connections": ASYNC_MAX_CONNECTIONS,
                 "timeout": max(ASYNC_POOL_WAIT, timeout)}
        spec = parse_sentinel_url(target)
        if spec is not None:
            return _sentinel_master(spec, timeout, asyncio=True, pool_options={
                "connection_pool_class": _AsyncBlockingSentinelPool, **queue})
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            target, **queue, **_url_options(timeout))
        return redis.asyncio.Redis.from_pool(pool)
    return _check_client(target, _ASYNC_TYPES, _SYNC_TYPES,
                         "this is the asyncio breaker; use distbreaker.CircuitBreaker "
                         "for a sync client")


def waiting_client(url: str, timeout: float, read_timeout: float | None) -> Any:
    """A sync client from a URL for blocking commands (BLPOP) of up to `read_timeout` s."""
    if is_memory_url(url):
        return memory_client(url)
    spec = parse_sentinel_url(url)
    if spec is not None:
        return _sentinel_master(spec, timeout, asyncio=False,
                                pool_options={"socket_timeout": read_timeout})
    return redis.Redis.from_url(url, **{**_url_options(timeout), "socket_timeout": read_timeout})


def async_waiting_client(url: str, timeout: float, read_timeout: float) -> Any:
    """The asyncio twin of `waiting_client`."""
    if is_memory_url(url):
        return memory_client(url, asyncio=True)
    spec = parse_sentinel_url(url)
    if spec is not None:
        return _sentinel_master(spec, timeout, asyncio=True,
                                pool_options={"socket_timeout": read_timeout})
    return redis.asyncio.Redis.from_url(
        url, **{**_url_options(timeout), "socket_timeout": read_timeout})


# -- shared clients ---------------------------------------------------------------------
_SharedKey = tuple[str, str, float, "float | None"]


class _Shared:
    """Reference-counted clients by key (one table for sync clients, one per event loop)."""

    __slots__ = ("clients", "counts")

    def __init__(self) -> None:
        self.clients: dict[_SharedKey, Any] = {}
        self.counts: dict[int, tuple[_SharedKey, int]] = {}  # id(client) -> (key, users)

    def take(self, key: _SharedKey, build: Callable[[], Any]) -> Any:
        client = self.clients.get(key)
        if client is None:
            client = self.clients[key] = build()
            self.counts[id(client)] = (key, 0)
        _, users = self.counts[id(client)]
        self.counts[id(client)] = (key, users + 1)
        return client

    def give_back(self, client: Any) -> bool:
        """True when `client` must be closed now: its last user let go (or it was never
        shared, e.g. a ``memory://`` client)."""
        entry = self.counts.get(id(client))
        if entry is None or self.clients.get(entry[0]) is not client:
            return True
        key, users = entry
        if users > 1:
            self.counts[id(client)] = (key, users - 1)
            return False
        del self.counts[id(client)], self.clients[key]
        return True


_shared_lock = threading.Lock()
_sync_shared = _Shared()
_async_shared: weakref.WeakKeyDictionary[_asyncio.AbstractEventLoop, _Shared] = (
    weakref.WeakKeyDictionary())


def _reset_lock_in_child() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()  # the parent's may have been held by another thread


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock_in_child)


def _shareable(target: Any) -> bool:
    return owns_client(target) and not is_memory_url(target)


def shared_sync_client(target: Any, timeout: float, *,
                       read_timeout: float | bool | None = False) -> Any:
    """`sync_client`, except that a URL's client is shared by every caller naming the same
    URL and timeouts; give it back with `release_sync_client`. `read_timeout` (not
    False) asks for a client for blocking commands (`waiting_client`)."""
    if not _shareable(target):
        if read_timeout is not False and isinstance(target, str):
            return waiting_client(target, timeout, read_timeout)  # type: ignore[arg-type]
        return sync_client(target, timeout)
    url = target or DEFAULT_URL
    if read_timeout is False:
        key: _SharedKey = ("sync", url, timeout, None)
        build: Callable[[], Any] = lambda: sync_client(url, timeout)  # noqa: E731
    else:
        key = ("sync-wait", url, timeout, read_timeout)  # type: ignore[assignment]
        build = lambda: waiting_client(url, timeout, read_timeout)  # type: ignore[arg-type]  # noqa: E731
    with _shared_lock:
        return _sync_shared.take(key, build)


def release_sync_client(client: Any) -> None:
    """Let go of a client from `shared_sync_client`; the last user closes it."""
    with _shared_lock:
        close = _sync_shared.give_back(client)
    if close:
        client.close()


def shared_async_client(target: Any, timeout: float, *,
                        read_timeout: float | bool = False) -> Any:
    """The asyncio twin of `shared_sync_client`, shared within the running event loop."""
    if not _shareable(target):
        if read_timeout is not False and isinstance(target, str):
            return async_waiting_client(target, timeout, read_timeout)
        return async_client(target, timeout)
    url = target or DEFAULT_URL
    loop = _asyncio.get_running_loop()
    if read_timeout is False:
        key: _SharedKey = ("async", url, timeout, None)
        build: Callable[[], Any] = lambda: async_client(url, timeout)  # noqa: E731
    else:
        key = ("async-wait", url, timeout, read_timeout)
        build = lambda: async_waiting_client(url, timeout, read_timeout)  # noqa: E731
    with _shared_lock:
        table = _async_shared.get(loop)
        if table is None:
            table = _async_shared[loop] = _Shared()
        return table.take(key, build)


async def release_async_client(client: Any) -> None:
    """Let go of a client from `shared_async_client` (in the loop it was taken in)."""
    with _shared_lock:
        table = _async_shared.get(_asyncio.get_running_loop())
        close = table is None or table.give_back(client)
    if close:
        await client.aclose()


class ProcessClient:
    """A sync component's client: the one given, or the process's shared client of the
    URL (let go by `release`); `LoopClients`' sync twin, so shells generated by
    scripts/unasync.py use either the same way."""

    def __init__(self, target: Any, timeout: float) -> None:
        self._client = shared_sync_client(target, timeout)
        self._owns = owns_client(target)

    def get(self) -> Any:
        return self._client

    def release(self) -> None:
        """Let go of the client, once (it may be shared); a given client is the caller's."""
        if self._owns:
            self._owns = False
            release_sync_client(self._client)


class LoopClients:
    """An asyncio component's client: the one given, or the running loop's shared client
    of the URL (taken on first use in each loop, let go by `release`)."""

    def __init__(self, target: Any, timeout: float) -> None:
        client = async_client(target, timeout)  # validates `target` now
        self.given = None if owns_client(target) else client
        self._target = DEFAULT_URL if target is None else target
        self._timeout = timeout
        self._per_loop: weakref.WeakKeyDictionary[_asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary())

    def get(self) -> Any:
        if self.given is not None:
            return self.given
        loop = _asyncio.get_running_loop()
        client = self._per_loop.get(loop)
        if client is None:
            client = self._per_loop[loop] = shared_async_client(self._target, self._timeout)
        return client

    async def release(self) -> None:
        """Let go of the running loop's client (a given client is the caller's)."""
        if self.given is None:
            client = self._per_loop.pop(_asyncio.get_running_loop(), None)
            if client is not None:
                await release_async_client(client)


def db_of(client: Any) -> int:
    """The database index a client talks to (0 for a cluster or an unknown client).

    A client wrapper that builds its clients later (one per event loop) says so
    with a `database_index()` method."""
    index = getattr(client, "database_index", None)
    if callable(index):
        return int(index())
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if isinstance(kwargs, dict):
        try:
            return int(kwargs.get("db") or 0)
        except (TypeError, ValueError):
            return 0
    return 0
