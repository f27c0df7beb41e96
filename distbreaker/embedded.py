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
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
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
