"""A small TCP proxy in front of a redis-server that can black-hole or delay traffic.

`black_hole()` makes Redis look like a host whose packets are dropped (no RST, no
FIN): connections stay open, requests get no answer, new connections are accepted
by the kernel but never answered; what was held is delivered after `heal()` (TCP
retransmits it). `delay(seconds)` adds latency to every chunk in both directions.
Unlike SIGSTOP of the server, this can target one client fleet and leaves the
server healthy for the test's own checks.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType


class TcpProxy:
    """Forwards 127.0.0.1:<port> to `upstream` (host, port); `url` is its redis URL."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(512)
        self.port: int = self._listener.getsockname()[1]
        self._open = threading.Event()   # set: traffic flows
        self._open.set()
        self._delay = 0.0
        self._stopped = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    # -- faults ------------------------------------------------------------------------
    def black_hole(self) -> None:
        """Drop (hold) everything from now on, in both directions, without closing."""
        self._open.clear()

    def heal(self) -> None:
        """Traffic flows again (held bytes are delivered, as TCP retransmits them)."""
        self._open.set()

    def delay(self, seconds: float) -> None:
        """Add `seconds` of latency to each chunk (0: none)."""
        self._delay = seconds

    # -- plumbing ----------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._open.wait()  # a black-holed SYN: the handshake's reply never comes
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets += [client, upstream]
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if self._delay:
                    time.sleep(self._delay)
                self._open.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self._stopped = True
        self._open.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
