"""The merged call (lua/finish.lua) against a real redis-server: one FCALL carrying what a
Policy attempt owes (the budget deposit, the bulkhead release, the breaker record), each
call getting its own reply or error, the plan checked before anything runs, and the EVAL
form answering as the function does.

Tests taking `flavour` run with the sync and the asyncio Policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.exceptions import ResponseError

import distbreaker.policy._shell_aio
import distbreaker.policy._shell_sync
from distbreaker import Bulkhead, CircuitBreaker, RetryBudget
from distbreaker._runtime.scripts import library, load_script, translate_error
from distbreaker.errors import SchemaError
from distbreaker.policy.core import MergedCall, split_flat
from tests.helpers.budget_window import window
from tests.helpers.flavours import Flavour
from tests.helpers.redis_stats import commands

BUDGET = {"percent_can_retry": 0.5, "min_retries_per_sec": 1}


def full_policy(flavour: Flavour, name: str, url: str, **kwargs: Any) -> Any:
    """A policy with all three components under one name (so its calls merge)."""
    options: dict[str, Any] = {"bulkhead": {"max_concurrent_calls": 5}, "budget": BUDGET,
                               "retry": {"max_attempts": 1}}
    options.update(kwargs)
    return flavour.policy(name, redis=url, **options)


def fcalls(client: redis.Redis) -> int:
    return commands(client).get("fcall", 0)


def capture_merged(monkeypatch: pytest.MonkeyPatch) -> list[MergedCall | None]:
    """Every merge decision both policies take: the merged call, or None (not merged)."""
    seen: list[MergedCall | None] = []
    for module in (distbreaker.policy._shell_sync, distbreaker.policy._shell_aio):
        original = module.merged

        def capturing(ready: Any, original: Callable[..., Any] = original) -> Any:
            one = original(ready)
            seen.append(one)
            return one
        monkeypatch.setattr(module, "merged", capturing)
    return seen


def one_merged_call(monkeypatch: pytest.MonkeyPatch, name: str,
                    redis_url: str) -> tuple[Any, MergedCall]:
    """A full sync policy and the merged call its first attempt sent."""
    policy = full_policy(Flavour("sync"), name, redis_url)
    seen = capture_merged(monkeypatch)
    policy.call(lambda: "ok")
    one = seen[-1]
    assert one is not None
    return policy, one


def deposits(client: redis.Redis, policy: Any) -> int:
    return window(client, policy.budget.keys.slices).get("D", 0)


# -- (1) one FCALL, each component its own reply --------------------------------------
def test_an_attempt_owes_one_merged_fcall_and_each_component_gets_its_reply(
        name: str, redis_url: str, redis_client: redis.Redis, flavour: Flavour,
        monkeypatch: pytest.MonkeyPatch) -> None:
    policy = full_policy(flavour, name, redis_url)
    assert policy.call(lambda: "warm-up") == "warm-up"  # learns CLOSED, loads the library
    seen = capture_merged(monkeypatch)
    before_calls = policy.breaker.metrics().calls  # (an FCALL itself: read first)
    before_fcalls, before_deposits = fcalls(redis_client), deposits(redis_client, policy)
    for _ in range(3):
        assert policy.call(lambda: "ok") == "ok"
    # per attempt: the acquire, then ONE call (finish) for deposit + release + record
    assert fcalls(redis_client) - before_fcalls == 3 * 2
    assert [one.script.name if one else None for one in seen] == ["finish"] * 3
    assert all(one is not None and one.args[0].split(",") ==
               ["budget:1:5", "bulkhead:2:5", "breaker:1:10"] for one in seen)
    assert deposits(redis_client, policy) - before_deposits == 3   # the budget counted
    assert policy.bulkhead.metrics().in_use == 0                     # permits released
    assert not redis_client.exists(policy.bulkhead.keys.leases)
    assert policy.breaker.metrics().calls - before_calls == 3        # the breaker counted
    assert policy.budget.balance() == 10 + (before_deposits + 3) // 2  # reserve + 50 %


def test_a_failed_attempt_is_recorded_as_a_failure_by_the_merged_call(
        name: str, redis_url: str, flavour: Flavour) -> None:
    policy = full_policy(flavour, name, redis_url)

    def failing() -> None:
        raise ConnectionError("down")
    for _ in range(2):
        with pytest.raises(ConnectionError):
            policy.call(failing)
    metrics = policy.breaker.metrics()
    assert (metrics.calls, metrics.failed) == (2, 2)
    assert policy.bulkhead.metrics().in_use == 0


# -- (2) an error in its place -----------------------------------------------------------
@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_a_foreign_budget_key_fails_only_the_deposit(
        name: str, redis_url: str, redis_client: redis.Redis, flavour: Flavour) -> None:
    policy = full_policy(flavour, name, redis_url)
    policy.call(lambda: "warm-up")
    redis_client.delete(policy.budget.keys.slices)
    redis_client.hset(policy.budget.keys.slices, "not", "a window")
    with pytest.raises(SchemaError) as raised:
        policy.call(lambda: "ok")
    assert raised.value.key == policy.budget.keys.slices
    # the release and the record after it in the plan still ran, and were settled
    assert policy.breaker.metrics().calls == 2
    assert policy.bulkhead.metrics().in_use == 0
    assert redis_client.hgetall(policy.budget.keys.slices) == {b"not": b"a window"}


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_a_foreign_leases_key_fails_only_the_release(
        name: str, redis_url: str, redis_client: redis.Redis, flavour: Flavour) -> None:
    policy = full_policy(flavour, name, redis_url)
    policy.call(lambda: "warm-up")
    before = deposits(redis_client, policy)
    leases = policy.bulkhead.keys.leases

    def spoiling() -> str:  # the lease was granted; now the zset becomes foreign data
        redis_client.set(leases, "not a zset")
        return "ok"
    with pytest.raises(SchemaError) as raised:
        policy.call(spoiling)
    assert raised.value.key == leases
    assert deposits(redis_client, policy) == before + 1   # the deposit before it ran
    assert policy.breaker.metrics().calls == 2             # the record after it too
    assert redis_client.get(leases) == b"not a zset"


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_the_finish_script_answers_a_failed_call_in_place(
        name: str, redis_url: str, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    policy, one = one_merged_call(monkeypatch, name, redis_url)
    redis_client.set(policy.bulkhead.keys.meta, "not a hash")
    before = deposits(redis_client, policy)
    raw = redis_client.execute_command("FCALL", one.script.function, len(one.keys),
                                       *one.keys, *one.args)
    budget, release, record = split_flat(raw, 3)
    assert budget == 0  # the deposit, an `add`: its drift flag
    assert deposits(redis_client, policy) == before + 1  # it ran
    assert isinstance(release, ResponseError)
    assert str(release).startswith("DISTBREAKER_SCHEMA " + policy.bulkhead.keys.meta)
    assert isinstance(record, list)
    assert policy.breaker.metrics().calls == 2  # the record after the failed call ran


# -- (3) the plan ---------------------------------------------------------------------
def plan_error(client: redis.Redis, function: str, keys: list[str],
               args: list[Any]) -> Exception:
    with pytest.raises(ResponseError) as raised:
        client.execute_command("FCALL", function, len(keys), *keys, *args)
    return translate_error(raised.value)


@pytest.mark.parametrize("plan", [
    "", "budget", "budget:1", "budget:x:5", "nothing:1:5", "budget:1:5,budget:1:5",
    "budget:1:5;breaker:1:10", " budget:1:5", "budget:1:-5", ",",
])
def test_a_malformed_plan_is_refused_and_runs_nothing(
        plan: str, name: str, redis_url: str, redis_client: redis.Redis) -> None:
    budget = RetryBudget(name, redis=redis_url, **BUDGET)
    budget.balance()  # creates nothing, loads the library
    key = budget.keys.slices
    args = [plan, "deposit", "500000", "10000000", "10000", "10", "1"]
    error = plan_error(redis_client, load_script("finish").function, [key], args)
    assert isinstance(error, ValueError) and "finish plan" in str(error)
    assert not redis_client.exists(key)


@pytest.mark.parametrize(("plan", "extra_keys", "extra_args"), [
    ("budget:1:5", 1, 0),       # one key too many
    ("budget:1:5", 0, 1),       # one argument too many
    ("budget:2:5", 0, 0),       # one key too few
    ("budget:1:6", 0, 0),       # one argument too few
    ("budget:1:5,breaker:1:10", 0, 0),  # a whole call missing
])
def test_a_plan_that_does_not_match_keys_and_argv_is_refused_and_runs_nothing(
        plan: str, extra_keys: int, extra_args: int, name: str, redis_url: str,
        redis_client: redis.Redis) -> None:
    budget = RetryBudget(name, redis=redis_url, **BUDGET)
    budget.balance()
    key = budget.keys.slices
    keys = [key] + [key + ":extra"] * extra_keys
    args = [plan, "deposit", "500000", "10000000", "10000", "10"] + ["1"] * extra_args
    error = plan_error(redis_client, load_script("finish").function, keys, args)
    assert isinstance(error, ValueError)
    assert "does not match its KEYS and ARGV" in str(error)
    assert redis_client.keys("*") == []


def test_a_plan_with_a_huge_argument_count_is_refused_before_the_first_call_runs(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    """A count too large to copy (Lua's unpack() stops near 8000 values) is a bad plan:
    refused before anything runs, not an error raised after the deposit was made (a
    client that retries the failed call would deposit twice)."""
    budget = RetryBudget(name, redis=redis_url, **BUDGET)
    budget.balance()
    key = budget.keys.slices
    n = 9000
    args = [f"budget:1:5,breaker:1:{n}", "add", "500000", "10000000", "10000", "10",
            *["x"] * n]
    error = plan_error(redis_client, load_script("finish").function, [key, key + ":cb"], args)
    assert isinstance(error, ValueError) and "finish plan" in str(error)
    assert not redis_client.exists(key)


# -- (4) the EVAL form ------------------------------------------------------------------
def masked(reply: Any, now_ms: int) -> Any:
    """The reply with every server-time value (within a minute of now) masked: the two
    calls run a few milliseconds apart."""
    out: list[Any] = []
    for value in reply:
        if isinstance(value, int) and abs(value - now_ms) < 60_000:
            out.append("now")
        elif isinstance(value, ResponseError):
            out.append(("error", str(value)))
        else:
            out.append(value)
    return out


def state_of(client: redis.Redis, keys: list[str]) -> dict[str, Any]:
    """What a merged call leaves in its keys that does not depend on the server time."""
    out: dict[str, Any] = {}
    for key in keys:
        kind = client.type(key)
        if key.endswith(":rb2"):  # the budget window without its server-time fields
            fields = window(client, key)
            out[key] = {f: v for f, v in fields.items()
                        if f != "head" and f[:2] not in ("d:", "w:")}
        elif kind == b"hash":
            fields = client.hgetall(key)
            out[key] = {f: v for f, v in fields.items()
                        if f not in (b"ttl_until", b"head") and f[:2] not in (b"d:", b"w:")}
        elif kind == b"zset":
            out[key] = client.zrange(key, 0, -1)
        else:
            out[key] = kind
    return out


@pytest.mark.keys_without_ttl("it restores snapshots with RESTORE ttl 0")
def test_the_eval_form_answers_as_the_function(
        name: str, redis_url: str, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, one = one_merged_call(monkeypatch, name, redis_url)
    script = load_script("finish")
    assert "local function budget(" in script.source  # the EVAL form carries the three
    keys = list(one.keys)
    snapshot = {key: redis_client.dump(key) for key in keys if redis_client.exists(key)}

    def restore() -> None:
        redis_client.delete(*keys)
        for key, dumped in snapshot.items():
            redis_client.restore(key, 0, dumped)

    results = {}
    for how in ("FCALL", "EVAL"):
        restore()
        lease = redis_client.zadd(keys[1], {one.args[7]: 10**13})  # the token holds a lease
        assert lease == 1
        head = script.function if how == "FCALL" else script.source
        raw = redis_client.execute_command(how, head, len(keys), *keys, *one.args)
        now_ms = int(redis_client.time()[0]) * 1000
        results[how] = (masked(raw, now_ms), state_of(redis_client, keys))
    assert results["FCALL"] == results["EVAL"]
    fcall_reply = split_flat(results["FCALL"][0], 3)
    assert fcall_reply[1] == 1  # the release found the lease (the bulkhead's hot path)


def test_the_eval_form_reports_a_bad_plan_like_the_function(
        redis_url: str, redis_client: redis.Redis) -> None:
    script = load_script("finish")
    redis_client.function_load(library().code, replace=True)
    errors = []
    for how, head in (("FCALL", script.function), ("EVAL", script.source)):
        with pytest.raises(ResponseError) as raised:
            redis_client.execute_command(how, head, 0, "budget:0:1,budget:0:1", "x")
        errors.append(str(raised.value).split(" script:")[0])
    assert errors[0] == errors[1]
    assert errors[0].startswith("DISTBREAKER_ARGS bad finish plan")


# -- (5) no merge across names ----------------------------------------------------------
def test_components_of_different_names_are_pipelined_not_merged(
        name: str, redis_url: str, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from distbreaker import Policy
    breaker = CircuitBreaker(name + "-b", redis=redis_url)
    bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=5)
    budget = RetryBudget(name + "-r", redis=redis_url, **BUDGET)
    policy = Policy(name, redis=redis_url, breaker=breaker, bulkhead=bulkhead, budget=budget)
    assert policy.breaker is breaker and policy.budget is budget
    policy.call(lambda: "warm-up")
    seen = capture_merged(monkeypatch)
    before = fcalls(redis_client)
    for _ in range(3):
        assert policy.call(lambda: "ok") == "ok"
    assert seen == [None, None, None]  # three hash tags: no merged call
    # per attempt: the acquire, then the deposit, release and record as three FCALLs
    assert fcalls(redis_client) - before == 3 * 4
    assert breaker.metrics().calls == 4
    assert bulkhead.metrics().in_use == 0
    assert window(redis_client, budget.keys.slices)["D"] == 4


def test_a_lone_record_is_not_merged(name: str, redis_url: str, redis_client: redis.Redis,
                                     flavour: Flavour,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    policy = flavour.policy(name, redis=redis_url)  # the breaker only: one call owed
    policy.call(lambda: "warm-up")
    seen = capture_merged(monkeypatch)
    before = fcalls(redis_client)
    assert policy.call(lambda: "ok") == "ok"
    assert seen == [None]
    assert fcalls(redis_client) - before == 1
    assert policy.breaker.metrics().calls == 2


# -- (6) the asyncio Policy merges too ----------------------------------------------------
def test_the_asyncio_policy_merges_its_owed_calls(
        name: str, redis_url: str, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    flavour = Flavour("asyncio")
    try:
        policy = full_policy(flavour, name, redis_url)
        policy.call(lambda: "warm-up")
        seen = capture_merged(monkeypatch)
        before = fcalls(redis_client)
        for _ in range(2):
            assert policy.call(lambda: "ok") == "ok"
        assert fcalls(redis_client) - before == 2 * 2
        assert [one.script.name if one else None for one in seen] == ["finish", "finish"]
        assert policy.breaker.metrics().calls == 3
        assert deposits(redis_client, policy) == 3
        assert policy.bulkhead.metrics().in_use == 0
    finally:
        flavour.close()


# -- (7) the flat reply ----------------------------------------------------------------
def test_split_flat_reads_arrays_scalars_and_errors() -> None:
    error = ResponseError("DISTBREAKER_SCHEMA k holds a string, expected a hash")
    flat = [3, 1, 2, 3, 0, 1, 0, error, 1, b"x"]
    assert split_flat(flat, 4) == [[1, 2, 3], 1, error, [b"x"]]


def test_split_flat_refuses_a_reply_that_ends_early() -> None:
    with pytest.raises(ValueError, match="ended early"):
        split_flat([3, 1, 2], 1)
    with pytest.raises(ValueError, match="ended early"):
        split_flat([2, 1, 2, 0], 2)


def test_the_merged_call_runs_as_eval_in_memory_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """memory:// (fakeredis: no Functions) runs the EVAL form of finish: the same
    effects, each component its own reply."""
    from distbreaker import Policy
    policy = Policy("memory-finish", redis="memory://", bulkhead={"max_concurrent_calls": 3},
                    budget=BUDGET, retry={"max_attempts": 1})
    seen = capture_merged(monkeypatch)
    for _ in range(3):
        assert policy.call(lambda: "ok") == "ok"
    assert [one.script.name if one else None for one in seen] == ["finish"] * 3
    assert policy.breaker.metrics().calls == 3
    assert policy.bulkhead.metrics().in_use == 0
    assert policy.budget.balance() == 10 + 3 // 2


# -- foreign data is final, and spoils no other client's calls ---------------------------
@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_foreign_data_met_by_an_attempt_is_not_retried(
        name: str, redis_url: str, redis_client: redis.Redis, flavour: Flavour) -> None:
    """A retry would meet the same data and spend the budget on it (SchemaError is in
    the retry's default ignore list)."""
    policy = full_policy(flavour, name, redis_url,
                         retry={"max_attempts": 3, "base": 0.0, "cap": 0.0})
    policy.call(lambda: "warm-up")
    redis_client.set(policy.bulkhead.keys.leases, "not a zset")
    calls: list[int] = []

    def dependency() -> str:
        calls.append(1)
        return "ok"
    with pytest.raises(SchemaError):
        policy.call(dependency)
    assert calls == []  # the acquire met it, once
    assert window(redis_client, policy.budget.keys.slices).get("W", 0) == 0  # no retry


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_an_error_on_one_client_still_sends_the_other_clients_calls(
        name: str, redis_url: str, redis_client: redis.Redis, flavour: Flavour) -> None:
    """Components on two clients: the release (first in order) meets foreign data; the
    breaker's record on the other client still reaches Redis, then the error is raised."""
    other = (redis.asyncio.Redis if flavour.is_async else redis.Redis).from_url(redis_url)
    bulkhead = flavour.bulkhead(name, redis=other)  # its own client: another group
    breaker = flavour.breaker(name, redis=redis_url)
    policy = flavour.policy(name, redis=redis_url, breaker=getattr(breaker, "target", breaker),
                            bulkhead=getattr(bulkhead, "target", bulkhead))
    leases = bulkhead.keys.leases
    policy.call(lambda: "warm-up")

    def spoiling() -> str:
        redis_client.set(leases, "not a zset")
        return "ok"
    with pytest.raises(SchemaError):
        policy.call(spoiling)
    assert breaker.metrics().calls == 2  # recorded although the release failed first


# -- a refusal of one component's key (ACL) ------------------------------------------
def test_a_refused_budget_key_leaves_the_release_and_the_record_to_run(
        name: str, redis_url: str, redis_client: redis.Redis, flavour: Flavour) -> None:
    """A user without permission on the budget's key: alone, only the deposit is refused
    (NOPERM, its outage path); merged, FCALL's own ACL check of its KEYS must not refuse
    the release and the record with it (the lease would stay held until it expires)."""
    base = f"distbreaker:v2:{{{name}}}"
    user = f"u-{name}"
    redis_client.execute_command("ACL", "SETUSER", user, "on", ">pw", f"~{base}:cb*",
                                 f"~{base}:bh*", "&*", "+@all")
    try:
        url = redis_url.replace("redis://", f"redis://{user}:pw@", 1)
        policy = full_policy(flavour, name, url)
        for _ in range(3):
            assert policy.call(lambda: "ok") == "ok"
        assert redis_client.zcount(f"{base}:bh", 1, "+inf") == 0  # every lease released
        admin = CircuitBreaker(name, redis=redis_url)
        assert admin.metrics().calls == 3  # every record reached Redis
        assert not redis_client.exists(f"{base}:rb2")
    finally:
        redis_client.execute_command("ACL", "DELUSER", user)


def test_a_corrupt_withdrawal_total_is_named_by_the_policys_deposit(
        name: str, redis_url: str, redis_client: redis.Redis, flavour: Flavour) -> None:
    """The deposit a Policy sends (an `add`, which answers no figures) still reads and
    checks every header field it would have to trust, as the general path does."""
    policy = full_policy(flavour, name, redis_url)
    policy.call(lambda: "warm-up")
    redis_client.setrange(policy.budget.keys.slices, 40, b"\xff" * 8)  # W = -1 (layout 2)
    with pytest.raises(SchemaError, match="corrupt budget fields"):
        policy.call(lambda: "ok")
    assert policy.breaker.metrics().calls == 2  # the release and the record still ran
