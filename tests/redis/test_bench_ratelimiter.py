"""scripts/bench_ratelimiter.py's drivers, without valgrind: both implementations grant,
weigh and refuse as each scenario says, against a real redis-server. No timing or
instruction count is asserted (the bench reports them)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest
import redis

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("bench_ratelimiter")


def test_each_scenario_grants_weighs_and_refuses_as_named(bench: ModuleType,
                                                          redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    table = bench.make_calls(client, redis_url, "t", limit=1000, weight=10)
    for (impl, scenario), (call, permits) in table.items():
        answer = call()  # distbreaker's acquire() returns None when granted, raises otherwise
        if scenario == "refused":
            assert answer is False, impl
        elif impl == "limits":
            assert answer is True, scenario
        assert permits == {"granted": 1, "weighted": 10, "refused": 0}[scenario]
    ours = client.hget("distbreaker:v2:{t-weighted}:rl", "permits")
    assert ours == b"10"
    assert client.llen(next(k for k in client.keys("LIMITS*weighted*"))) == 10


def test_the_bench_runs_without_callgrind(bench: ModuleType, redis_url: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--url", redis_url, "--no-cost", "--calls", "40", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {(r["scenario"], r["implementation"]) for r in doc["rows"]} == {
        (s, i) for s in bench.SCENARIOS for i in bench.IMPLEMENTATIONS}
    assert all(r["calls_per_s"] > 0 and r["instructions_per_permit"] is None
               for r in doc["rows"])
