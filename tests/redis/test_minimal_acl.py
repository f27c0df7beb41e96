"""The documented minimal ACL works (issue 23): the `ACL SETUSER` line of
docs/OPERATIONS.md "The minimal ACL", read from the file, creates the user every
component then runs under, sharing the fleet state (no fallback, no warning); `doctor`
as that user passes, skipping what the user may not run; `doctor --user NAME` from an
admin connection prints the exact line that fixes a user lacking commands."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from distbreaker import BulkheadFull, CallNotPermitted, State
from distbreaker._runtime.preflight import needed_commands
from distbreaker.cli import cli
from distbreaker.demo.embedded import RedisServer
from tests.helpers.flavours import Flavour

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"
#: What a Python worker runs (a GaneshaBreaker has its own keys and line).
WORKER_SCRIPTS = ("breaker", "bulkhead", "budget", "finish")


def documented_line() -> list[str]:
    """The first line of the first code block under "## The minimal ACL", as words."""
    section = OPERATIONS.read_text(encoding="utf-8").split("## The minimal ACL", 1)[1]
    line = section.split("```", 2)[1].strip().splitlines()[0]
    assert line.startswith("ACL SETUSER worker "), line
    return line.split()


@pytest.fixture
def server() -> Iterator[RedisServer]:
    started = RedisServer().start()
    yield started
    started.stop()


@pytest.fixture
def worker_url(server: RedisServer) -> Iterator[str]:
    admin = redis.Redis(port=server.port)
    admin.execute_command(*documented_line())
    password = next(w[1:] for w in documented_line() if w.startswith(">"))
    yield f"redis://worker:{password}@127.0.0.1:{server.port}/0"
    admin.close()


def test_the_line_grants_every_command_the_scripts_run() -> None:
    granted = {w[1:] for w in documented_line() if w.startswith("+")}
    needed = {c.lower() for c in needed_commands(WORKER_SCRIPTS)}
    assert needed <= granted, f"docs/OPERATIONS.md lacks {sorted(needed - granted)}"
    assert {"fcall", "function|load"} <= granted


def test_every_component_runs_under_the_documented_acl(
        flavour: Flavour, worker_url: str, server: RedisServer, name: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="distbreaker")
    options = {"redis": worker_url, "redis_timeout": 5.0}
    fast = {"sliding_window_size": 4, "minimum_number_of_calls": 4,
            "wait_duration_in_open_state": 60}
    breaker = flavour.breaker(name, **fast, **options)
    bulkhead = flavour.bulkhead(name, max_concurrent_calls=1, max_wait_duration=0, **options)
    budget = flavour.budget(name, **options)
    policy = flavour.policy(f"{name}-p", bulkhead={"max_concurrent_calls": 2},
                            retry={"max_attempts": 2, "base": 0.001, "cap": 0.001},
                            sleep=flavour.no_sleep, **options)
    for component in (breaker, bulkhead, budget, policy):
        component.check()

    def boom() -> None:
        raise ConnectionError("dependency down")

    for _ in range(4):
        with pytest.raises(ConnectionError):
            breaker.call(boom)
    with pytest.raises(CallNotPermitted):
        breaker.call(lambda: "never runs")
    admin_view = flavour.breaker(name, redis=server.url, redis_timeout=5.0, **fast)
    assert admin_view.state == State.OPEN  # shared in Redis, not a local fallback

    permit = bulkhead.acquire()
    with pytest.raises(BulkheadFull):  # the one fleet-wide permit is held
        flavour.bulkhead(name, max_concurrent_calls=1, max_wait_duration=0,
                         redis=server.url, redis_timeout=5.0).acquire()
    bulkhead.release(permit)

    for _ in range(20):
        budget.deposit()
    assert budget.try_withdraw() is True
    assert policy.call(lambda: "ran") == "ran"
    complaints = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert complaints == []


def doctor(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--url", url, "doctor", *args])
    return result.exit_code, result.output


def test_doctor_as_the_documented_worker_passes_and_says_what_it_skipped(
        worker_url: str) -> None:
    code, out = doctor(worker_url)
    assert code == 0, out
    assert "ok    workers: a worker's scripts may run here" in out
    assert "skip  role: this user may not run ROLE" in out
    assert "skip  acl: this user may not run ACL DRYRUN" in out
    assert "skip  clock: this user may not run TIME" not in out  # the line grants TIME
    assert "ok    latency" in out


def test_doctor_user_from_an_admin_passes_the_documented_worker(
        worker_url: str, server: RedisServer) -> None:
    """ACL DRYRUN of every command as `worker`: only the operator tools' and Ganesha's
    own commands are missing, and those are warnings with their own fix lines."""
    code, out = doctor(server.url, "--user", "worker")
    assert code == 0, out
    assert "ok    acl: ACL user 'worker' may run all" in out
    assert "acl-fix" not in out
    assert "warn  acl-operator: " in out and "; fix: ACL SETUSER worker +get +scan" in out
    assert "warn  acl-ganesha: " in out and "fix: ACL SETUSER worker ~ganesha_* +get" in out


def test_doctor_user_prints_the_line_that_fixes_a_user(server: RedisServer) -> None:
    """The line of an older OPERATIONS.md (no commands the scripts run inside Redis)."""
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "old", "on", ">pw", "~distbreaker:v2:*",
                          "&distbreaker:v2:events", "+fcall", "+function|load", "+evalsha",
                          "+eval", "+blpop", "+ping", "+subscribe")
    code, out = doctor(server.url, "--user", "old")
    assert code == 1, out
    fix = next(line.split("acl-fix: ", 1)[1] for line in out.splitlines()
               if line.startswith("FAIL  acl-fix: "))
    assert fix.startswith("ACL SETUSER old ") and "+time" in fix and "+hset" in fix
    admin.execute_command(*fix.split())
    code, out = doctor(server.url, "--user", "old")
    assert code == 0, out
    assert "ok    acl: ACL user 'old' may run all" in out

    code, out = doctor(server.url, "--user", "nobody")
    assert code == 1 and "cannot check ACL user 'nobody'" in out
    admin.close()
