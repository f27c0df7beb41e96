"""Fault injection without Redis: selectors, specs, the table's rolls and ends."""

from __future__ import annotations

import json

import pytest

from distbreaker._runtime.faults import (
    Fault,
    FaultTable,
    check_spec,
    parse_field,
    parse_flat,
    parse_rate,
    selector_pattern,
)
from distbreaker.errors import CallNotPermitted, InjectedFault, InjectedRejection
from distbreaker.inject import check_selector


@pytest.mark.parametrize(("selector", "name", "covers"), [
    ("llm:*", "llm:gpt", True), ("llm:*", "llm:", True), ("llm:*", "xllm:a", False),
    ("a?c", "abc", True), ("a?c", "abbc", False), ("pay.ments", "payXments", False),
    ("pay.ments", "pay.ments", True), ("[x]", "[x]", True), ("*", "anything", True),
    ("t:(1)+", "t:(1)+", True), ("%d", "%d", True),
])
def test_a_selector_covers_names_by_star_and_question_mark_only(selector: str, name: str,
                                                                  covers: bool) -> None:
    assert (selector_pattern(selector).match(name) is not None) is covers


def test_specs_and_rates_are_checked_and_name_the_option() -> None:
    assert check_spec("error", 0.05, status=503) == {"kind": "error", "rate": 0.05,
                                                     "status": 503}
    assert check_spec("latency", 1, latency=0.2)["latency_ms"] == 200
    for kind, rate, status, latency, word in [("boom", 1, None, None, "kind"),
                                              ("error", 0, 503, None, "rate"),
                                              ("error", 1.5, 503, None, "rate"),
                                              ("error", 1, 99, None, "status"),
                                              ("latency", 1, None, 0, "latency")]:
        with pytest.raises(ValueError, match=word):
            check_spec(kind, rate, status, latency)
    assert parse_rate("5%") == pytest.approx(0.05) and parse_rate("0.2") == 0.2
    with pytest.raises(ValueError):
        parse_rate("150%")
    with pytest.raises(ValueError):
        check_selector("has space*")


def spec(**fields: object) -> str:
    return json.dumps(fields)


def test_the_hash_fields_decode_and_foreign_ones_are_skipped() -> None:
    now, faults, allowed = parse_flat([
        1000, b"f:error:llm:*", f"61000 {spec(rate=0.5, status=502, actor='a', reason='r')}",
        "f:latency:x", f"2000 {spec(rate=1, latency_ms=250)}",
        "f:error:bad", "3000 not json", "f:weird:x", f"3000 {spec(rate=1)}",
        "a:llm:gpt", "31000"])
    assert now == 1000 and allowed == {"llm:gpt": 31000}
    assert faults == [Fault("llm:*", "error", 0.5, 61000, status=502, actor="a", reason="r"),
                      Fault("x", "latency", 1.0, 2000, latency=0.25)]
    assert parse_field("a:x", "1") is None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_table_rolls_each_injection_and_ends_it_on_the_local_clock() -> None:
    clock, rolls = Clock(), iter([0.01, 0.9, 0.01, 0.01, 0.01])
    table = FaultTable(clock=clock, rand=lambda: next(rolls))
    table.replace(now_ms=10_000, read_at=100.0, faults=[
        Fault("llm:*", "reject", 0.05, 12_000),
        Fault("llm:*", "error", 0.05, 70_000, status=503),
        Fault("llm:a", "latency", 1.0, 70_000, latency=0.2)])
    assert table.rejection("other") is None  # covers nothing: no roll spent
    assert table.rejection("llm:a") is not None  # 0.01 < 0.05
    assert table.disturbance("llm:a").error is None  # error roll 0.9 misses; latency hits
    clock.now = 102.5  # the rejection ended 2 s after the read
    assert table.rejection("llm:a") is None
    hit = table.disturbance("llm:a")
    assert hit.error is not None and hit.error.status == 503 and hit.latency == 0.2
    assert table.applied == {"reject": 1, "error": 1, "latency": 2}
    table.replace(now_ms=20_000, read_at=103.0, faults=[])
    assert table.disturbance("llm:a").error is None  # a fresh read replaces the cache


def test_injected_errors_say_what_they_are_and_pickle() -> None:
    import pickle

    fault = InjectedFault("llm:a", 503, "game day", "alice")
    assert fault.status_code == 503 and "injected" in str(fault) and "alice" in str(fault)
    again = pickle.loads(pickle.dumps(fault))
    assert (again.name, again.status_code, again.reason) == ("llm:a", 503, "game day")
    rejection = InjectedRejection("llm:a", "OPEN", 1.0, "fault injection: reject")
    assert isinstance(rejection, CallNotPermitted)
    assert isinstance(pickle.loads(pickle.dumps(rejection)), InjectedRejection)


def test_an_injected_latency_never_outlasts_its_injection_and_is_bounded() -> None:
    clock = Clock()
    table = FaultTable(clock=clock, rand=lambda: 0.0)
    table.replace(now_ms=10_000, read_at=100.0, faults=[
        Fault("slow", "latency", 1.0, 13_000, latency=600.0)])
    clock.now = 101.0
    assert table.disturbance("slow").latency == pytest.approx(2.0)  # until the end, no later
    with pytest.raises(ValueError, match="latency"):
        check_spec("latency", 1.0, latency=600.001)
    assert check_spec("latency", 1.0, latency=600)["latency_ms"] == 600_000
