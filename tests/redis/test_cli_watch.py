"""`distbreaker watch` against a real redis-server: fits the width, worst rows first, a
legend, OPEN-due rows, a real terminal (pty), and an outage it survives and recovers from."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from distbreaker import CircuitBreaker
from distbreaker.cli.app import cli
from distbreaker.demo.embedded import RedisServer
from tests.helpers.cli import outcomes
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
FAST = {"sliding_window_size": 10, "minimum_number_of_calls": 4,
        "failure_rate_threshold": 50, "wait_duration_in_open_state": 30.0,
        "permitted_calls_in_half_open": 2, "key_ttl": 600.0}
LONG = "api.payments-gateway.eu-west-1.internal.example.com:8443"  # 56 characters
ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


def make(name: str, url: object, **overrides: object) -> CircuitBreaker:
    return CircuitBreaker(name, redis=url, **{**FAST, **overrides})




def watch(url: str, *args: str, columns: int = 80) -> Result:
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(
        cli, ["--url", url, "watch", "--interval", "0.05", "--iterations", "1", *args])


def fleet(url: str) -> None:
    outcomes(make("a-closed-ok", url), failed=0, ok=3)
    outcomes(make("b-closed-failing", url, minimum_number_of_calls=10), failed=2, ok=1)
    outcomes(make(LONG, url), failed=4)
    make("d-forced", url).transition_to_forced_open("maintenance", "ops")
    half = make("e-half", url, wait_duration_in_open_state=0.05)
    outcomes(half, failed=4)
    time.sleep(0.06)
    half.acquire()


def table_rows(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("NAME"))
    end = next(i for i, line in enumerate(lines) if line.startswith(("BUDGET", "hidden")))
    return lines[start + 1:end]


def test_watch_fits_80_columns_with_an_ellipsis_and_sorts_by_severity(redis_url: str) -> None:
    fleet(redis_url)
    result = watch(redis_url)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    rows = table_rows(result.stdout)
    assert rows[0].split()[0] == "d-forced"
    assert rows[1].startswith(LONG[:10]) and "…" in rows[1] and LONG not in result.stdout
    assert rows[2].startswith("e-half")
    # then CLOSED by failure rate; both below their minimum (-), so by name
    assert [r.split()[0] for r in rows[3:]] == ["a-closed-ok", "b-closed-failing"]
    assert "BUDGET +requests -retries =retries left" in result.stdout
    assert "now" not in " ".join(rows)
    assert re.search(r"server time \d\d:\d\d:\d\d \w+", result.stdout)


def test_watch_at_60_columns_drops_columns_and_never_cuts_a_number(redis_url: str) -> None:
    """A narrow terminal hides whole columns (named under the table), least useful
    first; the cells it shows are whole (issue 28: `10…` was shown for 100 %)."""
    from distbreaker import Bulkhead, RetryBudget

    fleet(redis_url)
    outcomes(make("f-all-failed", redis_url), failed=4)        # 100 %
    bulkhead = Bulkhead("f-all-failed", redis=redis_url, max_concurrent_calls=100,
                        redis_timeout=5)
    permit = bulkhead.acquire()
    budget = RetryBudget("f-all-failed", redis=redis_url, redis_timeout=5)
    budget.deposit()
    budget.flush()
    wide = watch(redis_url, columns=200).stdout
    assert "BULK" in wide and "BUDGET" in wide.splitlines()[2]
    result = watch(redis_url, columns=60)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= 60 for line in lines), lines
    header = next(line for line in lines if line.startswith("NAME")).split()
    assert header[:3] == ["NAME", "STATE", "FOR"] and "FAIL" in header
    assert "BUDGET" not in header and "BULK" not in header
    assert "hidden at 60 columns: BULK, BUDGET" in result.stdout
    row = next(r for r in table_rows(result.stdout) if r.startswith("f-all-failed"))
    assert "100%" in row
    for cells in (r.split()[1:] for r in table_rows(result.stdout)):  # all but NAME
        assert not any(c.endswith("…") for c in cells), cells
    bulkhead.release(permit)
    for component in (bulkhead, budget):
        component.close()


def test_closed_rows_sort_by_failure_rate(redis_url: str) -> None:
    outcomes(make("low", redis_url, minimum_number_of_calls=2, failure_rate_threshold=90),
             failed=1, ok=3)
    outcomes(make("high", redis_url, minimum_number_of_calls=2, failure_rate_threshold=90),
             failed=3, ok=1)
    outcomes(make("none", redis_url), ok=1, failed=0)
    rows = table_rows(watch(redis_url, columns=120).stdout)
    assert [r.split()[0] for r in rows] == ["high", "low", "none"]


def test_an_open_whose_wait_ended_shows_as_due(redis_url: str, name: str) -> None:
    outcomes(make(name, redis_url, wait_duration_in_open_state=0.05), failed=4)
    time.sleep(0.1)
    row = next(r for r in table_rows(watch(redis_url, columns=120).stdout)
               if r.startswith(name))
    assert "OPEN (due)" in row and "next call" in row


def test_watch_in_a_real_terminal_redraws_in_place(redis_url: str) -> None:
    fleet(redis_url)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen([sys.executable, "-m", "distbreaker", "--url", redis_url, "watch",
                             "--interval", "0.2", "--iterations", "3"], cwd=ROOT, env=env,
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    proc.wait(10)
    os.close(master)
    assert proc.returncode == 0, out
    screen = out.decode("utf-8", "replace")
    assert "\x1b[?1049h" in screen  # the alternate screen: redrawn in place, not scrolled
    assert "\x1b[31m" in screen or "\x1b[1;31m" in screen or "38;5;" in screen  # colour
    plain = ANSI.sub("", screen)
    assert "…" in plain and LONG not in plain
    assert plain.count("distbreaker watch") == 3


def test_watch_survives_redis_going_away_and_comes_back(name: str) -> None:
    """Each step waits for what `watch` printed (a loaded machine may start the CLI
    slowly): a table with the breaker, then the outage banner, then the new breaker
    once Redis is back; the run ends after its iterations, exit 0."""
    server = RedisServer().start()
    frames: list[str] = []
    try:
        outcomes(make(name, server.url), failed=4)
        iterations = 150
        proc = subprocess.Popen([sys.executable, "-m", "distbreaker", "--url", server.url,
                                 "watch", "--interval", "0.2", "--iterations", str(iterations)],
                                cwd=ROOT, env={**os.environ, "COLUMNS": "160",
                                               "PYTHONUNBUFFERED": "1"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        reader = threading.Thread(target=read_frames, args=(proc.stdout, frames), daemon=True)
        reader.start()

        def printed(text: str) -> bool:
            return any(text in frame for frame in list(frames))

        wait_until(lambda: printed(name), timeout=60, what="watch shows the breaker")
        server.kill()
        wait_until(lambda: printed("Redis unreachable since"), timeout=60,
                   what="watch shows the outage")
        server.start()  # same port, empty: no persistence
        outcomes(make(name + "-after", server.url), failed=4)
        wait_until(lambda: printed(name + "-after"), timeout=60,
                   what="watch shows the breaker made after the outage")
        proc.wait(timeout=120)
        reader.join(10)
        err = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    assert proc.returncode == 0, err
    down = [f for f in frames if "Redis unreachable since" in f]
    assert re.search(r"Redis unreachable since \d\d:\d\d:\d\d \w+ \(\d+ attempts?; cannot "
                     r"reach Redis at ", down[-1])
    assert name in down[0]  # the last table read stays on screen
    assert "Redis unreachable" not in frames[-1] and name + "-after" in frames[-1]
    assert len(frames) == iterations


def read_frames(stream: Any, frames: list[str]) -> None:
    """Collect `watch`'s frames (separated by a blank line) as they are printed."""
    lines: list[str] = []
    for line in stream:
        if line.strip():
            lines.append(line.rstrip("\n"))
        elif lines:
            frames.append("\n".join(lines))
            lines = []
    if lines:
        frames.append("\n".join(lines))
