"""The scripts' hot paths give the general path's result (docs/KEY_SCHEMA.md, "The hot
paths", "The usual record"), against a real redis-server.

Differential: one state is saved (DUMP), the call runs on its hot path, the state is put
back (RESTORE) and the same call runs again forced through the general path by an input
that the general path reads as the same thing but the hot path does not take (a stored
`waiters` of "00", an outcome on a fixed-limit release, "01" for one success); the
replies and the keys left behind must agree, except where the docs allow a difference:
the hot reply's shape, when expired bulkhead leases are reaped, and `limit` not written
by a hot release. (The retry budget, layout 2, has one path: its test says what a
deposit within the slice writes.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from distbreaker import CircuitBreaker
from distbreaker._runtime.scripts import load_script, run_script
from tests.helpers.budget_window import window

LIMIT, LEASE, TTL = 5, 30_000, 3_600_000


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


class Keys:
    """Save and restore a set of keys (value and TTL)."""

    def __init__(self, client: redis.Redis, keys: Sequence[str]) -> None:
        self.client, self.keys = client, list(keys)
        self.saved: dict[str, tuple[bytes, int]] = {}

    def save(self) -> None:
        self.saved = {}
        for key in self.keys:
            dumped = self.client.dump(key)
            if dumped is not None:
                self.saved[key] = (dumped, max(0, self.client.pttl(key)))

    def restore(self) -> None:
        self.client.delete(*self.keys)
        for key, (dumped, ttl) in self.saved.items():
            self.client.restore(key, ttl, dumped)


# -- bulkhead ---------------------------------------------------------------------------
def bulkhead(client: redis.Redis, keys: Sequence[str], *args: Any) -> Any:
    return run_script(client, load_script("bulkhead"), list(keys), [str(a) for a in args])


def bulkhead_state(client: redis.Redis, keys: Sequence[str], now: int) -> dict[str, Any]:
    """What the rules fix: the live leases (members), the counters (absent = 0), `limit`,
    whether meta exists, and that every key expires (not exactly when: the runs are ms
    apart)."""
    leases, meta = keys
    live = sorted(m for m, s in client.zrange(leases, 0, -1, withscores=True) if s > now)
    fields = client.hgetall(meta)
    counters = {f: int(fields.get(f, b"0")) for f in (b"rejected", b"acquired", b"lost")}
    return {"live": live, "counters": counters, "limit": fields.get(b"limit"),
            "meta": client.exists(meta),
            # every key that exists expires (a key without a TTL would never go)
            "expiring": all(client.pttl(k) > 0 for k in keys if client.exists(k)),
            "others": {f for f in fields if f not in (b"rejected", b"acquired", b"lost",
                                                      b"limit", b"ttl_until", b"waiters")}}


def ok_of(reply: Any) -> int:
    """The hot reply is the integer 1; the general one starts with ok."""
    return reply if isinstance(reply, int) else int(reply[0])


def bh_keys(name: str) -> tuple[str, str]:
    return (f"t:{{{name}}}:bh", f"t:{{{name}}}:bh:meta")


def compare_bulkhead(client: redis.Redis, keys: tuple[str, str], hot: list[Any],
                     general: list[Any], force: Callable[[], None],
                     allowed: Sequence[str] = ()) -> None:
    """The call `hot` on its hot path and `general` (forced by `force`) from the same
    state: the same ok and the same state, but for the `allowed` differences."""
    saved = Keys(client, keys)
    saved.save()
    now = server_ms(client)
    hot_reply = bulkhead(client, keys, *hot)
    hot_state = bulkhead_state(client, keys, now)
    saved.restore()
    force()
    general_reply = bulkhead(client, keys, *general)
    assert isinstance(general_reply, list)  # it did take the general path
    assert ok_of(hot_reply) == ok_of(general_reply)
    general_state = bulkhead_state(client, keys, now)
    for field in allowed:
        hot_state.pop(field), general_state.pop(field)
    assert hot_state == general_state


def other_leases(client: redis.Redis, keys: tuple[str, str], count: int, offset: int) -> None:
    """`count` leases of other holders, each ending `offset` ms from now."""
    now = server_ms(client)
    client.zadd(keys[0], {f"other-{i}": now + offset for i in range(count)})
    client.pexpire(keys[0], TTL)


def own_lease(client: redis.Redis, keys: tuple[str, str], offset: int) -> None:
    """The token "tok" holds a lease ending `offset` ms from now."""
    client.zadd(keys[0], {"tok": server_ms(client) + offset})
    client.pexpire(keys[0], TTL)


SETUPS: dict[str, Callable[[redis.Redis, tuple[str, str]], None]] = {
    "no keys": lambda c, k: None,
    "two live leases": lambda c, k: other_leases(c, k, 2, 20_000),
    "only expired leases": lambda c, k: other_leases(c, k, 3, -5_000),
    "the token holds a live lease": lambda c, k: own_lease(c, k, 9_000),
    "the token holds an expired lease": lambda c, k: own_lease(c, k, -9),
    "full, the token among them": lambda c, k: (
        other_leases(c, k, LIMIT - 1, 20_000), own_lease(c, k, 9_000)),
    "full but for expired leases": lambda c, k: (
        other_leases(c, k, LIMIT - 1, 20_000), other_leases(c, k, 1, -1)),
}


def with_meta(fields: dict[str, Any]) -> Callable[[redis.Redis, tuple[str, str]], None]:
    def setup(client: redis.Redis, keys: tuple[str, str]) -> None:
        resolved = {f: (v(client) if callable(v) else v) for f, v in fields.items()}
        if not resolved:
            return
        client.hset(keys[1], mapping=resolved)
        client.pexpire(keys[1], TTL)
    return setup


META = {
    "no meta": {},
    "meta, TTL fresh": {"acquired": 7, "limit": LIMIT,
                        "ttl_until": lambda c: server_ms(c) + TTL - 1_000},
    "meta, TTL refresh due": {"acquired": 7, "limit": 3,
                              "ttl_until": lambda c: server_ms(c) + TTL // 2 - 1_000},
    "meta, TTL ends before the lease": {"acquired": 7, "limit": LIMIT,
                                        "ttl_until": lambda c: server_ms(c) + LEASE - 1},
}


@pytest.mark.parametrize("meta", list(META))
@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("share", ["", "600000"])
def test_the_hot_acquire_gives_the_general_acquire_s_result(
        setup: str, meta: str, share: str, name: str, redis_client: redis.Redis) -> None:
    keys = bh_keys(name)
    SETUPS[setup](redis_client, keys)
    with_meta(META[meta])(redis_client, keys)
    args = ["acquire", "tok", LIMIT, LEASE, TTL, 0, "", share]
    compare_bulkhead(redis_client, keys, args, args,
                     lambda: redis_client.hset(keys[1], "waiters", "00"))


@pytest.mark.parametrize("meta", list(META))
@pytest.mark.parametrize("setup", list(SETUPS))
def test_the_hot_release_gives_the_general_release_s_result(
        setup: str, meta: str, name: str, redis_client: redis.Redis) -> None:
    keys = bh_keys(name)
    SETUPS[setup](redis_client, keys)
    with_meta(META[meta])(redis_client, keys)
    base = ["release", "tok", LIMIT, LEASE, TTL]
    # a fixed limit ignores the outcome; reporting one takes the general path
    compare_bulkhead(redis_client, keys, base, [*base, 0, "", "ok", 5], lambda: None,
                     allowed=["limit", "meta"])  # a hot release writes no limit (documented)


def test_releasing_an_expired_lease_counts_it_lost(name: str,
                                                   redis_client: redis.Redis) -> None:
    """KEY_SCHEMA: `release` answers 0 (and `lost + 1`) when the lease had already
    expired, on the hot path too (an expired lease stays in the zset until it is reaped).
    """
    keys = bh_keys(name)
    assert bulkhead(redis_client, keys, "acquire", "tok", LIMIT, 50, TTL) == 1
    redis_client.zadd(keys[0], {"tok": server_ms(redis_client) - 1})  # its lease ended
    reply = bulkhead(redis_client, keys, "release", "tok", LIMIT, 50, TTL)
    assert ok_of(reply) == 0
    assert int(redis_client.hget(keys[1], "lost") or 0) == 1


@pytest.mark.parametrize("op", ["release", "cancel"])
def test_a_general_path_op_that_stores_the_limit_leaves_meta_expiring(
        op: str, name: str, redis_client: redis.Redis) -> None:
    """Meta gone (deleted, or expired before a lease) while a lease lives: an op that
    writes `limit` creates meta, which must get its TTL (KEY_SCHEMA: every writing op)."""
    keys = bh_keys(name)
    own_lease(redis_client, keys, 9_000)
    reply = bulkhead(redis_client, keys, op, "tok", LIMIT, LEASE, TTL, 0, "", "ok")
    assert ok_of(reply) == 1
    assert redis_client.hget(keys[1], "limit") == str(LIMIT).encode()
    assert 0 < redis_client.pttl(keys[1]) <= TTL


def test_an_adaptive_hot_acquire_clamps_the_stored_limit_as_the_general_one(
        name: str, redis_client: redis.Redis) -> None:
    keys = bh_keys(name)
    adaptive = "2,4,3,900000,1500000,50000"
    for stored in ("1.5", "3.7", "9"):  # below min, inside, above max
        redis_client.delete(*keys)
        other_leases(redis_client, keys, 3, 20_000)
        with_meta({"a_limit": stored, "limit": 3})(redis_client, keys)
        args = ["acquire", "tok", LIMIT, LEASE, TTL, 0, adaptive]
        compare_bulkhead(redis_client, keys, args, args,
                         lambda: redis_client.hset(keys[1], "waiters", "00"))


@pytest.mark.parametrize("stored", [None, "3.5", "many"])
def test_an_adaptive_hot_release_stores_a_fresh_limit_as_the_general_one(
        stored: str | None, name: str, redis_client: redis.Redis) -> None:
    """An unsampled success (no outcome) takes the hot release; when meta holds no
    adaptive limit (deleted, expired), the general path stores the initial one."""
    keys = bh_keys(name)
    adaptive = "2,8,3,900000,1500000,50000"
    own_lease(redis_client, keys, 9_000)
    fields: dict[str, Any] = {"limit": 3, "acquired": 1,
                              "ttl_until": lambda c: server_ms(c) + TTL - 1_000}
    if stored is not None:
        fields["a_limit"] = stored
    with_meta(fields)(redis_client, keys)
    args = ["release", "tok", LIMIT, LEASE, TTL, 0, adaptive]
    saved = Keys(redis_client, keys)
    saved.save()
    assert ok_of(bulkhead(redis_client, keys, *args)) == 1
    hot = redis_client.hget(keys[1], "a_limit")
    saved.restore()
    redis_client.hset(keys[1], "waiters", "00")  # the general path
    assert ok_of(bulkhead(redis_client, keys, *args)) == 1
    assert hot == redis_client.hget(keys[1], "a_limit")


# -- budget -----------------------------------------------------------------------------
BUDGET_ARGS = ["500000", "10000000", "10000", "10"]


def budget(client: redis.Redis, key: str, *args: Any) -> Any:
    return run_script(client, load_script("budget"), [key], [str(a) for a in args])


@pytest.mark.parametrize("amount", [1, 3])
@pytest.mark.parametrize("before", [0, 1, 4])
def test_a_deposit_within_the_slice_changes_only_its_counts(
        amount: int, before: int, name: str, redis_client: redis.Redis) -> None:
    """Budget layout 2 has one path: within the current slice a deposit rewrites only
    D and the slice's deposits (SETRANGE: the TTL stays), and answers the new totals."""
    key = f"t:{{{name}}}:rb2"
    while server_ms(redis_client) % 1000 > 500:  # every call in one slice (1 s)
        time.sleep(0.05)
    for _ in range(before):
        budget(redis_client, key, "deposit", *BUDGET_ARGS, 1)
    budget(redis_client, key, "withdraw", *BUDGET_ARGS, 1)
    stored = window(redis_client, key)
    redis_client.pexpire(key, 60_000)
    reply = budget(redis_client, key, "deposit", *BUDGET_ARGS, amount)
    after = window(redis_client, key)
    d = after["D"]
    assert d == before + amount and after["W"] == stored["W"]
    assert reply[:4] == [1, (10_000_000 + 500_000 * d) // 1_000_000 - after["W"], d,
                         after["W"]] and reply[5] == 0
    head = stored["head"]
    assert after == {**stored, "D": d, f"d:{head}": d}
    assert redis_client.pttl(key) > 11_000  # not refreshed within the slice


# -- breaker ----------------------------------------------------------------------------
def masked(reply: Any, now: int) -> Any:
    """A reply with server times (within a minute of now) masked: the runs are ms apart."""
    if isinstance(reply, list):
        return [masked(value, now) for value in reply]
    if isinstance(reply, int) and abs(reply - now) < 60_000:
        return "now"
    if isinstance(reply, int) and abs(reply - 60_000) < 1_000:  # the OPEN wait left
        return "wait"
    return reply


def record(client: redis.Redis, cb: CircuitBreaker, *counts: str) -> Any:
    call = cb._codec._call("record", "", *counts)
    return run_script(client, load_script("breaker"), call.keys, call.args)


#: outcomes in order: True a success (compared hot vs general), False a failure
SEQUENCES = {
    "successes fill and wrap the window": [True] * 12,
    "failures reach the threshold with a success": [False, False, False, True, True],
    "a success evicts a failure": [False, True, True, True, True, True, True, True],
    "mixed": [True, False, True, True, False, False, True, False, True, True, True, True],
}


@pytest.mark.parametrize("quorum", [1, 2])
@pytest.mark.parametrize("sequence", list(SEQUENCES))
def test_the_usual_record_gives_the_general_record_s_result(
        sequence: str, quorum: int, name: str, redis_url: str,
        redis_client: redis.Redis) -> None:
    cb = CircuitBreaker(name, redis=redis_url, sliding_window_size=5,
                        minimum_number_of_calls=4, failure_rate_threshold=50,
                        min_failing_workers=quorum)
    keys = [*cb.keys.script_keys, cb.keys.state + ":fw"]
    saved = Keys(redis_client, keys)
    record(redis_client, cb, "1", "0", "0", "3")  # the record exists: the hot path may run
    for success in SEQUENCES[sequence]:
        if not success:
            record(redis_client, cb, "0", "1", "0", "4")
            continue
        saved.save()
        now = server_ms(redis_client)
        hot = masked(record(redis_client, cb, "1", "0", "0", "7"), now)
        hot_state = {k: redis_client.dump(k) for k in keys}
        saved.restore()
        general = masked(record(redis_client, cb, "01", "0", "0", "7"), now)  # one success
        assert hot == general
        assert hot_state == {k: redis_client.dump(k) for k in keys}
