"""scripts/bench_redis_cost.py's drivers, without valgrind: every scenario makes the
round trips its path promises against a real redis-server, so the measurement
cannot quietly drift to another path (a fallback, a stale OPEN view, a CLOSED
breaker where a probe was meant); the fleet ceiling's workers and bookkeeping
run too. No instruction count or timing is asserted."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

#: Round trips per call each scenario must make (DESIGN.md principle 8 and the paths).
ROUND_TRIPS = {
    "ping": 1, "empty_evalsha": 1, "pybreaker_closed": 2, "closed": 1, "closed_time": 1,
    "half_open": 2, "open": 0, "batched_closed_10": 0.1, "batched_closed_100": 0.01,
    "policy": 2, "bulkhead": 2, "adaptive_bulkhead": 2, "budget": 1, "ratelimiter": 1,
    "pool": 2, "pool_repick": 1,
    "closed_time_3600": 1,
    "closed_time_idle_3600": 1, "closed_time_idle_1800": 1, "closed_time_idle_3599": 1,
    "closed_time_idle_3600_no_ttl": 1, "closed_shadow_1": 1, "closed_shadow_3": 1,
    "closed_time_60_idle_3600": 1, "closed_time_60_idle_1800": 1, "closed_time_60_idle_30": 1,
    "closed_time_60_idle_59": 1,
    "batched_time_3600_idle_1800": 1,  # one flush per measured call (10 outcomes)
    "closed_recording": 1,  # the sample rides on the record's script call
    "policy_20_per_s": 2,
}


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    # On sys.path (not loaded by file): the fleet ceiling's spawned workers import it.
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("bench_redis_cost")


def test_every_scenario_makes_the_round_trips_of_its_path(bench: ModuleType,
                                                          redis_url: str) -> None:
    scenarios = bench.build_scenarios(redis_url, "cost", pacings=((20.0, 5),))
    results = bench.measure(scenarios, bench.NoMeter(), calls=100, batches=2, warm_up=10)
    trips = {m.key: m.round_trips_per_call() for m in results}
    # an OPEN breaker re-reads the fleet state once per revalidate_interval: on a loaded
    # machine one re-read can fall inside the 200 measured calls (0.005 a call)
    assert trips.pop("open") <= 1 / 100
    assert trips == pytest.approx({k: v for k, v in ROUND_TRIPS.items() if k != "open"})
    commands = {m.key: m.commands_per_call() for m in results}
    assert commands["ping"] == {"ping": 1.0}
    assert commands["pybreaker_closed"] == {"get": 1.0, "set": 1.0}
    # nothing but that one re-read (an FCALL), if it fell inside
    assert set(commands["open"]) <= {"fcall"} and sum(commands["open"].values()) <= 1 / 100
    for key in ("empty_evalsha", "closed", "closed_time", "budget", "closed_time_idle_1800",
                "ratelimiter"):
        assert set(commands[key]) <= {"evalsha", "fcall"}, key
        assert sum(commands[key].values()) == 1.0, key
    assert sum(commands["half_open"].values()) == 2.0  # the probe's acquire and its record
    assert all(m.batches == 2 and m.costs == [] for m in results)


def test_the_empty_script_carries_the_keys_and_arguments_of_the_closed_record(
        bench: ModuleType, redis_url: str) -> None:
    client = bench.counting_client(redis_url)
    wire = bench.record_wire(bench.exact_closed(client, "cost-wire"))
    empty = bench.empty_script(client, wire)
    assert bench.record_wire(empty)[2:] == wire[2:]  # numkeys, keys, args
    assert f"{wire[2]} keys" in empty.title


def test_the_half_open_scenario_probes_a_breaker_that_stays_half_open(
        bench: ModuleType, redis_url: str) -> None:
    from distbreaker import CircuitBreaker, State

    client = bench.counting_client(redis_url)
    scenario = bench.half_open_probe(client, "cost-half")
    bench.measure([scenario], bench.NoMeter(), calls=50, batches=2, warm_up=10)
    watcher = CircuitBreaker("cost-half", redis=redis_url,
                             permitted_calls_in_half_open=bench.HALF_OPEN_PROBES,
                             wait_duration_in_open_state=0.001)
    assert watcher.state is State.HALF_OPEN


def test_cost_rows_divide_by_calls_and_batches_and_relate_to_ping_and_pybreaker(
        bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    def measured(key: str, totals: list[int], script: int | None = None) -> object:
        return bench.Measured(key, key, calls=10, batches=len(totals),
                              costs=[bench.Cost(t, script) for t in totals], round_trips=20)

    rows = {r["key"]: r for r in bench.cost_rows([
        measured("ping", [1000, 1000]), measured("pybreaker_closed", [4000, 4000]),
        measured("closed", [99_000, 101_000], 90_000)])}
    closed = rows["closed"]
    assert closed["instructions_per_call"] == 10_000
    assert closed["in_script_per_call"] == 9_000
    assert closed["spread"] == pytest.approx(0.02)
    assert (closed["x_PING"], closed["x_pybreaker"]) == (100.0, 25.0)
    assert closed["round_trips_per_call"] == 1.0
    assert rows["ping"]["in_script_per_call"] is None
    bench.print_cost_table(list(rows.values()))
    assert "x pybreaker" in capsys.readouterr().out


def test_the_fleet_ceiling_counts_every_call_the_server_served(bench: ModuleType,
                                                               redis_url: str) -> None:
    rows = {r["key"]: r for r in bench.run_ceiling(redis_url, processes=2, seconds=0.6,
                                                   rounds=2)}
    assert set(rows) == {"ping", "pybreaker_closed", "closed"}
    assert all(r["calls"] > 0 for r in rows.values())
    # Calls and server figures cover the same calls: every call reached Redis.
    assert rows["ping"]["requests_per_call"] == 1.0
    assert rows["pybreaker_closed"]["requests_per_call"] == 2.0
    assert rows["closed"]["requests_per_call"] == 1.0
