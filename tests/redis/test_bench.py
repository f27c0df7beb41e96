"""scripts/bench.py's single-thread scenarios, run briefly against a real redis-server:
each makes the round trips its path promises (a rejection none, the raw FCALL and the
exact CLOSED record one each), so a row cannot quietly measure another path. No
timing is asserted."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("bench")


def test_every_row_makes_the_round_trips_of_its_path(bench: ModuleType, redis_url: str) -> None:
    scenarios = {s.key: s for s in bench.run(redis_url, seconds=1.0, calls=60, rounds=2)}
    trips = {key: s.result()["round_trips_per_call"] for key, s in scenarios.items()}
    # (counts are per process: a breaker's pub/sub thread may add a request to a row)
    for key in ("get", "raw_record", "closed"):
        assert trips[key] == pytest.approx(1.0, abs=0.05), key
    for key in ("open", "open_listener", "forced_open"):
        assert trips[key] == pytest.approx(0.0, abs=0.05), key
        assert scenarios[key].calls == 60 and scenarios[key].calls_per_cpu_second > 0
    assert scenarios["raw_record"].result()["server_commands"].get("fcall", 0) \
        == pytest.approx(1.0, abs=0.05)
    ratios = bench.ratios(list(scenarios.values()))
    assert "distbreaker OPEN / OPEN with 1 listener, per CPU-s" in ratios
    assert "distbreaker CLOSED / raw FCALL of its call, per CPU-s" in ratios


def test_the_latency_ratios_set_each_row_against_a_bare_get(bench: ModuleType,
                                                              redis_url: str) -> None:
    scenarios = bench.run(redis_url, seconds=1.0, calls=40, rounds=2)
    by = {s.key: s for s in scenarios}
    assert all(len(by[key].latencies) == 2 and by[key].p50_us() > 0
               for key in ("get", "raw_record", "closed", "pybreaker_closed"))
    ratios = bench.latency_ratios(scenarios)
    assert set(ratios) == set(bench.LATENCY_RATIOS)
    assert all(r["min"] <= r["max"] for r in ratios.values())
    assert bench.client_cpu_above_get(scenarios) is not None
