"""Every Redis-side refusal or misdirection is an outage, never an escape (issue 23): a
database out of range, a port that is not Redis, a Sentinel URL at a plain server, a
read-only replica, ACL refusals (NOPERM, and "can't run this command" inside a script),
OOM, LOADING, MASTERDOWN, BUSY. Under the default fail_open every component runs the
protected call; the cause and its fix are logged once at ERROR; `check()` and
`Registry(strict=True)` raise it at start-up; `distbreaker doctor` exits 1 on it.

Against a real redis-server, made to refuse: `replicaof` a dead port for the replica
(and, with replica-serve-stale-data no, MASTERDOWN), maxmemory 1 for OOM, ACL users, a
never-ending script for BUSY. Only what a real server cannot be held in is faked, with a
TCP server (tests/helpers/fake_servers.py): an HTTP port, a mock speaking the Redis
protocol with a canned reply, a server stuck LOADING, a port without scripting.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest
import redis
from click.testing import CliRunner

import distbreaker
import distbreaker.aio
from distbreaker._runtime import outages
from distbreaker._runtime.outages import Cause
from distbreaker.cli import cli
from distbreaker.demo.embedded import RedisServer, free_port
from distbreaker.errors import CheckFailed
from tests.helpers.fake_servers import HTTP_REPLY, CannedServer
from tests.helpers.flavours import Flavour
from tests.helpers.waiting import wait_until

#: Generous: none of these tests is about timeouts (the refusals answer at once).
TIMEOUT = 5.0


class Target(NamedTuple):
    url: str
    cause: Cause


@pytest.fixture(autouse=True)
def fresh_log() -> Iterator[None]:
    """Each cause is logged once per process: forget what earlier tests logged."""
    outages._logged.clear()
    yield
    outages._logged.clear()


@pytest.fixture
def server() -> Iterator[RedisServer]:
    started = RedisServer().start()
    yield started
    started.stop()


def _user(admin: redis.Redis, server: RedisServer, name: str, *rules: str) -> str:
    admin.execute_command("ACL", "SETUSER", name, "on", ">pw", "~*", "&*", *rules)
    return f"redis://{name}:pw@127.0.0.1:{server.port}/0"


def _busy(admin: redis.Redis, server: RedisServer) -> Callable[[], None]:
    """A script that never ends: every other command is answered BUSY until SCRIPT KILL."""
    admin.config_set("busy-reply-threshold", "20")
    looping = redis.Redis(port=server.port)
    thread = threading.Thread(target=lambda: _ignore(looping.eval, "while true do end", 0),
                              daemon=True)
    thread.start()

    def refused() -> bool:
        try:
            redis.Redis(port=server.port).ping()
        except redis.ResponseError as error:
            return str(error).startswith("BUSY")
        return False
    wait_until(refused, timeout=10)

    def undo() -> None:
        redis.Redis(port=server.port).script_kill()
        thread.join(10)
    return undo


def _ignore(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except redis.RedisError:
        pass


CASES = ["db-out-of-range", "http-port", "resp-mock", "loading", "no-scripting",
         "not-sentinel", "read-only-replica", "acl-noperm", "acl-inside-script", "oom",
         "masterdown", "busy"]


@pytest.fixture(params=CASES)
def target(request: pytest.FixtureRequest, server: RedisServer) -> Iterator[Target]:
    admin = redis.Redis(port=server.port)
    undo: Callable[[], None] = lambda: None  # noqa: E731
    case = request.param
    if case == "db-out-of-range":
        made = Target(f"redis://127.0.0.1:{server.port}/99", outages.DB_RANGE)
    elif case in ("http-port", "resp-mock", "loading", "no-scripting"):
        fake = {"http-port": CannedServer(HTTP_REPLY, close_after=True),
                "resp-mock": CannedServer(b"+OK\r\n"),
                "loading": CannedServer(b"-LOADING Redis is loading the dataset in memory\r\n"),
                "no-scripting": CannedServer(b"-ERR unknown command 'evalsha', with args "
                                             b"beginning with: \r\n")}[case]
        undo = fake.stop
        made = Target(fake.url, {"loading": outages.LOADING,
                                 "no-scripting": outages.NO_SCRIPTS}.get(case, outages.NOT_REDIS))
    elif case == "not-sentinel":
        made = Target(f"redis+sentinel://127.0.0.1:{server.port}/mymaster/0",
                      outages.NOT_SENTINEL)
    elif case in ("read-only-replica", "masterdown"):
        if case == "masterdown":
            admin.config_set("replica-serve-stale-data", "no")
        admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        made = Target(server.url, outages.READ_ONLY if case == "read-only-replica"
                      else outages.MASTERDOWN)
    elif case == "acl-noperm":
        made = Target(_user(admin, server, "noscripts", "+@all", "-@scripting"), outages.ACL)
    elif case == "acl-inside-script":
        made = Target(_user(admin, server, "notime", "+@all", "-time"), outages.ACL)
    elif case == "oom":
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
        made = Target(server.url, outages.OOM)
    else:
        undo = _busy(admin, server)
        made = Target(server.url, outages.BUSY)
    yield made
    undo()
    admin.close()


def fix_of(target: Target) -> str:
    """What the fix says: an ACL refusal's is the exact ACL SETUSER line."""
    return "ACL SETUSER" if target.cause is outages.ACL else target.cause.fix


def every_component(flavour: Flavour, url: str, tag: str) -> int:
    """One protected call through the breaker, the bulkhead and the policy, and the
    budget's deposit and withdrawal: none may raise. The calls that ran."""
    ran = []

    def work() -> str:
        ran.append(1)
        return "done"

    options = {"redis": url, "redis_timeout": TIMEOUT}
    assert flavour.breaker(f"cb-{tag}", **options).call(work) == "done"
    assert flavour.bulkhead(f"bh-{tag}", max_concurrent_calls=2, **options).call(work) == "done"
    budget = flavour.budget(f"rb-{tag}", **options)
    budget.deposit()
    assert isinstance(budget.try_withdraw(), bool)
    assert flavour.policy(f"p-{tag}", bulkhead={"max_concurrent_calls": 2},
                          **options).call(work) == "done"
    return len(ran)


def test_every_component_fails_open_and_names_the_cause_once(
        flavour: Flavour, target: Target, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="distbreaker")
    assert every_component(flavour, target.url, "a") == 3
    assert every_component(flavour, target.url, "b") == 3  # new components, same process
    named = [r for r in caplog.records
             if r.levelno == logging.ERROR and target.cause.what in r.getMessage()]
    assert len(named) == 1, [r.getMessage() for r in caplog.records]
    assert target.cause.fix in named[0].getMessage()


def test_check_raises_the_cause_and_the_fix(flavour: Flavour, target: Target) -> None:
    options = {"redis": target.url, "redis_timeout": TIMEOUT}
    for component in (flavour.breaker("cb", **options),
                      flavour.bulkhead("bh", max_concurrent_calls=2, **options),
                      flavour.budget("rb", **options), flavour.policy("p", **options)):
        with pytest.raises(CheckFailed) as caught:
            component.check()
        assert caught.value.cause is target.cause, caught.value
        assert fix_of(target) in str(caught.value)
        assert isinstance(caught.value, distbreaker.RedisUnavailable)


def test_a_strict_registry_fails_at_start_up(target: Target) -> None:
    spec = {"breakers": {"instances": {"payments": {}}}}
    with pytest.raises(CheckFailed) as caught:
        distbreaker.Registry.from_dict(spec, redis=target.url, strict=True)
    assert caught.value.cause is target.cause
    lenient = distbreaker.Registry.from_dict(spec, redis=target.url)  # builds; calls fail open
    assert lenient.breaker("payments").call(lambda: "ran") == "ran"
    lenient.close()


def test_doctor_exits_1_naming_the_fix(target: Target) -> None:
    result = CliRunner().invoke(cli, ["--url", target.url, "doctor"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert fix_of(target) in result.output, result.output


def test_a_healthy_redis_passes_every_check(flavour: Flavour, server: RedisServer) -> None:
    options = {"redis": server.url, "redis_timeout": TIMEOUT}
    for component in (flavour.breaker("cb", **options),
                      flavour.bulkhead("bh", max_concurrent_calls=2, **options),
                      flavour.budget("rb", **options), flavour.policy("p", **options)):
        component.check()
    admin = redis.Redis(port=server.port)
    assert admin.keys("*") == []  # the check wrote nothing
    admin.close()


def test_the_asyncio_registry_checks_when_awaited(server: RedisServer) -> None:
    spec = {"breakers": {"instances": {"payments": {}}}}
    with pytest.raises(ValueError, match=r"await registry\.check"):
        distbreaker.aio.Registry.from_dict(spec, redis=server.url, strict=True)

    async def start_up() -> None:
        registry = distbreaker.aio.Registry.from_dict(
            spec, redis=f"redis://127.0.0.1:{server.port}/99")
        try:
            with pytest.raises(CheckFailed) as caught:
                await registry.check()
            assert caught.value.cause is outages.DB_RANGE
        finally:
            await registry.aclose()
    asyncio.run(start_up())


WORKER = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
import distbreaker
url = sys.argv[1]
breaker = distbreaker.CircuitBreaker("fleet", redis=url, redis_timeout=5.0)
policy = distbreaker.Policy("fleet-p", redis=url, redis_timeout=5.0,
                            bulkhead={"max_concurrent_calls": 4})
ran = sum(breaker.call(lambda: 1) + policy.call(lambda: 1) for _ in range(20))
print(ran)
"""


def test_worker_processes_on_a_replica_run_every_call_and_log_the_cause_once(
        server: RedisServer) -> None:
    """Real processes, as a fleet would run: each runs all its calls and logs the cause
    once (not once per call or per component)."""
    admin = redis.Redis(port=server.port)
    admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, server.url],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(3)]
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        assert out.strip() == "40"
        errors = [line for line in err.splitlines() if line.startswith("ERROR")]
        assert len(errors) == 1 and outages.READ_ONLY.fix in errors[0], err
    assert admin.dbsize() == 0  # nothing was written: the fleet shared nothing, and knew it
    admin.close()
