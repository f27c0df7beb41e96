"""Property test: random operation sequences through lua/breaker.lua against a
small pure-Python reference model of the fleet state machine.

Time: every script reply carries the server time it used (`now_ms`), and the
model is advanced to exactly that time before it predicts the reply, so the
model needs no clock of its own. On fakeredis the server clock (`TIME`, key
expiry, stream ids) is replaced by a fake clock that the sequence steps
explicitly (large, exact jumps: many examples, OPEN waits, leases, half-open
timeouts and whole TIME windows passing). On the real redis-server time steps
are short real sleeps against a config with tens-of-milliseconds waits, so the
same time-driven transitions happen there too, in fewer examples.

Every test runs against both forms of the script: the Function (FCALL, loaded by
the first call) and the EVAL form (the client is marked EVAL-only, as a server
without Functions or an ACL refusing FCALL would make it), and checks that the
form it names was the one that ran.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
import uuid
from collections import deque
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from distbreaker._runtime.keys import BreakerKeys
from distbreaker._runtime.scripts import FUNCTIONS, library, load_script, run_script
from distbreaker.breaker.config import BreakerConfig
from distbreaker.breaker.core import Reply, config_fingerprint, decode_reply
from tests.helpers.records import read_record
from tests.helpers.redis_stats import commands

SCRIPT = load_script("breaker")
FORMS = ("function", "eval")


def use_form(client: Any, form: str) -> Any:
    """Make `client` run the given form of the scripts (FUNCTIONS is per client object)."""
    if form == "eval":
        FUNCTIONS.give_up(client, "test: the EVAL form")
    return client


def fresh_fake(form: str) -> fakeredis.FakeStrictRedis:
    """A fakeredis client on a server of its own (no library loaded yet)."""
    return use_form(fakeredis.FakeStrictRedis(server=fakeredis.FakeServer()), form)


def assert_fake_ran(client: fakeredis.FakeStrictRedis, form: str) -> None:
    """The Function form loads the library on its first call; the EVAL form never does."""
    assert len(client.function_list(library().name)) == (1 if form == "function" else 0)


def assert_real_ran(client: redis.Redis, form: str) -> None:
    """Since the last CONFIG RESETSTAT only the given form's commands ran."""
    counts = commands(client)
    evals = counts.get("evalsha", 0) + counts.get("eval", 0)
    if form == "function":
        assert counts.get("fcall", 0) > 0 and evals == 0, counts
    else:
        assert counts.get("fcall", 0) == 0 and evals > 0, counts


# -- the reference model ------------------------------------------------------------


@dataclasses.dataclass
class Cfg:
    """The model's view of the wire config (integer milliseconds)."""

    count: bool
    size: int
    min_calls: int
    fth: float
    sth: float
    wait: int
    permitted: int
    max_half_open: int
    lease: int


@dataclasses.dataclass
class Expected:
    state: str
    wait_ms: int
    permitted: bool
    transitions: list[tuple[str, str]]
    calls: int
    failures: int
    slow: int
    total_ms: int
    rejected: int
    since_ms: int
    probes_in_flight: int


class Model:
    """Resilience4j's breaker, fleet-wide, written as plainly as possible.

    The window is kept in its naive form (a deque of the last N outcomes, or a
    dict of per-second buckets whose totals are summed on demand), so it checks
    the script's pre-aggregated ring and lazy bucket eviction independently.
    """

    def __init__(self, cfg: Cfg) -> None:
        self.cfg = cfg
        self.exists = False
        self.state = "CLOSED"
        self.since = 0
        self.open_until = 0
        self.ring: deque[tuple[int, int, int]] = deque(maxlen=cfg.size)
        self.buckets: dict[int, list[int]] = {}
        self.hp_issued = self.hp_done = self.hp_fail = self.hp_slow = 0
        self.probes: dict[str, int] = {}
        self.rejected = 0
        self.now = 0
        self.transitions: list[tuple[str, str]] = []
        self.history = 0

    # window ----------------------------------------------------------------------
    def totals(self) -> tuple[int, int, int, int]:
        if self.cfg.count:
            items = list(self.ring)
            return (len(items), sum(f for f, _, _ in items), sum(s for _, s, _ in items),
                    sum(m for _, _, m in items))
        sec = self.now // 1000
        live = [b for s, b in self.buckets.items() if sec - self.cfg.size < s <= sec]
        return tuple(sum(b[i] for b in live) for i in range(4))  # type: ignore[return-value]

    def clear_window(self) -> None:
        self.ring.clear()
        self.buckets.clear()

    def add(self, ok: int, fails: int, slows: int, ms: int) -> None:
        n = ok + fails
        if n <= 0:
            return
        if not self.cfg.count:
            b = self.buckets.setdefault(self.now // 1000, [0, 0, 0, 0])
            for i, v in enumerate((n, fails, slows, ms)):
                b[i] += v
            return
        per = ms // n
        for i in range(1, n + 1):  # failures and slow calls spread evenly over the batch
            f = i * fails // n - (i - 1) * fails // n
            s = i * slows // n - (i - 1) * slows // n
            self.ring.append((f, s, per + (ms - per * n if i == 1 else 0)))

    def exceeded(self, calls: int, fails: int, slows: int) -> bool:
        return fails * 100 >= self.cfg.fth * calls or slows * 100 >= self.cfg.sth * calls

    # state machine ------------------------------------------------------------------
    def transition(self, to: str) -> None:
        self.transitions.append((self.state, to))
        self.history += 1
        if to == "OPEN" and self.state != "HALF_OPEN":
            self.hp_done = self.hp_fail = self.hp_slow = 0
        self.state, self.since = to, self.now
        self.open_until = self.now + self.cfg.wait if to == "OPEN" else 0
        if to == "HALF_OPEN":
            self.hp_issued = self.hp_done = self.hp_fail = self.hp_slow = 0
            self.probes.clear()
        elif to != "OPEN":
            self.clear_window()
            self.probes.clear()

    def advance(self) -> None:
        if self.state == "OPEN" and self.now >= self.open_until:
            self.transition("HALF_OPEN")
        if self.state == "HALF_OPEN":
            if self.cfg.max_half_open > 0 and self.now >= self.since + self.cfg.max_half_open:
                self.transition("OPEN")
                return
            expired = [t for t, deadline in self.probes.items() if deadline <= self.now]
            for token in expired:
                del self.probes[token]
            self.hp_issued = max(0, self.hp_issued - len(expired))

    def begin(self, now: int, op: str) -> bool:
        """Start one script call at server time `now`; False: a read of a missing breaker."""
        self.now, self.transitions = now, []
        if not self.exists:
            if op == "state":
                return False
            self.exists, self.state, self.since = True, "CLOSED", now
        return True

    def acquire(self, now: int, token: str) -> Expected:
        self.begin(now, "acquire")
        self.advance()
        permitted = True
        if self.state in ("OPEN", "FORCED_OPEN"):
            permitted = False
        elif self.state == "HALF_OPEN":
            if self.hp_issued < self.cfg.permitted:
                self.probes[token] = now + self.cfg.lease
                self.hp_issued += 1
            else:
                permitted = False
        if not permitted:
            self.rejected += 1
        return self.reply(permitted)

    def record(self, now: int, token: str, ok: int, fails: int, slows: int, ms: int) -> Expected:
        self.begin(now, "record")
        self.advance()
        if self.state in ("CLOSED", "METRICS_ONLY"):
            self.add(ok, fails, slows, ms)
            calls, failed, slow, _ = self.totals()
            if (self.state == "CLOSED" and calls >= self.cfg.min_calls and calls > 0
                    and self.exceeded(calls, failed, slow)):
                self.transition("OPEN")
        elif self.state == "HALF_OPEN" and token in self.probes:
            del self.probes[token]
            if ok + fails == 0:
                self.hp_issued = max(0, self.hp_issued - 1)
            self.hp_done += ok + fails
            self.hp_fail += fails
            self.hp_slow += slows
            if self.hp_done >= self.cfg.permitted:
                if self.exceeded(self.hp_done, self.hp_fail, self.hp_slow):
                    self.transition("OPEN")
                else:
                    self.transition("CLOSED")
        return self.reply(True)

    def read(self, now: int) -> Expected:
        if not self.begin(now, "state"):
            return Expected("CLOSED", 0, True, [], 0, 0, 0, 0, 0, now, 0)
        self.advance()
        return self.reply(True)

    def set(self, now: int, target: str) -> Expected:
        self.begin(now, "set")
        self.advance()
        if target == "RESET":
            if self.state != "CLOSED":
                self.transition("CLOSED")
            else:
                if self.totals()[0] > 0:  # a reset that empties a window is audited
                    self.history += 1
                self.clear_window()
                self.probes.clear()
        elif target == "TRIP":
            if self.state == "OPEN":  # a restart of the wait: history, not a transition
                self.open_until = self.now + self.cfg.wait
                self.history += 1
            elif self.state not in ("FORCED_OPEN", "DISABLED"):
                self.transition("OPEN")
        elif self.state != target:
            self.transition(target)
        return self.reply(True)

    def reply(self, permitted: bool) -> Expected:
        wait = 0
        if self.state == "OPEN":
            wait = max(0, self.open_until - self.now)
        elif self.state == "HALF_OPEN" and not permitted and self.probes:
            wait = min(self.cfg.wait, max(0, min(self.probes.values()) - self.now))
        if self.state == "HALF_OPEN" or (self.state == "OPEN" and self.hp_done > 0):
            # an OPEN made by a half-open verdict keeps the probes' figures (Resilience4j)
            calls, failed, slow, total = self.hp_done, self.hp_fail, self.hp_slow, 0
            in_flight = len(self.probes) if self.state == "HALF_OPEN" else 0
        else:
            calls, failed, slow, total = self.totals()
            in_flight = 0
        return Expected(self.state, wait, permitted, self.transitions, calls, failed, slow,
                        total, self.rejected, self.since, in_flight)


# -- driving the script -----------------------------------------------------------------


class FakeClock:
    """Stands in for the `time` module inside fakeredis: `time()` is ours to step."""

    def __init__(self, start_ms: int) -> None:
        self.ms = start_ms  # integer, so that steps add up exactly

    def time(self) -> float:
        return self.ms / 1000

    def __getattr__(self, attr: str) -> Any:
        return getattr(time, attr)


_FAKEREDIS_TIME_USERS = ("fakeredis._socket._base", "fakeredis.commands_mixins.server_mixin",
                         "fakeredis._helpers", "fakeredis.model._stream")


@contextlib.contextmanager
def fake_server_time(start_ms: int) -> Iterator[FakeClock]:
    """Replace the clock of every fakeredis module that reads it (TIME, expiry, XADD ids)."""
    import importlib

    clock = FakeClock(start_ms)
    modules = [importlib.import_module(m) for m in _FAKEREDIS_TIME_USERS]
    saved = [m.time for m in modules]  # type: ignore[attr-defined]
    for module in modules:
        module.time = clock  # type: ignore[attr-defined]
    try:
        yield clock
    finally:
        for module, original in zip(modules, saved, strict=True):
            module.time = original  # type: ignore[attr-defined]


class Driver:
    """Runs one operation on the script and on the model and compares the replies."""

    def __init__(self, client: Any, config: BreakerConfig, step: Any) -> None:
        self.client = client
        self.name = f"prop-{uuid.uuid4().hex[:12]}"
        self.keys = BreakerKeys.build(self.name)
        self.wire = config.to_wire()
        self.step = step
        f = self.wire.split(";")
        self.model = Model(Cfg(count=f[1] == "C", size=int(f[2]), min_calls=int(f[3]),
                               fth=float(f[4]), sth=float(f[5]), wait=int(f[6]),
                               permitted=int(f[7]), max_half_open=int(f[8]),
                               lease=int(f[9])))
        self.tokens = itertools.count()
        self.held: list[str] = []  # probe tokens acquired and not yet recorded
        self.log: list[str] = []

    def run(self, op: str, *extra: Any) -> Reply:
        args = (op, config_fingerprint(self.wire), self.wire, self.name, self.keys.channel,
                *extra)
        raw = run_script(self.client, SCRIPT, self.keys.script_keys, args)
        reply = decode_reply(raw)
        if len(raw) == 3:
            # the short reply of a permitted acquire or record that changed nothing a
            # worker must know: what it leaves out is checked in the stored record instead
            assert op in ("record", "acquire") and reply.state.value in (
                "CLOSED", "HALF_OPEN", "METRICS_ONLY", "DISABLED"), raw
            stored = read_record(self.client, self.keys)
            half_open = reply.state.value == "HALF_OPEN"
            live = self.client.zcount(self.keys.probes, f"({reply.now_ms}", "+inf")
            reply = dataclasses.replace(
                reply, calls=stored["hp_done" if half_open else "calls"],
                failures=stored["hp_fail" if half_open else "failures"],
                slow=stored["hp_slow" if half_open else "slow"],
                total_ms=0 if half_open else stored["total_ms"], rejected=stored["rejected"],
                probes_in_flight=live if half_open else 0)
        return reply

    def check(self, what: str, got: Reply, want: Expected) -> None:
        self.log.append(f"{what} @{got.now_ms}: {got.state.value}")
        actual = Expected(got.state.value, got.wait_ms, got.permitted,
                          [(a.value, b.value) for a, b, _ in got.transitions], got.calls,
                          got.failures, got.slow, got.total_ms, got.rejected, got.since_ms,
                          got.probes_in_flight)
        assert actual == want, f"after {what}; history:\n" + "\n".join(self.log)
        assert not got.drift

    def apply(self, action: tuple[Any, ...]) -> None:
        kind = action[0]
        if kind == "advance":
            self.step(action[1])
            return
        if kind == "batch":
            ok, fails, slow_ok, slow_fail, ms = action[1:]
            calls = (ok, fails, slow_ok + slow_fail, ms)
            got = self.run("record", "", ok + slow_ok, fails + slow_fail, *calls[2:])
            self.check(f"batch{calls}", got, self.model.record(got.now_ms, "", ok + slow_ok,
                                                              fails + slow_fail, *calls[2:]))
        elif kind == "acquire":
            token = f"t{next(self.tokens)}"
            got = self.run("acquire", token)
            self.check("acquire", got, self.model.acquire(got.now_ms, token))
            if got.permitted and got.state.value == "HALF_OPEN":
                self.held.append(token)
        elif kind == "probe":
            if not self.held:
                return
            token = self.held.pop(action[1] % len(self.held))
            ok, fails, slow = {"success": (1, 0, 0), "failure": (0, 1, 0),
                               "slow": (1, 0, 1), "ignored": (0, 0, 0)}[action[2]]
            got = self.run("record", token, ok, fails, slow, 7 * (ok + fails))
            self.check(f"probe {action[2]}", got,
                       self.model.record(got.now_ms, token, ok, fails, slow, 7 * (ok + fails)))
        elif kind == "set":
            got = self.run("set", action[1], "prop", "")
            self.check(f"set {action[1]}", got, self.model.set(got.now_ms, action[1]))
        elif kind == "state":
            got = self.run("state")
            self.check("state", got, self.model.read(got.now_ms))

    def check_history(self) -> None:
        """Exactly one history entry per transition the model made (and per restart)."""
        assert self.client.xlen(self.keys.history) == self.model.history


def actions(max_step_ms: int, advance_weight: int = 3) -> st.SearchStrategy[tuple[Any, ...]]:
    """Weighted so that sequences trip, wait, probe and recover often; operator
    actions (some of which park the breaker in a special state) are rarer."""
    small = st.integers(0, 4)
    batch = st.tuples(st.just("batch"), small, small, st.integers(0, 2), st.integers(0, 2),
                      st.integers(0, 500))
    acquire = st.tuples(st.just("acquire"))
    probe = st.tuples(st.just("probe"), st.integers(0, 9),
                      st.sampled_from(["success", "success", "failure", "slow", "ignored"]))
    advance = st.tuples(st.just("advance"), st.one_of(st.integers(0, max_step_ms // 4),
                                                      st.integers(0, max_step_ms)))
    state = st.tuples(st.just("state"))
    operator = st.tuples(st.just("set"), st.sampled_from(
        ["RESET", "RESET", "RESET", "TRIP", "TRIP", "CLOSED", "CLOSED", "FORCED_OPEN",
         "DISABLED", "METRICS_ONLY"]))
    return st.one_of(batch, batch, batch, acquire, acquire, acquire, probe, probe, probe,
                     *[advance] * advance_weight, state, operator)


def configs(time_scale_ms: int, time_window: bool) -> st.SearchStrategy[BreakerConfig]:
    """Small windows and thresholds so that every state is reached often."""
    s = time_scale_ms / 1000

    @st.composite
    def build(draw: Any) -> BreakerConfig:
        use_time = time_window and draw(st.booleans())
        return BreakerConfig(
            sliding_window_type="TIME_BASED" if use_time else "COUNT_BASED",
            sliding_window_size=draw(st.integers(1, 4 if use_time else 8)),
            minimum_number_of_calls=draw(st.integers(1, 8)),
            failure_rate_threshold=draw(st.sampled_from([25, 50, 100, 33.3])),
            slow_call_rate_threshold=draw(st.sampled_from([50, 100, 66.6])),
            wait_duration_in_open_state=s * draw(st.integers(1, 4)),
            permitted_calls_in_half_open=draw(st.integers(1, 3)),
            max_wait_in_half_open=s * draw(st.sampled_from([0, 0, 3, 6])),
            half_open_lease=s * draw(st.integers(1, 5)),
            key_ttl=3600,
        )

    return build()


# -- fakeredis: controlled server time, many examples ----------------------------------------

FAKE_START = 1_700_000_000_000  # ms


@pytest.mark.parametrize("form", FORMS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(250, time_window=True),
       ops=st.lists(actions(max_step_ms=2500), min_size=25, max_size=60))
def test_script_matches_model_with_controlled_time(form: str, config: BreakerConfig,
                                                   ops: list[tuple[Any, ...]]) -> None:
    with fake_server_time(FAKE_START) as clock:
        client = fresh_fake(form)

        def step(ms: int) -> None:
            clock.ms += ms

        driver = Driver(client, config, step)
        for action in ops:
            driver.apply(action)
        got = driver.run("state")
        assert got.now_ms == clock.ms  # the script really saw our clock
        driver.check("final state", got, driver.model.read(got.now_ms))
        driver.check_history()
        assert_fake_ran(client, form)


@pytest.mark.parametrize("form", FORMS)
def test_fake_clock_drives_the_script_time(form: str) -> None:
    """The patch reaches TIME inside Lua: a 90 s jump moves OPEN to HALF_OPEN."""
    config = BreakerConfig(wait_duration_in_open_state=60, minimum_number_of_calls=1)
    with fake_server_time(FAKE_START) as clock:
        client = fresh_fake(form)
        driver = Driver(client, config, None)
        assert driver.run("set", "TRIP", "t", "").state.value == "OPEN"
        assert driver.run("state").now_ms == FAKE_START
        clock.ms += 90_000
        got = driver.run("state")
        assert got.now_ms == FAKE_START + 90_000 and got.state.value == "HALF_OPEN"
        assert_fake_ran(client, form)


# -- the real redis-server: real (short) time steps ----------------------------------------

_REAL: dict[str, Any] = {}


@pytest.fixture(params=FORMS)
def form(request: pytest.FixtureRequest) -> str:
    """Which form of the script the real-server tests run."""
    return str(request.param)


@pytest.fixture
def real_client(redis_client: redis.Redis, form: str) -> Iterator[redis.Redis]:
    _REAL["client"] = use_form(redis_client, form)
    yield redis_client
    _REAL.clear()


REAL_CONFIG = BreakerConfig(sliding_window_size=4, minimum_number_of_calls=2,
                            wait_duration_in_open_state=0.03, permitted_calls_in_half_open=2,
                            half_open_lease=0.05, max_wait_in_half_open=0.2, key_ttl=60)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(config=configs(20, time_window=False),
       ops=st.lists(actions(max_step_ms=80, advance_weight=5), min_size=15, max_size=30))
@example(config=REAL_CONFIG, ops=[  # trip, wait, probes: one lease expires, then recovery
    ("batch", 0, 2, 0, 0, 10), ("acquire",), ("advance", 40), ("acquire",), ("acquire",),
    ("acquire",), ("probe", 0, "success"), ("advance", 60), ("acquire",), ("acquire",),
    ("probe", 0, "ignored"), ("acquire",), ("probe", 0, "slow"), ("probe", 0, "success"),
    ("batch", 3, 0, 0, 0, 30), ("state",)])
@example(config=REAL_CONFIG, ops=[  # failed probes re-open; half-open times out
    ("set", "TRIP"), ("advance", 40), ("acquire",), ("acquire",), ("probe", 0, "failure"),
    ("probe", 0, "success"), ("advance", 40), ("acquire",), ("advance", 210), ("state",),
    ("set", "FORCED_OPEN"), ("acquire",), ("set", "RESET"), ("batch", 1, 1, 1, 0, 70)])
def test_script_matches_model_on_real_redis(real_client: redis.Redis, form: str,
                                            config: BreakerConfig,
                                            ops: list[tuple[Any, ...]]) -> None:
    """Same property on the real server; time advances by real sleeps of up to 80 ms.

    Waits and leases are 20-100 ms here so they do elapse within a sequence. TIME
    windows (whole seconds) are left to the fakeredis run and to
    test_breaker_semantics; the model still uses the server's own `now_ms`.
    """
    real_client.config_resetstat()
    driver = Driver(real_client, config, lambda ms: time.sleep(ms / 1000))
    for action in ops:
        driver.apply(action)
    got = driver.run("state")
    driver.check("final state", got, driver.model.read(got.now_ms))
    driver.check_history()
    assert_real_ran(real_client, form)


def test_real_redis_time_window_sequence(real_client: redis.Redis, form: str) -> None:
    """One deterministic TIME_BASED sequence on the real server, checked against the model.

    Buckets are whole seconds, so the sequence is aligned just after a second
    boundary of the server clock; it takes about 1.3 s. It opens the breaker only
    when its first batch lands in one server second and the two later ones in the
    next: on a loaded machine a step may slip past a boundary, and then (the model
    still checked at every step) the sequence is run again on a fresh breaker.
    """
    config = BreakerConfig(sliding_window_type="TIME_BASED", sliding_window_size=1,
                           minimum_number_of_calls=3, failure_rate_threshold=50)
    real_client.config_resetstat()
    seconds: list[list[int]] = []
    for _ in range(10):
        driver = Driver(real_client, config, lambda ms: time.sleep(ms / 1000))
        _, usec = real_client.time()
        time.sleep(max(0.0, 1 - usec / 1e6) + 0.01)  # just after a server second boundary
        for action in [("batch", 1, 1, 0, 0, 10), ("state",), ("advance", 1000),
                       ("batch", 1, 1, 0, 0, 10), ("batch", 0, 1, 0, 0, 5), ("state",)]:
            driver.apply(action)
        batches = [int(entry.split("@")[1].split(":")[0]) // 1000
                   for entry in driver.log if entry.startswith("batch")]
        seconds.append(batches)
        if batches[1] == batches[2] == batches[0] + 1:
            break
    assert batches[1] == batches[2] == batches[0] + 1, seconds
    assert driver.model.state == "OPEN"
    assert_real_ran(real_client, form)
