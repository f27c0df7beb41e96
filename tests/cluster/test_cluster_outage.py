"""A whole cluster unreachable: protected calls fail open (redis-py raises a bare
RedisClusterException then, not a ConnectionError) and return to Redis when it is back."""

from __future__ import annotations

from redis.backoff import NoBackoff
from redis.retry import Retry

from distbreaker import Bulkhead, CircuitBreaker, RetryBudget
from distbreaker.demo.embedded import EmbeddedCluster
from distbreaker.policy.sync import Policy
from tests.helpers.waiting import wait_until

FAST_RETRY = {"redis_retry_max_backoff": 0.3}


def test_unreachable_cluster_fails_open_and_recovers(name: str) -> None:
    with EmbeddedCluster(primaries=1) as cluster:  # its own: this test kills the node
        client = cluster.client(socket_timeout=0.25, socket_connect_timeout=0.25,
                                retry=Retry(NoBackoff(), 0))
        breaker = CircuitBreaker(name, redis=client, **FAST_RETRY)
        bulkhead = Bulkhead(name, redis=client, max_concurrent_calls=2, **FAST_RETRY)
        budget = RetryBudget(name, redis=client, min_retries_per_sec=1, **FAST_RETRY)
        policy = Policy(name + "-policy", redis=client, breaker=FAST_RETRY,
                        bulkhead={"max_concurrent_calls": 2, **FAST_RETRY},
                        budget={"min_retries_per_sec": 1, **FAST_RETRY})
        assert breaker.call(lambda: "up") == "up" and policy.call(lambda: "up") == "up"

        cluster.nodes[0].kill()
        for _ in range(5):
            assert breaker.call(lambda: "served") == "served"
            assert bulkhead.call(lambda: "served") == "served"
            assert budget.deposit() is not None and budget.last_source == "local"
            assert policy.call(lambda: "served") == "served"
        assert breaker._health.down and policy.breaker._health.down

        cluster.nodes[0].start()  # same port and nodes.conf: it owns every slot again

        def back_on_redis() -> bool:
            breaker.call(lambda: None)
            policy.call(lambda: None)
            return not (breaker._health.down or policy.breaker._health.down)

        wait_until(back_on_redis, timeout=30, interval=0.05, what="back on Redis")
        assert breaker.metrics().calls >= 1
        client.close()
