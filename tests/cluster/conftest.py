"""A real 3-primary Redis Cluster for the session (redis-server processes on free ports)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from distbreaker.demo.embedded import EmbeddedCluster

#: How a fleet should build its cluster client: tight timeouts, no client-side retries
#: (distbreaker's backoff and local fallback handle an unreachable node).
CLIENT_OPTIONS = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0,
                  "retry": Retry(NoBackoff(), 0)}


@pytest.fixture(scope="session")
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(primaries=3) as running:
        yield running


@pytest.fixture
def cluster_client(cluster: EmbeddedCluster) -> Iterator[RedisCluster]:
    client = cluster.client(**CLIENT_OPTIONS)
    yield client
    client.close()
