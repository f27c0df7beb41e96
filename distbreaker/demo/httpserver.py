"""What the demo's simulated upstreams share: a threaded JSON HTTP server and a handle
on one running as a subprocess.

Standard library only. `JsonServer` owns a ``ThreadingHTTPServer`` (one thread per
connection, HTTP/1.1 keep-alive) and dispatches to `handle(method, path, body)`,
which subclasses implement; `ServerProcess` runs ``python -m <module> --port N ...``
and talks to it (``GET /healthz`` until ready, JSON GET/POST, terminate).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .embedded import free_port, terminate

#: A handler's answer: status, JSON body, extra headers.
Answer = tuple[int, dict[str, Any], dict[str, str]]


class JsonServer:
    """The server: `start()` serves in a background thread, `serve_forever()` in this one."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = ThreadingHTTPServer((host, port), self._handler())
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    def handle(self, method: str, path: str, body: bytes) -> Answer:
        """Answer one request (runs in the connection's thread)."""
        raise NotImplementedError

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms
            # delayed-ACK stall per answer on a keep-alive connection

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, payload, headers = owner.handle(method, self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def log_message(self, format: str, *args: Any) -> None:  # quiet by default
                pass

        return Handler

    def start(self) -> Any:
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class ServerProcess:
    """``python -m <module> --port N <args>`` in a subprocess, and JSON calls to it."""

    def __init__(self, module: str, args: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, "--port", str(self.port), *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait_ready(self, seconds: float = 15.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                detail = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"the upstream exited: {detail}")
            try:
                self.get("/healthz")
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the upstream did not start in time")

    def get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + path, timeout=5) as reply:
            return dict(json.loads(reply.read()))

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body or {}).encode()
        request = urllib.request.Request(self.url + path, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as reply:
            return dict(json.loads(reply.read()))

    def stop(self) -> None:
        terminate(self.process)
        if self.process.stderr is not None:
            self.process.stderr.close()


def serve_until_interrupted(upstream: Any) -> int:
    """Serve `upstream` (an object with `serve_forever()` and `server`) until Ctrl-C;
    the exit status of a demo upstream's main()."""
    try:
        upstream.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        upstream.server.server_close()
    return 0
