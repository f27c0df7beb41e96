"""lua/policy.lua: several breaker / bulkhead / budget calls in one script call, each
answering exactly as if it had been sent alone (as a Function and in its EVAL form)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from distbreaker._runtime.scripts import (
    FUNCTIONS,
    ScriptCallSpec,
    load_script,
    merged_call,
    run_calls_each,
    run_scripts_each,
)
from distbreaker.budget.config import BudgetConfig
from distbreaker.budget.core import BudgetCore
from distbreaker.bulkhead.config import BulkheadConfig
from distbreaker.bulkhead.core import BulkheadCodec


def finish_calls(name: str) -> list[ScriptCallSpec]:
    """A Policy finish: a deposit, a bulkhead release (of a lease never granted: counted
    lost), a withdrawal, and a budget call with bad arguments (an error in its place)."""
    bulkhead = BulkheadCodec(name, BulkheadConfig(max_concurrent_calls=2))
    budget = BudgetCore(name, BudgetConfig(percent_can_retry=0.5, min_retries_per_sec=0), "",
                        {})
    release = bulkhead.release_call("gone")
    script = load_script("budget")
    key = budget.keys.slices
    return [(script, [key], budget.script_args("deposit", 4)),
            (bulkhead.script, release.keys, release.args),
            (script, [key], budget.script_args("withdraw")),
            (script, [key], ["steal", "0", "0", "1000", "10", "1"])]


def comparable(results: list[Any]) -> list[Any]:
    """Replies without their server times (budget [4], bulkhead [6])."""
    out: list[Any] = []
    for result in results:
        if isinstance(result, Exception):
            out.append((type(result), str(result)))
        elif len(result) == 6:
            out.append([int(v) for i, v in enumerate(result) if i != 4])
        else:
            out.append([int(v) for i, v in enumerate(result) if i != 6])
    return out


@pytest.mark.parametrize("form", ["function", "eval"])
def test_a_merged_call_answers_like_the_calls_sent_alone(form: str, name: str,
                                                        redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    if form == "eval":
        FUNCTIONS.give_up(client, "unknown command (test: the EVAL form)")
    alone = run_scripts_each(client, finish_calls(f"{name}-alone"))
    merged_spec = merged_call(finish_calls(f"{name}-merged"))
    assert merged_spec is not None and merged_spec[0].name == "policy"
    merged = run_calls_each(client, finish_calls(f"{name}-merged"))
    assert comparable(merged) == comparable(alone)
    assert comparable(merged)[:3] == [[1, 2, 4, 0, 0], [0, 0, 2, 0, 0, 0, 1, 0],
                                      [1, 1, 4, 1, 0]]
    assert isinstance(merged[3], ValueError)     # its error in its place
    client.close()


def test_calls_of_two_names_or_a_single_call_are_not_merged(name: str) -> None:
    one, other = finish_calls(name), finish_calls(f"{name}-other")
    assert merged_call(one[:1]) is None
    assert merged_call([one[0], other[1]]) is None   # two hash tags: two cluster slots
