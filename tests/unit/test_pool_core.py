"""The pool's pure core (config, outcomes, replies) and its ejection rules: lua/pool.lua run
on the in-process fakeredis (``memory://``), one fresh server per test, no redis-server."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from distbreaker import NoPoolMember, Pool, PoolConfig
from distbreaker._runtime.classify import HttpStatusError
from distbreaker._runtime.connection import memory_client
from distbreaker._runtime.scripts import lua_dir
from distbreaker.pool.config import WIRE_FIELDS, normalize_members
from distbreaker.pool.core import (
    RECORD_FIELDS,
    decode_status,
    is_local_origin,
    outcome_of,
)
from tests.helpers.waiting import wait_until

TEN = [f"m{i}" for i in range(10)]


@pytest.fixture
def memory(request: pytest.FixtureRequest) -> str:
    return f"memory://pool-{request.node.nodeid}"


def make(memory: str, members: Any = TEN, **kw: Any) -> Pool:
    return Pool("p", memory, members=members, **kw)


def fail(pool: Pool, member: str, times: int, status: int = 500) -> list[Any]:
    return [pool.record(member, status=status, duration=0.01) for _ in range(times)]


def ok(pool: Pool, member: str, times: int, duration: float = 0.01) -> None:
    for _ in range(times):
        pool.record(member, status=200, duration=duration)


def ejected(pool: Pool) -> set[str]:
    return {m.member for m in pool.status().members if m.ejected}


# -- config, wire, outcomes (pure) ----------------------------------------------------------
def test_the_config_has_envoys_defaults_and_checks_fields() -> None:
    cfg = PoolConfig()
    assert (cfg.consecutive_5xx, cfg.max_ejection_percent, cfg.interval,
            cfg.base_ejection_time, cfg.max_ejection_time, cfg.success_rate_stdev_factor,
            cfg.enforcing_consecutive_gateway_failure, cfg.enforcing_failure_percentage,
            cfg.healthy_panic_threshold) == (5, 10, 10.0, 30.0, 300.0, 1.9, 0, 0, 50)
    assert PoolConfig(interval="250ms").interval == 0.25
    for bad in ({"max_ejection_percent": 101}, {"balance": "round_robin"},
                {"interval": 0}, {"probe_calls": 0}, {"members": ["a b"]},
                {"members": {"a": -1}}, {"success_rate_stdev_factor": float("nan")}):
        with pytest.raises(ValueError):
            PoolConfig(**bad)
    with pytest.raises(TypeError, match="unknown pool option"):
        Pool("p", "memory://x", consecutive_5xxx=3)


def test_members_take_names_pairs_or_a_mapping() -> None:
    assert normalize_members(["a", ("b", 3)]) == (("a", 1), ("b", 3))
    assert normalize_members({"a": 2}) == (("a", 2),)
    assert normalize_members("a") == (("a", 1),)


def test_the_wire_string_matches_the_script_and_the_doc() -> None:
    wire = PoolConfig().wire.split(",")
    assert len(wire) == len(WIRE_FIELDS)
    source = (lua_dir() / "pool.lua").read_text()
    assert f"local NCFG = {len(WIRE_FIELDS)}" in source
    assert f"local NREC = {len(RECORD_FIELDS)}" in source


def test_outcomes_are_envoys_classes() -> None:
    assert [outcome_of(status=s) for s in (200, 404, 429, 500, 502, 503, 504)] == \
        ["s", "s", "e", "e", "g", "g", "g"]
    assert outcome_of(error=ConnectionRefusedError()) == "l"
    assert outcome_of(error=TimeoutError()) == "l"
    assert outcome_of(error=ValueError("bad json")) == "e"
    assert outcome_of(error=HttpStatusError(503)) == "g"
    assert outcome_of(outcome="gateway") == "g"

    class ConnectTimeout(Exception):  # an httpx-like name
        pass
    assert is_local_origin(ConnectTimeout())
    with pytest.raises(ValueError):
        outcome_of(outcome="meh")


def test_a_status_reply_decodes_to_members() -> None:
    rec = " ".join(["1", "5000", *["0"] * 22])
    status = decode_status("p", [1000, 0, PoolConfig().wire, 0, 2, "a", rec, 3,
                                 "b", " ".join(["0", "0", "1"] + ["0"] * 21), 0])
    assert status.member("a").state == "ejected" and status.member("a").in_flight == 3
    assert status.member("a").ejected_until == 5.0
    assert status.ejected == 1 and not status.panic
    later = decode_status("p", [6000, 0, "", 0, 1, "a", rec, 0])
    assert later.member("a").state == "probing"  # its ejection ended


# -- ejection rules (the script, on fakeredis) ------------------------------------------------
def test_consecutive_5xx_eject_for_the_fleet(memory: str) -> None:
    a, b = make(memory, consecutive_5xx=3), make(memory, consecutive_5xx=3)
    a.pick(track=False)  # puts the members in
    a.record("m1", status=500)
    b.record("m1", status=503)           # two workers: one count
    change = a.record("m1", status=500)
    assert change is not None and change.event == "ejected" and change.why == "consecutive_5xx"
    assert ejected(b) == {"m1"}
    assert all(b.pick().member != "m1" for _ in range(50))


def test_a_success_resets_the_consecutive_count(memory: str) -> None:
    pool = make(memory, consecutive_5xx=3)
    pool.pick(track=False)  # puts the members in
    fail(pool, "m1", 2)
    ok(pool, "m1", 1)
    fail(pool, "m1", 2)
    assert ejected(pool) == set()


def test_gateway_failures_eject_only_when_enforced(memory: str) -> None:
    pool = make(memory, consecutive_5xx=0, consecutive_gateway_failure=2)
    pool.pick(track=False)  # puts the members in
    fail(pool, "m1", 4, status=502)
    assert ejected(pool) == set()  # Envoy's default: enforcing_consecutive_gateway_failure 0
    strict = make(memory + "2", consecutive_5xx=0, consecutive_gateway_failure=2,
                  enforcing_consecutive_gateway_failure=100)
    strict.pick(track=False)
    assert fail(strict, "m1", 2, status=504)[-1].why == "consecutive_gateway_failure"


def test_local_origin_failures_count_apart_when_split(memory: str) -> None:
    pool = make(memory, consecutive_5xx=0, consecutive_local_origin_failure=2,
                split_external_local_origin_errors=True)
    pool.pick(track=False)  # puts the members in
    pool.record("m1", ConnectionRefusedError())
    change = pool.record("m1", TimeoutError())
    assert change is not None and change.why == "consecutive_local_origin_failure"
    # not split: a local-origin failure is a gateway failure (and a 5xx)
    joined = make(memory + "2", consecutive_5xx=2)
    joined.pick(track=False)
    joined.record("m1", ConnectionRefusedError())
    assert joined.record("m1", ConnectionRefusedError()).why == "consecutive_5xx"


def test_max_ejection_percent_caps_ejections_and_the_rest_stay(memory: str) -> None:
    pool = make(memory, consecutive_5xx=2, max_ejection_percent=50)
    pool.pick(track=False)  # puts the members in
    events = Counter()
    for member in TEN[:6]:
        for change in fail(pool, member, 3):
            events[change.event] += 1
    assert len(ejected(pool)) == 5 and events["ejected"] == 5 and events["capped"] >= 1
    history = pool.history()
    assert sum(e["event"] == "capped" for e in history) == 1  # once per crossing


def test_at_least_one_member_may_be_ejected(memory: str) -> None:
    pool = make(memory, members=["a", "b"], consecutive_5xx=1, max_ejection_percent=10)
    pool.pick(track=False)  # puts the members in
    assert pool.record("a", status=500).event == "ejected"
    assert pool.record("b", status=500).event == "capped"


def test_panic_routes_to_every_member(memory: str) -> None:
    pool = make(memory, members=["a", "b", "c", "d"], consecutive_5xx=1,
                max_ejection_percent=100, healthy_panic_threshold=50)
    pool.pick(track=False)  # puts the members in
    pool.record("a", status=500)
    picks = [pool.pick(track=False) for _ in range(40)]
    assert {p.mode for p in picks} == {"normal"} and "a" not in {p.member for p in picks}
    pool.record("b", status=500)
    pool.record("c", status=500)  # 1 of 4 healthy: panic
    picks = [pool.pick(track=False) for _ in range(80)]
    assert {p.mode for p in picks} == {"panic"}
    assert {p.member for p in picks} == {"a", "b", "c", "d"}
    assert pool.status().panic


def test_an_ejection_ends_in_probes_then_health(memory: str) -> None:
    pool = make(memory, members=["a", "b", "c"], consecutive_5xx=1, max_ejection_percent=50,
                base_ejection_time=0.05, probe_calls=2)
    pool.pick(track=False)  # puts the members in
    pool.record("a", status=500)
    wait_until(lambda: pool.status().member("a").state == "probing", timeout=10)
    first, second = pool.pick(), pool.pick()
    assert (first.member, first.mode, second.member, second.mode) == ("a", "probe", "a", "probe")
    third = pool.pick()
    assert third.member != "a"  # two probes out: no third
    assert pool.record(first, status=200).event == "probing"
    assert pool.record(second, status=200).event == "recovered"
    pool.record(third, status=200)
    assert pool.status().member("a").state == "healthy"


def test_a_failed_probe_ejects_again_for_longer(memory: str) -> None:
    pool = make(memory, members=["a", "b", "c"], consecutive_5xx=1, max_ejection_percent=50,
                base_ejection_time=0.05, max_ejection_time=10)
    pool.pick(track=False)  # puts the members in
    first = pool.record("a", status=500)
    wait_until(lambda: pool.status().member("a").state == "probing", timeout=10)
    probe = pool.pick()
    again = pool.record(probe, status=500)
    assert again.event == "ejected" and again.why == "probe_failed"
    member = pool.status().member("a")
    assert member.multiplier == 2 and member.ejections == 2
    assert first.ejected_until is not None and again.ejected_until is not None
    # the second ejection lasts base x 2
    assert again.ejected_until - (member.last_ejected_at or 0) == pytest.approx(0.1, abs=0.002)


def test_ejection_time_is_capped_by_max_ejection_time(memory: str) -> None:
    pool = make(memory, members=["a", "b", "c"], consecutive_5xx=1, max_ejection_percent=50,
                base_ejection_time=0.05, max_ejection_time=0.08)
    pool.pick(track=False)  # puts the members in
    assert pool.record("a", status=500).event == "ejected"
    for _ in range(3):
        wait_until(lambda: pool.status().member("a").state == "probing", timeout=10)
        change = pool.record("a", status=500)  # the probe fails: ejected again, longer
        assert change.event == "ejected" and change.why == "probe_failed"
    member = pool.status().member("a")
    assert member.ejected_until is not None and member.last_ejected_at is not None
    assert member.ejected_until - member.last_ejected_at <= 0.0801


def test_retry_after_ejects_for_that_long(memory: str) -> None:
    pool = make(memory)
    pick = pool.pick()
    change = pool.record(pick, status=429, headers={"Retry-After": "30"})
    assert change.event == "ejected" and change.why == "retry_after"
    left = pool.status().member(pick.member).ejected_until - time.time()
    assert 20 < left <= 31


def rounds_until(pool: Pool, one_round: Any, done: Any) -> None:
    """Repeat `one_round` (a batch of records) until `done()`: a round cut in two by an
    interval's close (a loaded machine) is followed by one that is not."""
    def attempt() -> bool:
        one_round()
        return bool(done())
    wait_until(attempt, timeout=20, interval=0.3)


def test_success_rate_outliers_are_ejected_when_the_interval_closes(memory: str) -> None:
    pool = make(memory, consecutive_5xx=0, interval=0.25, success_rate_request_volume=20,
                max_ejection_percent=30)
    pool.pick(track=False)  # puts the members in

    def one_round() -> None:
        for member in TEN:
            for i in range(20):
                pool.record(member, status=500 if member == "m3" and i % 2 else 200)
    rounds_until(pool, one_round, lambda: ejected(pool))
    assert ejected(pool) == {"m3"}
    assert pool.status().member("m3").why == "success_rate"


def test_failure_percentage_needs_enforcing(memory: str) -> None:
    pool = make(memory, consecutive_5xx=0, enforcing_success_rate=0, interval=0.25,
                failure_percentage_request_volume=10, enforcing_failure_percentage=100,
                failure_percentage_threshold=50)
    pool.pick(track=False)  # puts the members in

    def one_round() -> None:
        for member in TEN:
            for i in range(10):
                pool.record(member, status=500 if member in ("m1", "m2") and i < 6 else 200)
    rounds_until(pool, one_round, lambda: ejected(pool))
    assert ejected(pool) == {"m1"}  # 10 % of 10 members: one; the worst first (a tie: by name)
    assert pool.status().member("m1").why == "failure_percentage"


def test_latency_outliers_are_ejected(memory: str) -> None:
    pool = make(memory, consecutive_5xx=0, interval=0.25, latency_request_volume=10,
                latency_factor=3, latency_threshold=0.05, max_ejection_percent=20)
    pool.pick(track=False)  # puts the members in

    def one_round() -> None:
        for member in TEN:
            ok(pool, member, 10, duration=0.5 if member == "m7" else 0.02)
    rounds_until(pool, one_round, lambda: ejected(pool))
    assert ejected(pool) == {"m7"}
    assert pool.status().member("m7").why == "latency"


def test_operators_eject_beyond_the_cap_and_uneject(memory: str) -> None:
    pool = make(memory, members=["a", "b"], consecutive_5xx=1, max_ejection_percent=10)
    pool.pick(track=False)  # puts the members in
    pool.record("a", status=500)
    change = pool.eject("b", 60, actor="ops")
    assert change.event == "ejected" and change.why == "operator"
    assert ejected(pool) == {"a", "b"}
    assert pool.uneject("a", actor="ops").state == "healthy"
    member = pool.status().member("a")
    assert member.multiplier == 0 and not member.ejected
    history = pool.history("a")
    assert [e["event"] for e in history] == ["unejected", "ejected"]
    assert history[0]["actor"] == "ops"


# -- picking -----------------------------------------------------------------------------------
def test_pick_prefers_the_member_with_fewer_calls_in_flight(memory: str) -> None:
    pool = make(memory, members=["a", "b"])
    held = [pool.pick() for _ in range(20)]
    counts = Counter(p.member for p in held)
    assert abs(counts["a"] - counts["b"]) <= 1  # two members: p2c always compares both
    assert {m.member: m.in_flight for m in pool.status().members} == dict(counts)
    for pick in held:
        pool.record(pick, status=200)
    assert {m.in_flight for m in pool.status().members} == {0}


def test_weights_share_the_picks(memory: str) -> None:
    pool = make(memory, members={"a": 3, "b": 1, "c": 0}, balance="random")
    counts = Counter(pool.pick(track=False).member for _ in range(400))
    assert counts["c"] == 0 and counts["a"] > 2 * counts["b"] > 0


def test_a_sticky_key_keeps_its_member_and_moves_only_when_it_leaves(memory: str) -> None:
    pool = make(memory, consecutive_5xx=1, max_ejection_percent=50)
    first = {k: pool.pick(key=k, track=False).member for k in range(50)}
    assert len(set(first.values())) > 3
    assert first == {k: pool.pick(key=k, track=False).member for k in range(50)}
    pool.record("m2", status=500)
    after = {k: pool.pick(key=k, track=False).member for k in range(50)}
    moved = {k for k in first if first[k] != after[k]}
    assert moved == {k for k in first if first[k] == "m2"}


def test_avoid_skips_members_unless_nothing_is_left(memory: str) -> None:
    pool = make(memory, members=["a", "b"])
    assert {pool.pick(avoid=["a"], track=False).member for _ in range(20)} == {"b"}
    assert pool.pick(avoid=["a", "b"], track=False).member in ("a", "b")


def test_members_change_at_run_time_for_the_fleet(memory: str) -> None:
    a, b = make(memory, members=["x", "y"]), make(memory, members=["x", "y"])
    a.pick(track=False)
    assert a.set_members({"y": 2, "z": 1}) == 2
    assert b.members() == ["y", "z"]
    assert {b.pick(track=False).member for _ in range(40)} == {"y", "z"}
    assert a.add_members(["w"]) == 3 and a.remove_members(["y"]) == 2
    assert sorted(b.members()) == ["w", "z"]


def test_a_pool_without_members_says_so(memory: str) -> None:
    with pytest.raises(NoPoolMember):
        Pool("empty", memory).pick()


def test_the_members_come_back_when_the_keys_expired(memory: str) -> None:
    pool = make(memory, members=["a", "b"])
    pool.pick(track=False)  # puts the members in
    pool.reset()
    assert pool.pick().member in ("a", "b")


def test_the_local_pick_avoids_members_seen_ejected() -> None:
    pool = Pool("p", "redis://127.0.0.1:1/0", members=["a", "b"], redis_timeout=0.05)
    pool.note_change(pool_change("a"))
    picks = {pool.pick().member for _ in range(20)}
    assert picks == {"b"} and pool.local_fallback_active
    assert pool.record(pool.pick(), status=500) is None  # dropped
    pool.close()


def pool_change(member: str) -> Any:
    from distbreaker import MemberChange
    return MemberChange(member, "ejected", time.time() + 60, "operator", "ejected")


def test_the_registry_builds_pools_from_a_pools_section(memory: str) -> None:
    from distbreaker import Registry

    registry = Registry.from_dict({
        "redis": memory,
        "pools": {"configs": {"default": {"max_ejection_percent": 50}},
                  "instances": {"hosts": {"members": ["a:80", "b:80"],
                                          "consecutive_5xx": "2", "interval": "5s"}}}},
        environ={"DISTBREAKER_POOL_HOSTS_PROBE_CALLS": "4"})
    pool = registry.pool("hosts")
    assert pool is registry.pool("hosts")
    cfg = pool.config
    assert (cfg.max_ejection_percent, cfg.consecutive_5xx, cfg.interval, cfg.probe_calls) == \
        (50, 2, 5.0, 4)
    assert pool.pick().member in ("a:80", "b:80")
    assert registry.health().ready  # a pool never fails readiness
    registry.close()


def test_an_exempt_member_is_never_ejected_by_the_rules(memory: str) -> None:
    pool = make(memory, members=["a", "b"], consecutive_5xx=1, max_ejection_percent=100)
    pool.pick(track=False)  # puts the members in
    pool.record("a", status=500)
    assert pool.exempt("a", actor="ops").event == "exempted"
    assert not pool.status().member("a").ejected
    fail(pool, "a", 5)
    member = pool.status().member("a")
    assert not member.ejected and member.override == "exempt"
    assert pool.eject("a", 60).state == "ejected"  # an operator still can
    pool.uneject("a")
    assert pool.record("a", status=500).event == "ejected"  # the rules again


def test_every_key_of_a_pool_is_in_one_cluster_slot() -> None:
    from redis.crc import key_slot

    from distbreaker._runtime.keys import PoolKeys

    for name in ("payments", "a:b{c}", "llm/gpt-4o"):
        keys = PoolKeys.build(name).script_keys
        assert len({key_slot(k.encode()) for k in keys}) == 1
        assert key_slot(keys[0].encode()) == key_slot(("{" + name + "}").encode())


def test_listeners_hear_what_this_process_did_to_members(memory: str) -> None:
    pool = make(memory, members=["a", "b"], consecutive_5xx=1, max_ejection_percent=50)
    heard: list[tuple[str, Any, str]] = []
    pool.add_listener(lambda e: heard.append((e.kind, e.state, e.reason)))
    pool.pick(track=False)  # puts the members in
    pool.record("a", status=500)
    pool.record("b", status=500)
    pool.uneject("a")
    assert heard == [("ejected", "a", "consecutive_5xx"), ("capped", "b", "consecutive_5xx"),
                     ("unejected", "a", "consecutive_5xx")]


def test_repick_records_the_attempt_and_picks_another_member_in_one_call(memory: str) -> None:
    pool = make(memory, members=["a", "b"], consecutive_5xx=1, max_ejection_percent=50)
    first = pool.pick()
    heard: list[str] = []
    pool.add_listener(lambda e: heard.append(f"{e.kind}:{e.state}"))
    second = pool.repick(first, status=503)
    assert second.member != first.member and heard == [f"ejected:{first.member}"]
    third = pool.repick(second, status=200)
    assert third.member == second.member  # the other one is ejected: nothing else left
    pool.record(third, status=200)
    assert {m.member: m.in_flight for m in pool.status().members} == {"a": 0, "b": 0}
    with pytest.raises(ValueError, match="already recorded"):
        pool.repick(first)


def test_a_member_slow_at_its_percentile_is_ejected_when_the_pool_is_not(memory: str) -> None:
    # p90: 20 % of m7's calls take 300 ms, above the pool's threshold (3 x 20 ms), while the
    # median member has none: its 90th percentile is an outlier. The first intervals only
    # set the threshold; the rounds after it eject.
    pool = make(memory, consecutive_5xx=0, interval=0.25, latency_request_volume=10,
                latency_factor=3, latency_threshold=0.05, latency_percentile=90,
                max_ejection_percent=20)
    pool.pick(track=False)  # puts the members in

    def normal_round() -> None:
        for member in TEN:
            ok(pool, member, 10, duration=0.02)

    def bad_round() -> None:
        for member in TEN:
            for i in range(10):
                slow = member == "m7" and i < 2
                pool.record(member, status=200, duration=0.3 if slow else 0.02)

    client = memory_client(memory)  # the in-memory server: the threshold the script stored
    rounds_until(pool, normal_round, lambda: client.hget(pool.keys.members, "lt") == b"60")
    rounds_until(pool, bad_round, lambda: ejected(pool))
    assert ejected(pool) == {"m7"} and pool.status().member("m7").why == "latency"


def test_a_pool_that_slows_down_as_a_whole_ejects_nobody(memory: str) -> None:
    pool = make(memory, consecutive_5xx=0, interval=0.25, latency_request_volume=10,
                latency_factor=3, latency_threshold=0.05, max_ejection_percent=50)
    pool.pick(track=False)  # puts the members in
    client = memory_client(memory)

    def round_at(duration: float) -> Any:
        return lambda: [ok(pool, member, 10, duration=duration) for member in TEN]
    rounds_until(pool, round_at(0.02), lambda: client.hget(pool.keys.members, "lt") == b"60")
    # The whole pool slows down at once: no interval may hold both speeds (a loaded machine
    # would otherwise end the last fast round's interval among slow records), so the slow
    # rounds start after a quiet interval.
    time.sleep(0.4)
    rounds_until(pool, round_at(0.5), lambda: client.hget(pool.keys.members, "lt") == b"1500")
    assert ejected(pool) == set()


def test_latency_balance_prefers_the_faster_member(memory: str) -> None:
    pool = make(memory, members=["a", "b"], balance="latency", consecutive_5xx=0)
    pool.pick(track=False)  # puts the members in
    ok(pool, "a", 3, duration=0.1)
    ok(pool, "b", 3, duration=0.01)
    assert {pool.pick(track=False).member for _ in range(20)} == {"b"}
    raw = memory_client(memory).hget(pool.keys.members, "m:a").decode()
    assert raw.startswith("0 0000000000000 0000001 0000000 ")  # the fixed-width prefix


def test_an_exemption_for_a_while_ends_by_itself(memory: str) -> None:
    pool = make(memory, members=["a", "b"], consecutive_5xx=1, max_ejection_percent=50)
    pool.pick(track=False)  # puts the members in
    assert pool.exempt("a", 3600).event == "exempted"  # (in force: the test above)
    assert pool.status().member("a").override == "exempt"
    pool.exempt("a", 0.01)
    wait_until(lambda: pool.status().member("a").override == "", timeout=10)
    assert pool.record("a", status=500).event == "ejected"  # the rules again
