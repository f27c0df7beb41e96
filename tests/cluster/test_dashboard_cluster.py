"""The dashboard's hub on a real 3-primary Redis Cluster: names on every primary, a pool
and a rate limiter are found and read, and a changed row is sent alone (no command the
cluster refuses: no TIME in a pipeline, scans on every primary)."""

from __future__ import annotations

import time
from typing import Any

from redis.cluster import RedisCluster

from distbreaker import CircuitBreaker, Pool, RateLimiter
from distbreaker.dashboard.hub import Hub
from distbreaker.demo.embedded import EmbeddedCluster


def test_the_hub_reads_a_cluster_and_sends_only_what_changed(
        cluster: EmbeddedCluster, cluster_client: RedisCluster) -> None:
    prefix = "dashcluster"
    breakers = [CircuitBreaker(f"t{i}", redis=cluster_client, prefix=prefix, key_ttl=300)
                for i in range(12)]
    for b in breakers:
        b.call(lambda: None)
    RateLimiter("partner", redis=cluster_client, prefix=prefix, key_ttl=300).acquire()
    pool = Pool("llm", redis=cluster_client, prefix=prefix, members=["a", "b"])
    pool.record(pool.pick(), status=200)
    sent: list[tuple[str, dict[str, Any]]] = []
    hub = Hub(lambda: cluster.client(), prefix, 0.5)
    hub._broadcast = lambda kind, data: sent.append((kind, data))  # type: ignore[method-assign]
    try:
        hub._tick(cluster_client, set(), whole=True)
        snapshot = hub.first_messages()[-1][1]
        assert {r["name"] for r in snapshot["rows"]} == {*(f"t{i}" for i in range(12)),
                                                         "partner"}
        assert [p["pool"] for p in snapshot["pools"]] == ["llm"]
        assert "error" not in snapshot["pools"][0]
        time.sleep(1.05)
        hub._tick(cluster_client, set())              # every row's first rates (0/s)
        sent.clear()
        breakers[5].call(lambda: None)
        hub._tick(cluster_client, set())
        rows = [r["name"] for kind, data in sent if kind == "update" for r in data["rows"]]
        assert rows == ["t5"]
    finally:
        pool.reset()
        pool.close()
        for b in breakers:
            b.reset()
