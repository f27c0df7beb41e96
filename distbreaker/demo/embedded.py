"""A throwaway Redis for demos and tests: a real `redis-server` on a free port.

When `redis-server` is not on PATH, `start_fake()` serves an in-process
fakeredis over TCP instead (Lua included), so the demo still runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def terminate(process: subprocess.Popen[Any] | None, grace: float = 5.0) -> None:
    """SIGTERM a child process, SIGKILL it if it has not exited within `grace` seconds."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace)


def _wait_for_port(port: int, deadline: float, process: subprocess.Popen[Any] | None) -> None:
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")  # RESP: fakeredis rejects inline
                if sock.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"redis on port {port} did not answer in time")


class RedisServer:
    """One `redis-server` process on 127.0.0.1, no persistence; restartable on its port."""

    def __init__(self, port: int | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise FileNotFoundError("redis-server is not on PATH")
        self.port = port or free_port()
        self.extra_args = extra_args
        self.dir = tempfile.mkdtemp(prefix="distbreaker-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [self.binary or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self.dir,
                "--protected-mode", "no", *self.extra_args]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        _wait_for_port(self.port, time.monotonic() + 10, self.process)
        return self

    def kill(self) -> None:
        """SIGKILL the server (a crash, not a shutdown)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(5)
        self.process = None

    def stop(self) -> None:
        terminate(self.process)
        self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class FakeRedisServer:
    """An in-process fakeredis served over TCP (used only when redis-server is absent)."""

    def __init__(self) -> None:
        from fakeredis import TcpFakeServer

        self.port = free_port()
        self._server = TcpFakeServer(("127.0.0.1", self.port), server_type="redis")
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FakeRedisServer:
        self._thread.start()
        _wait_for_port(self.port, time.monotonic() + 5, None)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def embedded_redis(url: str | None = None) -> Iterator[str]:
    """Yield a Redis URL: `url` or $REDIS_URL if set, else a fresh local server."""
    url = url or os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    server: RedisServer | FakeRedisServer
    if shutil.which("redis-server"):
        server = RedisServer().start()
    else:
        server = FakeRedisServer().start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def bench_redis(url: str | None = None) -> Iterator[tuple[str, str]]:
    """The Redis a benchmark measures against and where it came from: `url` or
    $REDIS_URL ("given"), else a fresh real redis-server ("spawned"; never fakeredis,
    whose figures would mean nothing)."""
    url = url or os.environ.get("REDIS_URL")
    if url:
        yield url, "given"
        return
    with RedisServer() as server:
        yield server.url, "spawned"


# -- Redis Cluster and Sentinel, for tests and demos --------------------------------------
CLUSTER_SLOTS = 16384


def _admin(port: int, timeout: float = 2.0) -> Any:
    """A plain client for one node (no cluster routing): for setup commands only."""
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=timeout,
                       socket_connect_timeout=timeout, decode_responses=True)


def _poll(what: str, check: Any, timeout: float, interval: float = 0.05) -> None:
    """Call `check()` until it returns true, or raise naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # not up yet: keep polling
            last = exc
        time.sleep(interval)
    raise RuntimeError(f"{what} did not happen within {timeout:g}s (last error: {last!r})")


def slot_ranges(primaries: int) -> list[tuple[int, int]]:
    """The 16384 slots split into `primaries` contiguous inclusive ranges."""
    bounds = [CLUSTER_SLOTS * i // primaries for i in range(primaries + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(primaries)]


class EmbeddedCluster:
    """A real Redis Cluster of `primaries` `redis-server` processes (no replicas).

    Slots are assigned with CLUSTER ADDSLOTSRANGE and the nodes joined with
    CLUSTER MEET (what ``redis-cli --cluster create`` does, without needing it).
    """

    def __init__(self, primaries: int = 3, node_timeout_ms: int = 2000) -> None:
        if primaries < 1:
            raise ValueError(f"primaries must be >= 1, got {primaries}")
        # An explicit bus port: the default port+10000 may be taken or beyond 65535.
        self.bus_ports = [free_port() for _ in range(primaries)]
        self.nodes = [
            RedisServer(extra_args=("--cluster-enabled", "yes",
                                    "--cluster-config-file", "nodes.conf",
                                    "--cluster-port", str(bus),
                                    "--cluster-node-timeout", str(node_timeout_ms)))
            for bus in self.bus_ports]

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """A URL of one node (RedisCluster.from_url discovers the others)."""
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def start(self, timeout: float = 20.0) -> EmbeddedCluster:
        try:
            for node in self.nodes:
                node.start()
            admins = [_admin(port) for port in self.ports]
            for epoch, (admin, (first, last)) in enumerate(
                    zip(admins, slot_ranges(len(self.nodes)), strict=True), start=1):
                admin.execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
                admin.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            for admin in admins[1:]:
                admin.execute_command("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port,
                                      self.bus_ports[0])
            _poll("cluster convergence", lambda: all(self._ready(a) for a in admins), timeout)
            for admin in admins:
                admin.close()
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self, admin: Any) -> bool:
        info = admin.cluster("info")
        return (info.get("cluster_state") == "ok"
                and int(info.get("cluster_known_nodes", 0)) == len(self.nodes)
                and int(info.get("cluster_slots_ok", 0)) == CLUSTER_SLOTS)

    def client(self, **options: Any) -> Any:
        """A sync `redis.cluster.RedisCluster` for this cluster."""
        from redis.cluster import RedisCluster

        return RedisCluster(host="127.0.0.1", port=self.nodes[0].port, **options)

    def async_client(self, **options: Any) -> Any:
        """An asyncio `redis.asyncio.cluster.RedisCluster` (connects on first use)."""
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster(host="127.0.0.1", port=self.nodes[0].port, **options)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class EmbeddedSentinel:
    """One primary, one replica and one sentinel watching them, all local.

    The sentinel's quorum is 1 and its timeouts are short, so killing the
    primary gets the replica promoted within a few seconds.
    """

    def __init__(self, service: str = "distbreaker", down_after_ms: int = 1000,
                 failover_timeout_ms: int = 3000) -> None:
        self.service = service
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.primary = RedisServer()
        self.replica = RedisServer(extra_args=("--replicaof", "127.0.0.1",
                                               str(self.primary.port)))
        self.sentinel_port = free_port()
        self.dir = tempfile.mkdtemp(prefix="distbreaker-sentinel-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", self.sentinel_port)]

    @property
    def url(self) -> str:
        """A ``redis+sentinel://`` URL distbreaker's `redis=` accepts."""
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.service}"

    def _config(self) -> str:
        svc = self.service
        return "\n".join([
            f"port {self.sentinel_port}", "bind 127.0.0.1", "protected-mode no",
            f"dir {self.dir}",
            f"sentinel monitor {svc} 127.0.0.1 {self.primary.port} 1",
            f"sentinel down-after-milliseconds {svc} {self.down_after_ms}",
            f"sentinel failover-timeout {svc} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {svc} 1", ""])

    def start(self, timeout: float = 20.0) -> EmbeddedSentinel:
        try:
            self.primary.start()
            self.replica.start()
            conf = os.path.join(self.dir, "sentinel.conf")
            with open(conf, "w", encoding="utf-8") as handle:
                handle.write(self._config())
            self.process = subprocess.Popen(
                [self.primary.binary or "redis-server", conf, "--sentinel"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _wait_for_port(self.sentinel_port, time.monotonic() + 10, self.process)
            _poll("replica sync and sentinel discovery", self._ready, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        with contextlib.closing(_admin(self.replica.port)) as replica:
            if replica.info("replication").get("master_link_status") != "up":
                return False
        with contextlib.closing(_admin(self.sentinel_port)) as sentinel:
            replicas = sentinel.sentinel_slaves(self.service)  # parsed: port, is_sdown, ...
        return any(int(r["port"]) == self.replica.port and not r.get("is_sdown")
                   for r in replicas)

    def master_address(self) -> tuple[str, int]:
        """The primary's address as the sentinel reports it now."""
        with contextlib.closing(_admin(self.sentinel_port)) as sentinel:
            host, port = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                                  self.service)
        return str(host), int(port)

    def wait_for_failover(self, timeout: float = 20.0) -> tuple[str, int]:
        """Wait until the replica is the primary (sentinel says so and it accepts writes)."""
        def promoted() -> bool:
            if self.master_address()[1] != self.replica.port:
                return False
            with contextlib.closing(_admin(self.replica.port)) as replica:
                return replica.info("replication").get("role") == "master"
        _poll("sentinel failover", promoted, timeout)
        return self.master_address()

    def stop(self) -> None:
        terminate(self.process)
        self.process = None
        self.replica.stop()
        self.primary.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedSentinel:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
