"""A local flaky HTTP upstream for tests: behaviour switchable per path, hits counted.

Behaviours: ``ok()``, ``status(code, retry_after=None)`` (500/503/429/400...),
``slow(delay)`` (answers 200 after `delay` seconds), ``reset()`` (closes the
connection without an answer, RST), ``trickle(delay)`` (200 headers and the first
body byte at once, the rest after `delay`: for streaming tests).
``server.set(path, behaviour)`` sets a path's behaviour (``path=None``: the
default for every path without its own); ``server.script(path, [b1, b2], then=b)``
serves b1 to the first hit, b2 to the second, then b. Every hit is counted and
time-stamped (monotonic) on arrival, before the behaviour runs; `answered[path]`
counts the answers written in full.
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.helpers.waiting import wait_until


@dataclasses.dataclass(frozen=True)
class Behaviour:
    kind: str
    code: int = 200
    retry_after: str | None = None
    delay: float = 0.0


def ok() -> Behaviour:
    return Behaviour("status", 200)


def status(code: int, retry_after: float | str | None = None) -> Behaviour:
    return Behaviour("status", code, None if retry_after is None else str(retry_after))


def slow(delay: float) -> Behaviour:
    return Behaviour("status", 200, delay=delay)


def reset() -> Behaviour:
    return Behaviour("reset")


def trickle(delay: float) -> Behaviour:
    return Behaviour("trickle", 200, delay=delay)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        behaviour = self.server.owner._hit(self.command, self.path.split("?")[0])
        if behaviour.delay and behaviour.kind == "status":
            time.sleep(behaviour.delay)
        if behaviour.kind == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        body = f"{behaviour.code} {self.path}\n".encode()
        if behaviour.kind == "trickle":
            body = b"x" * 1000
        try:
            self.send_response(behaviour.code)
            if behaviour.retry_after is not None:
                self.send_header("Retry-After", behaviour.retry_after)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if behaviour.kind == "trickle":
                self.wfile.write(body[:1])
                self.wfile.flush()
                time.sleep(behaviour.delay)
                body = body[1:]
            self.wfile.write(body)
            self.server.owner._done(self.path.split("?")[0])
        except OSError:
            pass  # the client gave up (timeout): nothing to answer

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FlakyServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # resets and client timeouts are the point here


class FlakyServer:
    """A threading HTTP server on 127.0.0.1 (free port); use as a context manager."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._server = _Server((host, 0), _Handler)
        self._server.owner = self
        self.port: int = self._server.server_address[1]
        self.host = host
        self._lock = threading.Lock()
        self._default = ok()
        self._paths: dict[str, Behaviour] = {}
        self._scripts: dict[str, list[Behaviour]] = {}
        self.hits: dict[str, list[float]] = defaultdict(list)
        self.answered: dict[str, int] = defaultdict(int)
        self.methods: list[str] = []
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FlakyServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FlakyServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def set(self, path: str | None, behaviour: Behaviour) -> None:
        with self._lock:
            if path is None:
                self._default = behaviour
            else:
                self._paths[path] = behaviour
                self._scripts.pop(path, None)

    def script(self, path: str, steps: list[Behaviour], then: Behaviour) -> None:
        with self._lock:
            self._paths[path] = then
            self._scripts[path] = list(steps)

    def count(self, path: str | None = None) -> int:
        with self._lock:
            if path is None:
                return sum(len(times) for times in self.hits.values())
            return len(self.hits.get(path, ()))

    def wait_for(self, hits: int, timeout: float = 20.0) -> int:
        """The total hit count once it reaches `hits` (WaitTimeout after `timeout`): a
        request a client gave up on may be handled a moment later."""
        wait_until(lambda: self.count() >= hits, timeout=timeout,
                   what=f"{hits} requests reach the server", describe=self.count)
        return self.count()

    def _done(self, path: str) -> None:
        with self._lock:
            self.answered[path] += 1

    def _hit(self, method: str, path: str) -> Behaviour:
        with self._lock:
            self.hits[path].append(time.monotonic())
            self.methods.append(method)
            steps = self._scripts.get(path)
            if steps:
                return steps.pop(0)
            return self._paths.get(path, self._default)
