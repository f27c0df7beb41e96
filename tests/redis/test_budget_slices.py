"""The retry budget's first deposit in a new slice (after a second or more without one):
the slices that left the window leave the totals and the window (layout 2: one string)
in O(1) commands, for a deposit and a withdrawal alike."""

from __future__ import annotations

import pytest
import redis

from distbreaker import RetryBudget
from distbreaker._runtime.keys import DEFAULT_PREFIX
from tests.helpers.budget_window import encode, window


def seed(client: redis.Redis, key: str, head_back: int) -> tuple[int, set[int]]:
    """A budget window (10 slices of 1 s) whose newest slice is `head_back` s old: the
    slices that leave at the next call (ids in (head - 10, cur - 10]: they leave
    whatever second it is by then) hold 5 deposits and 1 withdrawal each, the head
    slice 2 and 1. Answers the current slice and the ids that leave."""
    seconds, micros = client.time()
    cur = (int(seconds) * 1000 + int(micros) // 1000) // 1000
    head = cur - head_back
    fields: dict[str, int] = {"slice_ms": 1000, "n": 10, "head": head,
                              "ppm": 200000, "reserve": 100000000}
    leaving = set(range(head - 9, cur - 9))
    for sid in leaving:
        fields[f"d:{sid}"], fields[f"w:{sid}"] = 5, 1
    if head not in leaving:
        fields[f"d:{head}"], fields[f"w:{head}"] = 2, 1
    fields["D"] = sum(v for k, v in fields.items() if k.startswith("d:"))
    fields["W"] = sum(v for k, v in fields.items() if k.startswith("w:"))
    client.set(key, encode(fields), px=60_000)
    return cur, leaving


@pytest.mark.parametrize("head_back", [1, 2, 3, 6])
@pytest.mark.parametrize("op", ["deposit", "withdraw"])
def test_a_new_slice_drops_the_slices_that_left(name: str, redis_url: str,
                                                redis_client: redis.Redis, op: str,
                                                head_back: int) -> None:
    budget = RetryBudget(name, redis=redis_url, redis_timeout=5.0)
    key = f"{DEFAULT_PREFIX}:v2:{{{name}}}:rb2"
    cur, leaving = seed(redis_client, key, head_back)
    if op == "deposit":
        budget.deposit()
    else:
        budget.withdraw()
    stored = window(redis_client, key)
    assert not {f"{kind}:{sid}" for kind in "dw" for sid in leaving} & set(stored)
    slices = {k: v for k, v in stored.items() if k[:2] in ("d:", "w:")}
    assert stored["D"] == sum(v for k, v in slices.items() if k.startswith("d:"))
    assert stored["W"] == sum(v for k, v in slices.items() if k.startswith("w:"))
    withdrew = op == "withdraw"   # a withdrawal deposits nothing (ARGV[7] 0)
    assert (stored["D"], stored["W"]) == ((2, 2) if withdrew else (3, 1))
    assert stored["head"] >= cur and 0 < redis_client.pttl(key) <= 11_000


def test_a_gap_of_the_whole_window_restarts_the_totals(name: str, redis_url: str,
                                                       redis_client: redis.Redis) -> None:
    budget = RetryBudget(name, redis=redis_url, redis_timeout=5.0)
    key = f"{DEFAULT_PREFIX}:v2:{{{name}}}:rb2"
    seed(redis_client, key, head_back=10)
    budget.deposit()
    stored = window(redis_client, key)
    assert stored["D"] == 1 and stored["W"] == 0
    assert [k for k in stored if k[:2] in ("d:", "w:")] == [f"d:{stored['head']}"]
