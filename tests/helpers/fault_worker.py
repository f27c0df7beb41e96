"""A worker process of the fault-injection fleet test: calls one breaker until told to
stop, counting its outcomes into a Redis hash the test reads.

    python -m tests.helpers.fault_worker URL NAME sync|asyncio allow|deny
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

import redis

import distbreaker
import distbreaker.aio
from distbreaker import InjectedFault, InjectedRejection

CONFIG = {"sliding_window_size": 1000, "minimum_number_of_calls": 1000,
          "redis_timeout": 5.0, "key_ttl": 600.0}
SECONDS = 90.0


def report_key(name: str) -> str:
    return f"test:faults:{name}"


def kind(error: BaseException) -> str:
    return "injected" if isinstance(error, InjectedFault) else "rejected"


def outcome(call: Callable[[], object]) -> str:
    """How one protected call ended: ok, injected (an error) or rejected (injected)."""
    try:
        call()
    except (InjectedFault, InjectedRejection) as error:
        return kind(error)
    return "ok"


def main() -> None:
    url, name, flavour, allow = sys.argv[1:5]
    config = {**CONFIG, "allow_fault_injection": allow == "allow"}
    reports = redis.Redis.from_url(url)
    key = report_key(name)

    def count(field: str) -> bool:
        """Count one outcome; False once the test says stop."""
        pipe = reports.pipeline()
        pipe.hincrby(key, field, 1).expire(key, 300).hget(key, "stop")
        return pipe.execute()[2] is None

    end = time.monotonic() + SECONDS
    if flavour == "sync":
        breaker = distbreaker.CircuitBreaker(name, redis=url, **config)
        while time.monotonic() < end and count(outcome(lambda: breaker.call(lambda: "ok"))):
            time.sleep(0.01)
        breaker.close()
        return

    async def run() -> None:
        breaker = distbreaker.aio.CircuitBreaker(name, redis=url, **config)

        async def ok() -> str:
            return "ok"

        while time.monotonic() < end:
            try:
                await breaker.call(ok)
                field = "ok"
            except (InjectedFault, InjectedRejection) as error:
                field = kind(error)
            if not count(field):
                break
            await asyncio.sleep(0.01)
        await breaker.aclose()

    asyncio.run(run())


if __name__ == "__main__":
    main()
