"""The fleet-wide pool on a real redis-server (lua/pool.lua). Tests taking `flavour` run
with the sync and the asyncio Pool; the rules themselves are in tests/unit/test_pool_core.py
(the same script on fakeredis)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis

import distbreaker.aio
from distbreaker import Pick, Pool
from distbreaker._runtime.keys import PoolKeys
from distbreaker.errors import SchemaError
from distbreaker.readside_pool import read_pool, scan_pools
from tests.helpers.cli import run
from tests.helpers.flavours import Flavour
from tests.helpers.waiting import wait_until

TEN = [f"m{i}" for i in range(10)]
SAFE = {"redis_timeout": 5.0}  # a busy CI machine must not fall back to local picks


def ejected(pool: Any) -> set[str]:
    return {m.member for m in pool.status().members if m.ejected}


def test_ejection_cap_and_uneject_are_fleet_wide(redis_url: str, name: str,
                                                 flavour: Flavour) -> None:
    a = flavour.pool(name, redis_url, members=TEN, consecutive_5xx=2,
                     max_ejection_percent=50, **SAFE)
    b = flavour.pool(name, redis_url, members=TEN, consecutive_5xx=2,
                     max_ejection_percent=50, **SAFE)
    a.pick(track=False)
    for member in TEN[:6]:  # 6 of 10 bad, the two workers taking turns
        a.record(member, status=500)
        b.record(member, status=503)
        b.record(member, status=500)
    assert len(ejected(a)) == 5  # the cap: 50 % of 10
    capped = (set(TEN[:6]) - ejected(a)).pop()
    picks = [b.pick(track=False).member for _ in range(60)]
    assert set(picks) <= set(TEN[6:]) | {capped} and capped in picks
    victim = sorted(ejected(a))[0]
    change = b.uneject(victim, actor="test")
    assert change.state == "healthy" and change.event == "unejected"
    assert victim not in ejected(a)
    assert [e["event"] for e in a.history(victim)][:2] == ["unejected", "ejected"]


def test_panic_then_probes_after_the_ejection_ends(redis_url: str, name: str,
                                                   flavour: Flavour) -> None:
    pool = flavour.pool(name, redis_url, members=["a", "b", "c"], consecutive_5xx=1,
                        max_ejection_percent=100, base_ejection_time=0.2, probe_calls=1,
                        **SAFE)
    pool.pick(track=False)
    pool.record("a", status=500)
    pool.record("b", ConnectionRefusedError())  # no response: local origin, a 5xx too
    assert {pool.pick(track=False).mode for _ in range(10)} == {"panic"}
    wait_until(lambda: all(m.state == "probing" for m in pool.status().members
                           if m.member in ("a", "b")), timeout=30)
    probe = pool.pick()
    assert probe.mode == "probe" and probe.member in ("a", "b")
    assert pool.record(probe, status=200).event == "recovered"
    status = pool.status()
    assert status.member(probe.member).state == "healthy" and not status.panic


def test_in_flight_counts_are_shared_and_leases_released(redis_url: str, name: str,
                                                         flavour: Flavour) -> None:
    a = flavour.pool(name, redis_url, members=["x", "y"], **SAFE)
    b = flavour.pool(name, redis_url, members=["x", "y"], **SAFE)
    held = [a.pick() for _ in range(4)] + [b.pick() for _ in range(4)]
    assert sorted(m.in_flight for m in a.status().members) == [4, 4]
    for pick in held:
        (a if pick in held[:4] else b).record(pick, status=200, duration=0.01)
    assert [m.in_flight for m in a.status().members] == [0, 0]
    client = redis.Redis.from_url(redis_url)
    assert client.zcard(PoolKeys.build(name).leases) == 0
    for key in PoolKeys.build(name).script_keys:
        assert client.pttl(key) > 0 or not client.exists(key)
    client.close()


def test_the_asyncio_pool_use_block_records_and_cancellation_releases(redis_url: str,
                                                                       name: str) -> None:
    async def main() -> None:
        pool = distbreaker.aio.Pool(name, redis_url, members=["x"], consecutive_5xx=1,
                                    max_ejection_percent=100, **SAFE)
        async with pool.use() as pick:
            assert pick.member == "x"
        with pytest.raises(ConnectionRefusedError):
            async with pool.use():
                raise ConnectionRefusedError()
        assert (await pool.status()).member("x").ejected
        await pool.uneject("x")

        async def slow() -> None:
            async with pool.use():
                await asyncio.sleep(30)
        task = asyncio.create_task(slow())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        member = (await pool.status()).member("x")
        assert member.in_flight == 0 and not member.ejected  # released, not a failure
        await pool.aclose()
    asyncio.run(main())


def test_the_sync_call_and_use_block(redis_url: str, name: str) -> None:
    pool = Pool(name, redis_url, members=["x", "y"], **SAFE)
    assert pool.call(lambda member, n: (member, n), 3)[1] == 3
    with pool.use() as pick:
        pick.status = 503
        pick.headers = {"Retry-After": "120"}
    member = pool.status().member(pick.member)
    assert member.ejected and member.why == "retry_after"
    pool.close()


@pytest.mark.keys_without_ttl("foreign data written by hand")
def test_foreign_data_is_a_schema_error_and_nothing_is_written(redis_url: str,
                                                               name: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = PoolKeys.build(name)
    client.set(keys.members, "not a hash")
    pool = Pool(name, redis_url, members=["x"], **SAFE)
    with pytest.raises(SchemaError):
        pool.status()
    with pytest.raises(SchemaError):
        pool.record("x", status=500)
    assert client.get(keys.members) == b"not a hash" and not client.exists(keys.leases)
    client.delete(keys.members)
    client.hset(keys.members, mapping={"v": "1", "m:x": "1 2 3"})
    with pytest.raises(SchemaError, match="corrupt member record"):
        pool.pick()
    client.delete(keys.members)
    client.close()
    pool.close()


def test_the_cli_lists_shows_ejects_and_unejects(redis_url: str, name: str) -> None:
    pool = Pool(name, redis_url, members=["a:80", "b:80", "c:80"], consecutive_5xx=1,
                max_ejection_percent=50, **SAFE)
    pool.pick(track=False)
    pool.record("a:80", status=502)
    client = redis.Redis.from_url(redis_url)
    assert scan_pools(client, "distbreaker") == [name]
    assert read_pool(client, "distbreaker", name).ejected == 1
    listed = json.loads(run(redis_url, "pool", "ls", "--json").output)
    assert listed == [{"pool": name, "members": 3, "ejected": 1, "probing": 0,
                       "in_flight": 0, "panic": False, "ejected_members": ["a:80"]}]
    shown = run(redis_url, "pool", "show", name)
    assert shown.exit_code == 0 and "consecutive_5xx" in shown.output
    ejected_now = run(redis_url, "pool", "eject", name, "b:80", "--for", "10m",
                      "--actor", "ops")
    assert ejected_now.exit_code == 0 and "b:80: ejected until" in ejected_now.output
    assert run(redis_url, "pool", "uneject", name, "a:80").exit_code == 0
    doc = json.loads(run(redis_url, "pool", "show", name, "--json").output)
    states = {row["member"]: (row["state"], row["why"]) for row in doc["rows"]}
    assert states["a:80"][0] == "healthy" and states["b:80"] == ("ejected", "operator")
    assert doc["events"][0]["event"] == "unejected"
    assert any(e["actor"] == "ops" for e in doc["events"])
    assert run(redis_url, "pool", "uneject", name, "zz").exit_code == 1
    assert run(redis_url, "pool", "show", "nope").exit_code == 1
    client.close()
    pool.close()


def test_every_key_gets_a_ttl_after_the_first_refresh(redis_url: str, name: str) -> None:
    pool = Pool(name, redis_url, members=["x"], consecutive_5xx=1, max_ejection_percent=100,
                **SAFE)
    for _ in range(3):  # leases zset and history stream come and go after the refresh
        pool.record(pool.pick(), status=200)
        held = pool.pick()
        pool.record(pool.pick(), status=500)
        pool.uneject("x")
        pool.record(held, status=200)
    pool.pick()  # a lease left out: its zset must expire too (the autouse sweep checks)
    pool.close()


def test_prometheus_pool_aggregates(redis_url: str, name: str) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from distbreaker.contrib.prometheus import PoolCollector

    pool = Pool(name, redis_url, members=["a", "b", "c", "d"], consecutive_5xx=1,
                max_ejection_percent=25, **SAFE)
    held = pool.pick()
    pool.record("a", status=500)
    pool.record("b", status=500)  # capped: one of four
    registry = CollectorRegistry()
    registry.register(PoolCollector(redis_url, per_member=True))
    text = generate_latest(registry).decode()
    for line in (f'distbreaker_pool_members{{pool="{name}"}} 4.0',
                 f'distbreaker_pool_ejected{{pool="{name}"}} 1.0',
                 f'distbreaker_pool_capped{{pool="{name}"}} 1.0',
                 f'distbreaker_pool_in_flight{{pool="{name}"}} 1.0',
                 f'distbreaker_pool_panic{{pool="{name}"}} 0.0',
                 f'distbreaker_pool_ejections_total{{pool="{name}"}} 1.0',
                 f'distbreaker_pool_member_state{{member="a",pool="{name}",state="ejected"}} 1.0',
                 "distbreaker_pool_up 1.0"):
        assert line in text, line
    pool.record(held, status=200)
    down = CollectorRegistry()
    down.register(PoolCollector("redis://127.0.0.1:1/0", timeout=0.2))
    assert "distbreaker_pool_up 0.0" in generate_latest(down).decode()
    pool.close()


@pytest.mark.keys_without_ttl("foreign data written by hand")
def test_a_foreign_leases_key_fails_a_pick_before_any_write(redis_url: str, name: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = PoolKeys.build(name)
    pool = Pool(name, redis_url, members=["x"], **SAFE)
    pool.pick(track=False)  # puts the members in
    client.set(keys.leases, "foreign")
    for attempt in (pool.pick, lambda: pool.record(Pick("x", "t0k3n"), status=200),
                    lambda: pool.record(Pick("x", "t0k3n"), status=500)):
        with pytest.raises(SchemaError, match="holds a string, expected a zset"):
            attempt()
    member = pool.status().member("x")
    assert member.in_flight == 0 and member.calls == 0
    client.delete(*keys.script_keys)
    client.close()
    pool.close()


@pytest.fixture
def server() -> Any:
    from tests.helpers.processes import private_redis_server
    yield from private_redis_server()


def test_redis_down_picks_go_on_locally_then_back_to_the_fleet(server: Any, name: str) -> None:
    """Principle 7: picks never fail on Redis; a member this process saw ejected is
    avoided meanwhile; when Redis is back (empty: restarted without persistence) the
    members are put back and picks are counted fleet-wide again."""
    pool = Pool(name, server.url, members=["a", "b", "c"], consecutive_5xx=1,
                max_ejection_percent=50, redis_timeout=0.5, redis_retry_max_backoff=0.2)
    pool.record(pool.pick(), status=200)
    assert pool.record("a", status=500).state == "ejected"
    server.kill()
    picks = [pool.pick() for _ in range(30)]
    assert {p.source for p in picks} == {"local"} and "a" not in {p.member for p in picks}
    assert pool.record(picks[0], status=500) is None  # dropped, not raised
    server.start()
    wait_until(lambda: pool.pick().source == "redis", timeout=30, interval=0.1,
               what="picks go back to Redis")
    assert sorted(pool.members()) == ["a", "b", "c"]
    pool.close()


def test_check_says_whether_redis_can_serve_the_pool(redis_url: str, name: str,
                                                     dead_redis_url: str) -> None:
    from distbreaker.errors import CheckFailed

    Pool(name, redis_url).check()
    with pytest.raises(CheckFailed):
        Pool(name, dead_redis_url, redis_timeout=0.5).check()
