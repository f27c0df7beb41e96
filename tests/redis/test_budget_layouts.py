"""Budget layout 2 beside workers of earlier versions (layout 1, the hash `:rb`): the two
keys are two budgets while a fleet rolls over (docs/KEY_SCHEMA.md, "Retry budget"); an
upgraded worker never errs on, reads or writes an old worker's hash, and the readers
(`ls`, `show`, Prometheus through readside) show the old hash until the new window
exists, then the new one."""

from __future__ import annotations

import redis

from distbreaker import RetryBudget
from distbreaker._runtime.keys import DEFAULT_PREFIX
from distbreaker.readside import read_detail, read_rows, scan
from tests.helpers.budget_window import encode, window


def old_worker_hash(client: redis.Redis, name: str) -> str:
    """What a worker of an earlier version leaves after 5 deposits and 1 retry (layout 1:
    default geometry, 10 slices of 1 s), with the TTL it sets."""
    key = f"{DEFAULT_PREFIX}:v2:{{{name}}}:rb"
    seconds, micros = client.time()
    head = (int(seconds) * 1000 + int(micros) // 1000) // 1000
    client.hset(key, mapping={"v": "1", "slice_ms": "1000", "n": "10", "head": head,
                              "D": "5", "W": "1", f"d:{head}": "5", f"w:{head}": "1",
                              "ppm": "200000", "reserve": "100000000"})
    client.pexpire(key, 60_000)
    return key


def shown(client: redis.Redis, name: str) -> tuple[dict[str, object], dict[str, object]]:
    """The budget as `show` (read_detail) and `ls` (read_rows) show it."""
    rows = [r for r in read_rows(client, DEFAULT_PREFIX, scan(client, DEFAULT_PREFIX))
            if r["name"] == name]
    return read_detail(client, DEFAULT_PREFIX, name)["budget"], rows[0]["budget"]


def test_old_and_new_workers_keep_two_budgets_and_readers_show_the_new_one(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    old = old_worker_hash(redis_client, name)
    before = redis_client.hgetall(old)
    for budget in shown(redis_client, name):   # only old workers so far: their hash
        assert (budget["deposits"], budget["withdrawals"], budget["balance"]) == (5, 1, 100)
    new = RetryBudget(name, redis=redis_url)
    assert new.keys.slices == old + "2"
    assert new.deposit(3) == 100                 # no error on the old hash: its own window
    assert new.try_withdraw()
    assert redis_client.hgetall(old) == before   # the old worker's budget untouched
    assert window(redis_client, new.keys.slices)["D"] == 3
    for budget in shown(redis_client, name):   # the new window once it exists
        assert (budget["deposits"], budget["withdrawals"]) == (3, 1)
        assert budget["fields"]["v"] == "2" and budget["slices"] == 10
    assert 0 < redis_client.pttl(new.keys.slices) <= 11_000


def test_a_window_of_many_slices_reads_back_as_its_slices(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    """Readers decode layout 2's older slices: each one's counts as `d:<id>`, `w:<id>`."""
    key = f"{DEFAULT_PREFIX}:v2:{{{name}}}:rb2"
    seconds, micros = redis_client.time()
    head = (int(seconds) * 1000 + int(micros) // 1000) // 1000
    fields = {"n": 10, "slice_ms": 1000, "head": head, "D": 9, "W": 2, "ppm": 200000,
              "reserve": 100000000, f"d:{head - 3}": 4, f"w:{head - 3}": 2,
              f"d:{head - 1}": 3, f"d:{head}": 2}
    redis_client.set(key, encode(fields), px=60_000)
    detail, row = shown(redis_client, name)
    assert detail == row
    assert (detail["deposits"], detail["withdrawals"], detail["balance"]) == (9, 2, 99)
    assert {k: v for k, v in detail["fields"].items() if k[:2] in ("d:", "w:")} == {
        f"d:{head - 3}": "4", f"w:{head - 3}": "2", f"d:{head - 1}": "3", f"d:{head}": "2"}
    # and the script reads the same slices: a withdrawal in the same window
    assert RetryBudget(name, redis=redis_url).try_withdraw()
    assert window(redis_client, key)["W"] == 3
