"""``scripts/bench.py --redis-cost`` and ``--fleet-ceiling``: what protected calls cost Redis.

``--redis-cost`` counts the instructions ``redis-server`` executes per protected
call, with valgrind's callgrind (``apt-get install valgrind``; installed on the
fly when missing and running as root). Instruction counts do not depend on
machine load, so they can be compared across runs and machines, unlike
``INFO commandstats`` microseconds.

How one call is isolated. The server runs under ``valgrind --tool=callgrind
--collect-atstart=no --toggle-collect=readQueryFromClient
--toggle-collect=writeToClient``: instructions are collected only inside the
read handler of a client connection (reading the socket, parsing the request,
``processCommand``: lookup, ACL, ``call()``, the command or script itself and
building its reply) and inside the function that writes the reply back. That
is everything one client command costs the server, and nothing else: not
``serverCron``, not the event loop's idle wake-ups and housekeeping
(``beforeSleep``, ``epoll``), whose cost depends on time, not on calls.
``--toggle-collect=call`` would be wrong: a script's ``redis.call`` runs
``call()`` again, and callgrind's toggle flips at every entry, so the commands
inside a script would go uncounted. ``processCommand`` alone would leave out
parsing the arguments and writing the reply, a large share of a script call.
Around each measured batch the bench process zeroes the counters
(``callgrind_control -z``), makes N calls through distbreaker's public API
(or pybreaker's, or plain redis-py), then dumps (``callgrind_control -d``; it
returns once the dump is written); setup, warm-up and re-tripping happen
outside. Per call = the dump's total Ir / N. "in script" is the inclusive cost
of ``luaCallFunction``, EVALSHA and FCALL alike: the KEYS/ARGV tables, the
script body and the commands it runs, the conversion of its reply, Lua's
periodic GC step; the rest of a script call is reading and parsing the request
(one string object per argument), finding the script, checking its keys and
writing the reply. Counts are for the server binary measured
(``--server-binary``; default ``redis-server`` on PATH). Kernel time (the
``read``/``write`` system calls) is not an instruction of the process and is
not counted: the fleet ceiling includes it.

Determinism: each scenario is measured in ``--cost-batches`` (default 2)
separate batches of ``--calls`` (default 200) calls, interleaved; the table gives
the mean, the cheapest and the dearest batch (JSON: min, median and max too) and
"spread", (max - min) / mean. Before each batch a full Lua GC runs (uncounted) in
both of Redis's Lua VMs: EVAL's (through EVAL) and the Functions VM that FCALL runs
in (through FCALL of a one-line library of the bench's own: a GC through EVAL
does not touch the Functions VM), so the GC step Redis takes every 50 script calls
collects that batch's garbage, not the previous scenario's. Batches of one run
agree within about 1 % (less where a batch makes few script calls: batched
flushes); separate runs differ by up to ~4 % (exact CLOSED 86.0-89.7k over 12
runs of an earlier version): the server draws a random hash seed at start-up,
which changes the bucket chains its command table, keyspace and Lua string table
walk. Compare figures of one run. callgrind counts a ``rep movsb`` copy (glibc's
memcpy of large buffers) as one instruction per byte, so calls that copy tens of
kilobytes (a TIME-3600 window cleared whole: 72 KB, twice) count more than their
CPU time would say.

``--fleet-ceiling`` (no valgrind): P client processes (``--processes``,
default 4) call one plain ``redis-server`` for ``--seconds`` per scenario,
interleaved in short slices; the server's CPU is the ``used_cpu_user +
used_cpu_sys`` delta of ``INFO cpu`` (kernel time included) and the ceiling is
calls / server CPU seconds: the protected calls/s one Redis core sustains for
the whole fleet. Requests per call (``INFO commandstats``) show every call
reached Redis (none answered by a local fallback). The server is not
saturated when the clients share its cores (it reports its CPU share): each
request then pays a wake-up and its own system calls, which a saturated server
shares among clients, so cheap commands' ceilings (PING, pybreaker) are
understated more than a script call's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import redis

import distbreaker
from distbreaker import (
    AdaptiveLimit,
    Bulkhead,
    CallNotPermitted,
    CircuitBreaker,
    Policy,
    Pool,
    RateLimiter,
    RetryBudget,
    State,
)
from distbreaker._runtime.keys import DEFAULT_PREFIX
from distbreaker.demo.embedded import free_port, terminate

#: Socket timeout of every bench client: a server under callgrind is ~50x slower,
#: and a timed-out call would be answered by distbreaker's local fallback instead.
SLOW_SERVER_TIMEOUT = 60.0
TOGGLES = ("readQueryFromClient", "writeToClient")
SCRIPT_FUNCTION = "luaCallFunction"
DEFAULT_CALLS = 200
WARM_UP_CALLS = 120  # more than the default count window: the ring is full and reused
HALF_OPEN_PROBES = 10_000  # the largest quota the config allows: the breaker stays HALF_OPEN
MAX_CALLS = 5_000
#: Outcomes per flush in the batched scenarios: a process making 1k calls/s flushes about
#: 10 at the default 10 ms flush interval; 100 fills the default count window.
BATCH_SIZES = (10, 100)


# -- the client side: round trips and the wire ---------------------------------------

class CountingConnection(redis.Connection):
    """Counts requests (a pipeline is one) and commands of every thread, and keeps the
    last script call sent, so the empty-script scenario can carry the same arguments."""

    round_trips = 0
    commands: Counter[str] = Counter()
    last_script: tuple[Any, ...] | None = None

    @classmethod
    def reset(cls) -> None:
        cls.round_trips, cls.commands = 0, Counter()

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        name = _name(args[0])
        CountingConnection.commands[name] += 1
        if name in ("evalsha", "eval", "fcall"):
            CountingConnection.last_script = args
        super().send_command(*args, **kwargs)

    def pack_commands(self, commands: Any) -> Any:  # a pipeline's commands
        for command in commands:
            CountingConnection.commands[_name(command[0])] += 1
        return super().pack_commands(commands)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.round_trips += 1
        super().send_packed_command(command, check_health)


def _name(command: Any) -> str:
    text = command.decode() if isinstance(command, bytes) else str(command)
    return text.lower().split()[0]


def counting_client(url: str) -> redis.Redis:
    """A client whose requests are counted, patient enough for a server under callgrind."""
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection,
                                         socket_timeout=SLOW_SERVER_TIMEOUT,
                                         socket_connect_timeout=SLOW_SERVER_TIMEOUT)
    return redis.Redis(connection_pool=pool)


# -- scenarios -----------------------------------------------------------------------

@dataclasses.dataclass
class CostScenario:
    """One measured path: `call` is one protected call (or one PING).

    `prepare` runs before every batch, outside the measurement (HALF_OPEN re-trips
    there); `finish` runs inside it, after the N calls (batched mode's flush).
    """

    key: str
    title: str
    call: Callable[[], Any]
    prepare: Callable[[], None] | None = None
    finish: Callable[[], None] | None = None
    #: calls per batch and warm-up calls of this scenario (None: the run's): a paced
    #: scenario makes fewer
    calls: int | None = None
    warm_up: int | None = None


def ok() -> str:
    return "ok"


def ping(client: redis.Redis, name: str) -> CostScenario:
    return CostScenario("ping", "PING", client.ping)


def empty_script(client: redis.Redis, wire: Sequence[Any]) -> CostScenario:
    """An empty script given the keys and arguments the exact CLOSED record sends."""
    numkeys = int(wire[2])
    keys, args = list(wire[3:3 + numkeys]), list(wire[3 + numkeys:])
    sha = client.script_load("")
    return CostScenario("empty_evalsha",
                        f"empty EVALSHA, {len(keys)} keys + {len(args)} args",
                        lambda: client.evalsha(sha, len(keys), *keys, *args))


def pybreaker_closed(client: redis.Redis, name: str) -> CostScenario:
    import pybreaker

    # CircuitRedisStorage decodes the bytes it reads: it needs decode_responses=False.
    storage = pybreaker.CircuitRedisStorage(pybreaker.STATE_CLOSED, client, namespace=name)
    breaker = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=3600, state_storage=storage)
    return CostScenario("pybreaker_closed", "pybreaker + CircuitRedisStorage, CLOSED success",
                        lambda: breaker.call(ok))


def exact_closed(client: redis.Redis, name: str) -> CostScenario:
    breaker = CircuitBreaker(name, redis=client)
    breaker.reset()
    return CostScenario("closed", "distbreaker exact CLOSED success (COUNT window)",
                        lambda: breaker.call(ok))


def exact_closed_recording(client: redis.Redis, name: str) -> CostScenario:
    """The exact CLOSED record with outcome recording on (every call sampled: the
    stream's XADD and PEXPIRE ride on the record's script call)."""
    breaker = CircuitBreaker(name, redis=client, record_sample_rate=1.0)
    breaker.reset()
    return CostScenario("closed_recording", "exact CLOSED success, recording 100 %",
                        lambda: breaker.call(ok))


#: Shadow configs fed by the CLOSED record (docs/guides/shadow.md): candidates that differ
#: from the live config in their thresholds (same COUNT window of 100), none trips.
SHADOW_CANDIDATES = ({"failure_rate_threshold": 30}, {"failure_rate_threshold": 20},
                     {"minimum_number_of_calls": 20, "failure_rate_threshold": 40})


def shadowed_closed(client: redis.Redis, name: str, shadows: int) -> CostScenario:
    """The exact CLOSED success of a breaker carrying `shadows` shadow configs."""
    from distbreaker import operate

    breaker = CircuitBreaker(name, redis=client)
    breaker.reset()
    for i in range(shadows):
        operate.set_shadow(client, DEFAULT_PREFIX, name, f"s{i}", SHADOW_CANDIDATES[i],
                           "cost bench", "bench")
    label = "1 shadow" if shadows == 1 else f"{shadows} shadows"
    return CostScenario(f"closed_shadow_{shadows}", f"CLOSED success + {label} (COUNT)",
                        lambda: breaker.call(ok))


def exact_closed_time(client: redis.Redis, name: str) -> CostScenario:
    breaker = CircuitBreaker(name, redis=client, sliding_window_type="TIME_BASED")
    breaker.reset()
    return CostScenario("closed_time", "distbreaker exact CLOSED success (TIME window)",
                        lambda: breaker.call(ok))


#: The longest TIME window (BreakerConfig's limit) and the idle gaps its first call
#: after a pause is measured at: 1 h (the whole window left: reset in one write),
#: 30 min and 59 min 59 s (half the window, and all of it but one second, were busy
#: seconds that leave: the largest reads there are).
LONG_WINDOW = 3600
IDLE_GAPS = ((3600, "after 1 h idle"), (1800, "after 30 min idle"),
             (3599, "after 59 min 59 s idle"))
#: A one-minute window (its every gap from 60 s on is a restart) and its worst gaps.
SHORT_WINDOW = 60
SHORT_IDLE_GAPS = ((3600, "after 1 h idle"), (1800, "after 30 min idle"),
                   (30, "after 30 s idle"), (59, "after 59 s idle"))
#: Outcomes per batched flush in the idle-gap row.
IDLE_FLUSH = 10


def time_breaker(client: redis.Redis, name: str, window: int = LONG_WINDOW,
                 batched: bool = False) -> CircuitBreaker:
    extra: dict[str, Any] = ({"record_mode": "batched", "flush_interval": 60.0,
                              "max_batch": 1000} if batched else {})
    return CircuitBreaker(name, redis=client, sliding_window_type="TIME_BASED",
                          sliding_window_size=window, key_ttl=max(2 * window, 120),
                          subscribe=False, **extra)


def steady_long_window(client: redis.Redis, name: str) -> CostScenario:
    breaker = time_breaker(client, name)
    breaker.reset()
    return CostScenario("closed_time_3600", "TIME window of 3,600 s, steady calls",
                        lambda: breaker.call(ok))


def age_time_record(client: redis.Redis, key: str, gap: int, ttl_due: bool = True,
                    size: int = LONG_WINDOW) -> None:
    """Rewrite a TIME record as if its last call was `gap` seconds ago, after a window
    whose every second saw 10 successful calls of 5 ms (the most there is to evict);
    its TTL refresh is as old as that last call, as it would be (`ttl_due`), or just
    made (to count the window's part alone)."""
    from distbreaker._runtime.state_record import (
        WINDOW_OFFSET,
        encode_fields,
        encode_time_window,
    )

    data = client.get(key)
    assert isinstance(data, bytes)
    seconds, _ = client.time()
    last = int(seconds) - gap
    slots, (calls, failures, slow, total_ms) = encode_time_window(
        size, last, {t: (10, 0, 0, 50) for t in range(last - size, last + 1)})
    header = encode_fields(data, wsec=last, head=last - size,
                           ttl_at=(last if ttl_due else int(seconds)) * 1000,
                           calls=calls, failures=failures, slow=slow, total_ms=total_ms)
    client.set(key, header[:WINDOW_OFFSET] + slots, keepttl=True)


def idle_long_window(client: redis.Redis, name: str, gap: int, label: str,
                     calls: int, ttl_due: bool = True, window: int = LONG_WINDOW,
                     batched: bool = False) -> CostScenario:
    """The first call on a TIME breaker (TIME-3600 unless `window` says) after an idle
    `gap`: each call of a batch is made on its own breaker, every one aged by `prepare`
    (outside the measurement). `batched`: the call is a flush of IDLE_FLUSH outcomes."""
    pool = [time_breaker(client, f"{name}-{i}", window, batched)
            for i in range(max(calls, WARM_UP_CALLS))]
    made = False
    turn = 0

    def prepare() -> None:
        nonlocal made, turn
        for breaker in pool:
            # made by a first call (again if its key_ttl ran out since the last batch: a
            # TIME-60 breaker's is 120 s, less than a pass of every scenario under callgrind)
            if not made or not client.exists(breaker.keys.state):
                breaker.call(ok)
                if batched:
                    breaker.flush()  # the record exists before it is aged
        made = True
        for breaker in pool:
            age_time_record(client, breaker.keys.state, gap, ttl_due, window)
            # its first call after the gap says hello, as a worker's does after any gap
            # longer than HELLO_INTERVAL (20 s)
            breaker._codec._next_hello = 0.0
        turn = 0

    def call() -> None:
        nonlocal turn
        breaker = pool[turn % len(pool)]
        turn += 1
        if not batched:
            breaker.call(ok)
            return
        for _ in range(IDLE_FLUSH):
            breaker.call(ok)
        breaker.flush()

    size = f"{window:,} s"
    if batched:
        return CostScenario(f"batched_time_{window}_idle_{gap}",
                            f"TIME window of {size}, a batched flush of {IDLE_FLUSH} "
                            f"outcomes {label}", call, prepare=prepare)
    if window != LONG_WINDOW:
        return CostScenario(f"closed_time_{window}_idle_{gap}",
                            f"TIME window of {size}, first call {label}", call,
                            prepare=prepare)
    if ttl_due:
        return CostScenario(f"closed_time_idle_{gap}",
                            f"TIME window of 3,600 s, first call {label}", call, prepare=prepare)
    return CostScenario(f"closed_time_idle_{gap}_no_ttl",
                        f"TIME window of 3,600 s, first call {label}, no TTL refresh due",
                        call, prepare=prepare)


def half_open_probe(client: redis.Redis, name: str) -> CostScenario:
    """acquire + record of one probe; re-tripped before each batch, the first probe
    (OPEN -> HALF_OPEN, a transition) made there, so batches see steady HALF_OPEN."""
    breaker = CircuitBreaker(name, redis=client, permitted_calls_in_half_open=HALF_OPEN_PROBES,
                             wait_duration_in_open_state=0.001)

    def retrip() -> None:
        breaker.trip("bench")
        time.sleep(0.005)  # OPEN -> HALF_OPEN by server time alone
        breaker.call(ok)
        if breaker.state is not State.HALF_OPEN:
            raise RuntimeError(f"{name}: expected HALF_OPEN, found {breaker.state}")

    return CostScenario("half_open", "distbreaker HALF_OPEN probe (acquire + record)",
                        lambda: breaker.call(ok), prepare=retrip)


def open_fast_fail(client: redis.Redis, name: str) -> CostScenario:
    # The longest revalidate_interval: the local OPEN view is re-read from Redis once
    # per interval, so with the default 1 s a slow run would measure some re-reads
    # too (how many depends on the machine's speed, not on the path).
    breaker = CircuitBreaker(name, redis=client, wait_duration_in_open_state=3600.0,
                             revalidate_interval=60.0)
    breaker.trip("bench")

    def rejected() -> None:
        try:
            breaker.call(ok)
        except CallNotPermitted:
            return
        raise RuntimeError("the OPEN breaker let a call through")

    return CostScenario("open", "distbreaker OPEN fast-fail", rejected)


def batched_closed(client: redis.Redis, name: str, per_flush: int) -> CostScenario:
    """Every call's outcome batched; an explicit flush after every `per_flush` calls (and
    at the end of a batch), none timed (flush_interval 60 s): a flush of k outcomes costs
    about the same as k exact records up to the count window, so k must be stated."""
    breaker = CircuitBreaker(name, redis=client, record_mode="batched", flush_interval=60.0,
                             max_batch=100_000, max_pending=1_000_000)
    breaker.reset()
    pending = 0

    def call() -> None:
        nonlocal pending
        breaker.call(ok)
        pending += 1
        if pending == per_flush:
            breaker.flush()
            pending = 0

    def flush() -> None:
        nonlocal pending
        breaker.flush()
        pending = 0

    return CostScenario(f"batched_closed_{per_flush}",
                        f"distbreaker batched CLOSED, a flush every {per_flush} calls",
                        call, prepare=flush, finish=flush)


def policy_attempt(client: redis.Redis, name: str) -> CostScenario:
    policy = Policy(name, redis=client, bulkhead={"max_concurrent_calls": 25},
                    retry={"max_attempts": 3}, budget=True)
    return CostScenario("policy", "full Policy attempt (breaker + bulkhead + budget)",
                        lambda: policy.call(ok))


#: Policy attempts spread out (calls per second, calls per batch): the budget starts a
#: new slice every second and the breaker's hello is due every 20 s, so a spread-out
#: attempt can cost more than back-to-back ones (issue 25: <= 250k at every pacing).
POLICY_PACINGS = ((2.0, 20), (0.2, 6))


def policy_paced(client: redis.Redis, name: str, per_second: float,
                 calls: int) -> CostScenario:
    """A Policy attempt every 1/`per_second` s (the wait is idle time: callgrind counts
    only the server's request handling). A few warm-up calls only."""
    policy = Policy(name, redis=client, bulkhead={"max_concurrent_calls": 25},
                    retry={"max_attempts": 3}, budget=True)
    interval = 1.0 / per_second
    last = 0.0

    def call() -> None:
        nonlocal last
        wait = last + interval - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        last = time.monotonic()
        policy.call(ok)

    label = f"{per_second:g}".replace(".", "_")
    return CostScenario(f"policy_{label}_per_s",
                        f"full Policy attempt, {per_second:g} attempts/s", call,
                        calls=calls, warm_up=2)


def bulkhead_slot(client: redis.Redis, name: str) -> CostScenario:
    bulkhead = Bulkhead(name, redis=client, max_concurrent_calls=25)

    def acquire_release() -> None:
        bulkhead.release(bulkhead.acquire())

    return CostScenario("bulkhead", "bulkhead acquire + release", acquire_release)


def adaptive_bulkhead_slot(client: redis.Redis, name: str) -> CostScenario:
    """The same with an adaptive limit: each release reports an ok outcome and its
    latency, which the script folds into the limit (issue 18: at most 1.3x the plain)."""
    bulkhead = Bulkhead(name, redis=client, max_concurrent_calls=25,
                        adaptive=AdaptiveLimit(min_limit=1, max_limit=25))

    def acquire_release() -> None:
        bulkhead.release(bulkhead.acquire())

    return CostScenario("adaptive_bulkhead", "adaptive bulkhead acquire + release (ok)",
                        acquire_release)


def budget_deposit(client: redis.Redis, name: str) -> CostScenario:
    budget = RetryBudget(name, redis=client)
    return CostScenario("budget", "retry budget deposit", budget.deposit)


def ratelimiter_acquire(client: redis.Redis, name: str) -> CostScenario:
    """A granted permit (a limit no batch reaches: the usual call, no wait)."""
    limiter = RateLimiter(name, redis=client, limit_for_period=1_000_000,
                          limit_refresh_period=1, timeout_duration=0)
    return CostScenario("ratelimiter", "rate limiter acquire (granted)", limiter.acquire)


def pool_pick_record(client: redis.Redis, name: str) -> CostScenario:
    """A pool of 10 members: pick one (a lease in its in-flight count), record a success
    (issue 26: two script calls per call)."""
    pool = Pool(name, redis=client, members=[f"10.0.0.{i}:80" for i in range(10)],
                redis_timeout=SLOW_SERVER_TIMEOUT)

    def pick_record() -> None:
        pool.record(pool.pick(), status=200, duration=0.005)

    return CostScenario("pool", "pool pick + record (10 members, success)", pick_record)


def pool_repick(client: redis.Redis, name: str) -> CostScenario:
    """The same calls chained with `repick`: each call records the last one's success and
    picks the next member in one script call."""
    pool = Pool(name, redis=client, members=[f"10.0.0.{i}:80" for i in range(10)],
                redis_timeout=SLOW_SERVER_TIMEOUT)
    last = [pool.pick()]

    def repick() -> None:
        last[0] = pool.repick(last[0], status=200, duration=0.005)

    return CostScenario("pool_repick", "pool repick: record + pick in one call (10 members)",
                        repick)


def record_wire(scenario: CostScenario) -> tuple[Any, ...]:
    """The script call (command, sha or function, numkeys, keys..., args...) a steady call
    sends (the second: a breaker's first call says hello in the full form)."""
    scenario.call()  # (a first call says hello: the full form)
    CountingConnection.last_script = None
    scenario.call()
    if CountingConnection.last_script is None:
        raise RuntimeError(f"{scenario.title}: sent no script call (Redis unreachable?)")
    return CountingConnection.last_script


def build_scenarios(url: str, tag: str, calls: int = DEFAULT_CALLS,
                    pacings: Sequence[tuple[float, int]] = POLICY_PACINGS
                    ) -> list[CostScenario]:
    """Every measured path, each on its own keys (names start with `tag`); `pacings`:
    the spread-out Policy rows (attempts/s, calls per batch)."""
    client = counting_client(url)
    closed = exact_closed(client, f"{tag}-closed")
    scenarios = [ping(client, tag), empty_script(client, record_wire(closed))]
    try:
        scenarios.append(pybreaker_closed(client, f"{tag}-pyb"))
    except ImportError:  # pybreaker: in the bench and test extras
        print("pybreaker is not installed: skipping its scenario", file=sys.stderr)
    return [*scenarios, closed, exact_closed_recording(client, f"{tag}-rec"),
            *(shadowed_closed(client, f"{tag}-shadow{k}", k) for k in (1, 3)),
            exact_closed_time(client, f"{tag}-time"),
            steady_long_window(client, f"{tag}-time3600"),
            *(idle_long_window(client, f"{tag}-idle{gap}", gap, label, calls)
              for gap, label in IDLE_GAPS),
            idle_long_window(client, f"{tag}-idle-fresh", IDLE_GAPS[0][0], IDLE_GAPS[0][1],
                             calls, ttl_due=False),
            *(idle_long_window(client, f"{tag}-idle60-{gap}", gap, label, calls,
                               window=SHORT_WINDOW) for gap, label in SHORT_IDLE_GAPS),
            idle_long_window(client, f"{tag}-idle-batched", 1800, "after 30 min idle", calls,
                             batched=True),
            half_open_probe(client, f"{tag}-half"), open_fast_fail(client, f"{tag}-open"),
            *(batched_closed(client, f"{tag}-batched-{k}", k) for k in BATCH_SIZES),
            policy_attempt(client, f"{tag}-policy"),
            *(policy_paced(client, f"{tag}-policy-{i}", rate, n)
              for i, (rate, n) in enumerate(pacings)),
            bulkhead_slot(client, f"{tag}-bulkhead"),
            adaptive_bulkhead_slot(client, f"{tag}-adaptive-bulkhead"),
            budget_deposit(client, f"{tag}-budget"),
            ratelimiter_acquire(client, f"{tag}-ratelimiter"),
            pool_pick_record(client, f"{tag}-pool"), pool_repick(client, f"{tag}-repick")]


# -- measuring -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Cost:
    """Instructions the server executed in one measured batch."""

    total: int
    script: int | None = None  # inclusive cost of luaCallFunction, None if unknown


class Meter(Protocol):
    """Brackets one measured batch (callgrind; or nothing, when only counting)."""

    def zero(self) -> None: ...

    def dump(self, label: str) -> Cost | None: ...


class NoMeter:
    """Measures nothing: the scenario drivers run and their round trips are counted."""

    def zero(self) -> None:
        pass

    def dump(self, label: str) -> Cost | None:
        return None


@dataclasses.dataclass
class Measured:
    """One scenario's batches."""

    key: str
    title: str
    calls: int
    batches: int = 0
    costs: list[Cost] = dataclasses.field(default_factory=list)
    round_trips: int = 0
    commands: Counter[str] = dataclasses.field(default_factory=Counter)

    def per_call(self) -> float | None:
        if not self.costs:
            return None
        return sum(c.total for c in self.costs) / (self.calls * len(self.costs))

    def script_per_call(self) -> float | None:
        scripts = [c.script for c in self.costs]
        if not scripts or any(s is None for s in scripts):
            return None
        return sum(s for s in scripts if s is not None) / (self.calls * len(scripts))

    def batch_range(self) -> dict[str, int | None]:
        """Min, median and max of the batches' per-call counts."""
        values = sorted(c.total / self.calls for c in self.costs)
        if not values:
            return {"min_per_call": None, "median_per_call": None, "max_per_call": None}
        return {"min_per_call": round(values[0]),
                "median_per_call": round(statistics.median(values)),
                "max_per_call": round(values[-1])}

    def spread(self) -> float | None:
        """(max - min) / mean of the batches' per-call counts."""
        totals = [c.total for c in self.costs]
        mean = sum(totals) / len(totals) if totals else 0
        return (max(totals) - min(totals)) / mean if len(totals) > 1 and mean else None

    def round_trips_per_call(self) -> float:
        return self.round_trips / (self.calls * self.batches) if self.batches else 0.0

    def commands_per_call(self) -> dict[str, float]:
        calls = self.calls * self.batches or 1
        return {name: n / calls for name, n in sorted(self.commands.items())}


def measure(scenarios: Sequence[CostScenario], meter: Meter, calls: int, batches: int,
            warm_up: int = WARM_UP_CALLS) -> list[Measured]:
    """Warm every scenario up, then measure `batches` batches of `calls` calls each,
    interleaved (batch 1 of all, then batch 2 of all)."""
    for scenario in scenarios:
        if scenario.prepare is not None:
            scenario.prepare()
        for _ in range(warm_up if scenario.warm_up is None else min(warm_up, scenario.warm_up)):
            scenario.call()
        if scenario.finish is not None:
            scenario.finish()
    results = {s.key: Measured(s.key, s.title, s.calls or calls) for s in scenarios}
    for batch in range(batches):
        for scenario in scenarios:
            if scenario.prepare is not None:
                scenario.prepare()
            call, done = scenario.call, results[scenario.key]
            CountingConnection.reset()
            meter.zero()
            for _ in range(done.calls):
                call()
            if scenario.finish is not None:
                scenario.finish()
            cost = meter.dump(f"{batch + 1}-{scenario.key}")
            done.batches += 1
            done.round_trips += CountingConnection.round_trips
            done.commands += CountingConnection.commands
            if cost is not None:
                done.costs.append(cost)
    return list(results.values())


# -- callgrind -------------------------------------------------------------------------

def ensure_valgrind() -> None:
    """valgrind and callgrind_control on PATH, installed with apt-get when missing (root)."""
    if shutil.which("valgrind") and shutil.which("callgrind_control"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SystemExit("valgrind is missing: install it (apt-get install valgrind)")
    print("installing valgrind with apt-get", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", "valgrind"], check=True, env=env,
                   stdout=subprocess.DEVNULL)


#: A Functions library of the bench's own: a full GC of the Functions VM through FCALL
#: (EVAL's collectgarbage cleans only EVAL's VM).
GC_FUNCTION = "distbreaker_bench_gc"
GC_LIBRARY = (f"#!lua name={GC_FUNCTION}\nredis.register_function('{GC_FUNCTION}', "
              "function() collectgarbage('collect') return 1 end)")


class CallgrindServer:
    """``redis-server`` under callgrind, collecting only inside `TOGGLES`; a `Meter`."""

    def __init__(self, binary: str, keep: str | None = None) -> None:
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="distbreaker-callgrind-"))
        self.keep = Path(keep) if keep else None
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.version = "?"
        self._seen: set[str] = set()
        self._gc_loaded = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> CallgrindServer:
        args = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
                *(f"--toggle-collect={name}" for name in TOGGLES),
                f"--callgrind-out-file={self.dir / 'callgrind.out'}",
                self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.dir), "--protected-mode", "no"]
        with open(self.dir / "valgrind.log", "wb") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_timeout=5, socket_connect_timeout=1)
        deadline = time.monotonic() + 120
        while True:
            if self.process.poll() is not None:
                raise RuntimeError("redis-server under valgrind exited:\n" + self.log_tail())
            try:
                client.ping()
                break
            except redis.RedisError as error:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server under valgrind did not answer in 120 s"
                                       ) from error
                time.sleep(0.2)
        client.close()
        self.version = str(redis.Redis(port=self.port).info("server")["redis_version"])
        return self

    def log_tail(self) -> str:
        return (self.dir / "valgrind.log").read_text(errors="replace")[-2000:]

    def _control(self, *args: str) -> None:
        assert self.process is not None
        done = subprocess.run(["callgrind_control", *args, str(self.process.pid)],
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0 or "Error" in done.stdout:
            raise RuntimeError(f"callgrind_control {' '.join(args)} failed: "
                               f"{done.stdout}{done.stderr}")

    def zero(self) -> None:
        """A full Lua GC first (uncounted) in both of Redis's Lua VMs: EVAL's, and the
        Functions VM that FCALL runs in (one VM for every library, so a tiny library of
        the bench's own collects distbreaker's garbage too). The GC steps Redis runs
        every 50 script calls then collect this batch's garbage, not the previous
        scenario's."""
        with redis.Redis(port=self.port, socket_timeout=SLOW_SERVER_TIMEOUT) as admin:
            admin.eval("collectgarbage('collect')", 0)
            if not self._gc_loaded:
                admin.function_load(GC_LIBRARY, replace=True)
                self._gc_loaded = True
            admin.fcall(GC_FUNCTION, 0)
        self._control("-z")

    def dump(self, label: str) -> Cost:
        self._control("-d")
        new = sorted((p for p in self.dir.glob("callgrind.out.*") if p.name not in self._seen),
                     key=lambda p: int(p.name.rsplit(".", 1)[1]))
        if len(new) != 1:
            raise RuntimeError(f"expected one new callgrind dump, found {len(new)}")
        path = new[0]
        self._seen.add(path.name)
        cost = Cost(dump_total(path), inclusive(path, SCRIPT_FUNCTION))
        if self.keep is not None:
            self.keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, self.keep / f"callgrind.{label}.out")
        return cost

    def stop(self) -> None:
        terminate(self.process, grace=30)
        self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> CallgrindServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def dump_total(path: Path) -> int:
    """The Ir total of a callgrind dump (its ``totals:`` or ``summary:`` line)."""
    for line in path.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"{path}: no totals line")


def inclusive(path: Path, function: str) -> int | None:
    """The inclusive Ir of `function` in a dump (callgrind_annotate), None if absent."""
    if not shutil.which("callgrind_annotate"):
        return None
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                           str(path)], capture_output=True, text=True, check=True).stdout
    pattern = re.compile(rf"^\s*([\d,]+)\s.*[:\s]{re.escape(function)}\b")
    for line in text.splitlines():
        match = pattern.match(line)
        if match:
            return int(match.group(1).replace(",", ""))
    return 0 if dump_total(path) == 0 else None


def run_redis_cost(binary: str, calls: int, batches: int,
                   keep: str | None) -> tuple[list[Measured], str]:
    """Every scenario against a fresh server under callgrind; (results, server version)."""
    ensure_valgrind()
    with CallgrindServer(binary, keep) as server:
        tag = f"cost-{secrets.token_hex(3)}"
        results = measure(build_scenarios(server.url, tag, calls), server, calls, batches)
    if not any(m.per_call() for m in results):
        raise SystemExit(f"callgrind collected nothing: does {binary} have the symbols "
                         f"{', '.join(TOGGLES)}? (nm -D {binary})")
    return results, server.version


# -- reporting the cost ------------------------------------------------------------------

COST_BASES = {"PING": "ping", "pybreaker": "pybreaker_closed"}


def cost_rows(results: Sequence[Measured]) -> list[dict[str, Any]]:
    """One JSON-ready row per scenario, with ratios to PING and to pybreaker."""
    per_call = {m.key: m.per_call() for m in results}
    rows = []
    for m in results:
        value, script, spread = m.per_call(), m.script_per_call(), m.spread()
        ratios = {f"x_{label}": round(value / per_call[base], 2)
                  for label, base in COST_BASES.items()
                  if value is not None and per_call.get(base)}
        rows.append({
            "key": m.key, "scenario": m.title, "calls": m.calls, "batches": m.batches,
            "instructions_per_call": None if value is None else round(value),
            "in_script_per_call": None if script is None else round(script),
            "spread": None if spread is None else round(spread, 4),
            **m.batch_range(),
            "round_trips_per_call": round(m.round_trips_per_call(), 3),
            "commands_per_call": {name: round(n, 3)
                                  for name, n in m.commands_per_call().items()},
            **ratios,
        })
    return rows


def _k(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:,.1f}k" if value >= 1000 else f"{value:,.0f}"


def print_cost_table(rows: Sequence[dict[str, Any]]) -> None:
    header = (f"{'call':52} {'instr/call':>10} {'min..max':>17} {'in script':>10} "
              f"{'x PING':>7} {'x pybreaker':>11} {'round trips':>11} {'spread':>7}")
    print(header)
    print("-" * len(header))
    for r in rows:
        spread = "-" if r["spread"] is None else f"{r['spread'] * 100:.1f}%"
        ping_ratio = r.get("x_PING")
        pyb_ratio = r.get("x_pybreaker")
        span = (f"{_k(r.get('min_per_call'))}..{_k(r.get('max_per_call'))}"
                if r.get("min_per_call") is not None else "-")
        print(f"{r['scenario']:52} {_k(r['instructions_per_call']):>10} {span:>17} "
              f"{_k(r['in_script_per_call']):>10} "
              f"{'-' if ping_ratio is None else f'{ping_ratio:.2f}':>7} "
              f"{'-' if pyb_ratio is None else f'{pyb_ratio:.2f}':>11} "
              f"{r['round_trips_per_call']:11.2f} {spread:>7}")
    print(f"\ninstr/call: server instructions per call, the mean of the batches (min..max: "
          "the cheapest and the\ndearest batch; callgrind, collected in "
          f"{' and '.join(TOGGLES)} only);\nin script: of which inside {SCRIPT_FUNCTION} "
          "(KEYS/ARGV, body, its commands, reply); round trips: requests\nthe client sent per call "
          "(a pipeline is one); spread: (max - min) / mean over the batches.")


# -- the fleet ceiling ---------------------------------------------------------------------

IDLE, STOP = -1, -2
CEILING_SCENARIOS = (
    ("ping", "PING", ("ping",)),
    ("pybreaker_closed", "pybreaker + CircuitRedisStorage, CLOSED success", ("get", "set")),
    ("closed", "distbreaker exact CLOSED success (COUNT window)", ("evalsha", "eval", "fcall")),
)
CEILING_BATCH = 20  # calls between two looks at the phase


def ceiling_calls(url: str, tag: str) -> list[Callable[[], Any]]:
    """One process's callables, in CEILING_SCENARIOS order (shared names: one fleet)."""
    import pybreaker

    client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
    storage = pybreaker.CircuitRedisStorage(pybreaker.STATE_CLOSED, client,
                                            namespace=f"{tag}-pyb")
    legacy = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=3600, state_storage=storage)
    breaker = CircuitBreaker(f"{tag}-closed", redis=client)
    return [client.ping, lambda: legacy.call(ok), lambda: breaker.call(ok)]


def ceiling_worker(url: str, tag: str, index: int, phase: Any, counts: Any, idle: Any,
                   ready: Any) -> None:
    """Call the scenario `phase` names, in batches, until STOP: counts[index * K + s].

    idle[index] is 1 only while the last phase this process read was IDLE (it is
    cleared before every read), so once the parent has set IDLE and sees 1 everywhere,
    the counts are final: calls and server figures cover exactly the same calls."""
    calls = ceiling_calls(url, tag)
    for call in calls:
        call()
    ready.release()
    width = len(calls)
    while True:
        idle[index] = 0
        current = phase.value
        if current == STOP:
            return
        if current == IDLE:
            idle[index] = 1
            time.sleep(0.002)
            continue
        call = calls[current]
        for _ in range(CEILING_BATCH):
            call()
        counts[index * width + current] += CEILING_BATCH


def settle(idle: Any, processes: int, timeout: float = 30.0) -> None:
    """Wait until every worker has finished its calls of the slice just ended."""
    deadline = time.monotonic() + timeout
    while sum(idle[i] for i in range(processes)) < processes:
        if time.monotonic() > deadline:
            raise RuntimeError("a fleet-ceiling worker did not finish its slice")
        time.sleep(0.005)


def server_cpu(admin: redis.Redis) -> tuple[float, float]:
    """The server's CPU seconds so far: (user space, kernel)."""
    info = admin.info("cpu")
    return float(info["used_cpu_user"]), float(info["used_cpu_sys"])


def command_calls(admin: redis.Redis) -> Counter[str]:
    return Counter({key.removeprefix("cmdstat_"): int(value["calls"])
                    for key, value in admin.info("commandstats").items()})


def run_ceiling(url: str, processes: int, seconds: float, rounds: int) -> list[dict[str, Any]]:
    """Spawn the fleet; per scenario: calls, server CPU, calls per server CPU second."""
    ctx = multiprocessing.get_context("spawn")
    width = len(CEILING_SCENARIOS)
    phase, counts = ctx.RawValue("i", IDLE), ctx.RawArray("q", processes * width)
    idle = ctx.RawArray("i", processes)
    ready = ctx.Semaphore(0)
    tag = f"ceiling-{secrets.token_hex(3)}"
    admin = redis.Redis.from_url(url)
    totals = [{"calls": 0, "cpu": 0.0, "user": 0.0, "wall": 0.0, "requests": 0}
              for _ in CEILING_SCENARIOS]
    workers = [ctx.Process(target=ceiling_worker,
                           args=(url, tag, i, phase, counts, idle, ready), daemon=True)
               for i in range(processes)]
    try:
        for worker in workers:
            worker.start()
        for _ in workers:
            if not ready.acquire(timeout=120):
                raise RuntimeError("a fleet-ceiling worker did not start")
        settle(idle, processes)
        for _ in range(rounds):
            for s, (_, _, sent) in enumerate(CEILING_SCENARIOS):
                done = sum(counts[i * width + s] for i in range(processes))
                cpu, commands = server_cpu(admin), command_calls(admin)
                started = time.perf_counter()
                phase.value = s
                time.sleep(seconds / rounds)
                phase.value = IDLE
                wall = time.perf_counter() - started
                settle(idle, processes)
                after = command_calls(admin)
                user, kernel = server_cpu(admin)
                totals[s]["cpu"] += user + kernel - sum(cpu)
                totals[s]["user"] += user - cpu[0]
                totals[s]["calls"] += sum(counts[i * width + s] for i in range(processes)) - done
                totals[s]["wall"] += wall
                totals[s]["requests"] += sum(after[n] - commands[n] for n in sent)
    finally:
        phase.value = STOP
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.terminate()
        for key in admin.scan_iter(match=f"*{tag}*", count=1000):
            admin.delete(key)
        admin.close()
    return ceiling_rows(totals)


def ceiling_rows(totals: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for (key, title, _), t in zip(CEILING_SCENARIOS, totals, strict=True):
        calls, cpu, user = t["calls"], t["cpu"], t.get("user", 0.0)
        rows.append({
            "key": key, "scenario": title, "calls": calls, "seconds": round(t["wall"], 3),
            "calls_per_second": round(calls / t["wall"], 1) if t["wall"] else 0.0,
            "server_cpu_seconds": round(cpu, 3),
            "server_cpu_share": round(cpu / t["wall"], 3) if t["wall"] else 0.0,
            "server_us_per_call": round(cpu / calls * 1e6, 2) if calls else None,
            "ceiling_calls_per_server_cpu_second": round(calls / cpu) if cpu > 0 else None,
            # Redis's own work only (portable across hosts: the kernel's share of a
            # request's socket work depends on the machine, a VM's especially)
            "server_user_cpu_seconds": round(user, 3),
            "kernel_share": round(1 - user / cpu, 3) if cpu > 0 else None,
            "ceiling_calls_per_user_cpu_second": round(calls / user) if user > 0 else None,
            "requests_per_call": round(t["requests"] / calls, 3) if calls else None,
        })
    return rows


def ceiling_ratio(rows: Sequence[dict[str, Any]],
                  field: str = "ceiling_calls_per_server_cpu_second") -> float | None:
    """distbreaker exact CLOSED's ceiling over pybreaker's (by total or user-space CPU)."""
    ceiling = {r["key"]: r.get(field) for r in rows}
    if ceiling.get("closed") and ceiling.get("pybreaker_closed"):
        return round(ceiling["closed"] / ceiling["pybreaker_closed"], 3)
    return None


def print_ceiling_table(rows: Sequence[dict[str, Any]], processes: int) -> None:
    print(f"\nfleet ceiling: {processes} client processes, one redis-server "
          "(server CPU from INFO cpu)")
    header = (f"{'call':52} {'calls/s':>9} {'server CPU':>10} {'us/call':>8} "
              f"{'ceiling calls/s':>15} {'kernel':>6} {'user-CPU ceiling':>16} {'requests':>8}")
    print(header)
    print("-" * len(header))
    for r in rows:
        us = r["server_us_per_call"]
        ceiling = r["ceiling_calls_per_server_cpu_second"]
        user = r.get("ceiling_calls_per_user_cpu_second")
        kernel = r.get("kernel_share")
        print(f"{r['scenario']:52} {r['calls_per_second']:9,.0f} "
              f"{r['server_cpu_share'] * 100:9.0f}% {'-' if us is None else f'{us:.1f}':>8} "
              f"{'-' if ceiling is None else f'{ceiling:,}':>15} "
              f"{'-' if kernel is None else f'{kernel * 100:.0f}%':>6} "
              f"{'-' if user is None else f'{user:,}':>16} "
              f"{r['requests_per_call'] or 0:8.2f}")
    for label, field in (("server CPU", "ceiling_calls_per_server_cpu_second"),
                         ("Redis user-space CPU", "ceiling_calls_per_user_cpu_second")):
        ratio = ceiling_ratio(rows, field)
        if ratio is not None:
            print(f"  distbreaker exact / pybreaker ceiling, by {label}: {ratio:.2f}x")
    print("ceiling: calls per second of server CPU (user + sys), i.e. what one Redis core "
          "sustains here;\nkernel: the share of that CPU spent in the kernel (socket reads and "
          "writes: a cheap command's\nceiling is set by it, and it depends on the host, a VM's "
          "especially); user-CPU ceiling: calls\nper second of Redis's own user-space CPU, "
          "portable across hosts; requests: commands the\nclients sent per call, counted by "
          "the server.")


# -- bench.py's command line -----------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench.py's options for these modes (--calls, --seconds, --rounds, --processes,
    --url and --json are shared with the other modes)."""
    parser.add_argument("--redis-cost", action="store_true",
                        help="server instructions per call under callgrind (valgrind)")
    parser.add_argument("--fleet-ceiling", action="store_true",
                        help="calls/s one Redis core sustains, from --processes processes")
    parser.add_argument("--cost-batches", type=int, default=2,
                        help=f"--redis-cost: batches of --calls (default {DEFAULT_CALLS}) "
                             "calls per scenario (default 2)")
    parser.add_argument("--server-binary", default=None,
                        help="--redis-cost: the redis-server to measure (default: on PATH)")
    parser.add_argument("--callgrind-dir",
                        help="--redis-cost: keep every batch's callgrind dump in this folder")


def main(options: argparse.Namespace,
         redis_url: Callable[[str | None], contextlib.AbstractContextManager[Any]]) -> int:
    """Run --redis-cost and/or --fleet-ceiling; `redis_url` yields (url, origin)."""
    calls = options.calls or DEFAULT_CALLS
    if options.redis_cost and not 1 <= calls <= MAX_CALLS:
        raise SystemExit(f"--calls must be in [1, {MAX_CALLS}] for --redis-cost")
    if options.redis_cost and options.url:
        print("--redis-cost spawns its own server under callgrind: --url is for "
              "--fleet-ceiling only", file=sys.stderr)
    document: dict[str, Any] = {"distbreaker": distbreaker.__version__,
                                "python": sys.version.split()[0]}
    text: list[Callable[[], None]] = []
    if options.redis_cost:
        binary = options.server_binary or shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not on PATH (or give --server-binary)")
        results, version = run_redis_cost(binary, calls, max(1, options.cost_batches),
                                          options.callgrind_dir)
        rows = cost_rows(results)
        document["redis_cost"] = {"redis_version": version, "server": binary,
                                  "calls_per_batch": calls,
                                  "batches": max(1, options.cost_batches),
                                  "collected_in": list(TOGGLES), "results": rows}
        heading = (f"redis cost: redis {version} under callgrind, {calls} calls x "
                   f"{max(1, options.cost_batches)} batches per scenario")
        text += [lambda: print(heading), lambda: print_cost_table(rows)]
    if options.fleet_ceiling:
        rounds = max(1, min(options.rounds, 6))
        with redis_url(options.url) as (url, origin):
            version = redis.Redis.from_url(url).info("server").get("redis_version", "?")
            ceiling = run_ceiling(url, options.processes, options.seconds, rounds)
        document["fleet_ceiling"] = {
            "redis_version": version, "redis": origin, "processes": options.processes,
            "seconds_per_scenario": options.seconds, "rounds": rounds, "cpus": os.cpu_count(),
            "results": ceiling, "closed_over_pybreaker": ceiling_ratio(ceiling)}
        text.append(lambda: print_ceiling_table(ceiling, options.processes))
    if options.json:
        print(json.dumps(document, indent=2))
    else:
        print(f"distbreaker {document['distbreaker']}, python {document['python']}")
        for show in text:
            show()
    return 0
