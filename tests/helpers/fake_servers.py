"""TCP servers that are not Redis, for the wrong-target tests: a port where another
service answers (HTTP), or one that speaks the Redis protocol with the same canned reply
to every command (a proxy or mock; a server stuck LOADING)."""

from __future__ import annotations

import socket
import threading
from typing import Any


class CannedServer:
    """Answers every read on every connection with `reply` (bytes), on 127.0.0.1."""

    def __init__(self, reply: bytes, close_after: bool = False) -> None:
        self.reply = reply
        self.close_after = close_after
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = int(self._sock.getsockname()[1])
        self._stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        """One reply per command (redis-py pipelines its handshake's commands)."""
        buffer = b""
        with conn:
            try:
                while chunk := conn.recv(65536):
                    buffer += chunk
                    commands, buffer = _commands(buffer)
                    if self.close_after:  # not Redis at all: answer once, hang up
                        conn.sendall(self.reply)
                        return
                    conn.sendall(self.reply * commands)
            except OSError:
                return

    def stop(self) -> None:
        self._stopped.set()
        self._sock.close()

    def __enter__(self) -> CannedServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _commands(buffer: bytes) -> tuple[int, bytes]:
    """How many whole RESP commands (arrays of bulk strings) `buffer` starts with, and the
    rest."""
    count = 0
    while True:
        end = _command_end(buffer)
        if end is None:
            return count, buffer
        count, buffer = count + 1, buffer[end:]


def _command_end(buffer: bytes) -> int | None:
    if not buffer.startswith(b"*") or b"\r\n" not in buffer:
        return None
    line_end = buffer.index(b"\r\n")
    at = line_end + 2
    for _ in range(int(buffer[1:line_end])):
        if b"\r\n" not in buffer[at:]:
            return None
        header_end = buffer.index(b"\r\n", at)
        at = header_end + 2 + int(buffer[at + 1:header_end]) + 2
        if at > len(buffer):
            return None
    return at


#: What an HTTP server answers a Redis command with (then it closes the connection).
HTTP_REPLY = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
