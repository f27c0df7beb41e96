"""scripts/bench.py's batched-mode, interlock-cb and fleet detection-cost parts.

Kept in their own module so bench.py stays readable; bench.py imports them.

* `batched_scenarios`: distbreaker ``record_mode="batched"`` CLOSED success
  path (0 round trips on the call; the flusher's pipelines are counted too).
* `interlock_scenarios`: interlock-cb (PyPI ``interlock-cb``) with its
  ``RedisStorage``: a per-process window, shared OPEN state, 0 round trips.
* `detection_cost`: 16 forked processes call a dependency that fails after
  5 ms (minimum 10 calls, 50 % failure threshold, count window of 10); each
  stops at its first rejection; reported: dependency calls the fleet made
  before every process rejects, per library.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import time
from collections.abc import Callable
from typing import Any

import redis

from distbreaker import CircuitBreaker
from distbreaker.errors import CallNotPermitted

FLEET = 16
DEPENDENCY_LATENCY = 0.005
MINIMUM_CALLS = 10
DETECTION_TIMEOUT = 15.0


def ok() -> str:
    return "ok"


class DependencyDown(Exception):
    pass


_dependency_calls = 0  # per process (each worker is its own process)


def failing_dependency() -> None:
    global _dependency_calls
    _dependency_calls += 1
    time.sleep(DEPENDENCY_LATENCY)
    raise DependencyDown("dependency down")


# -- throughput scenarios ------------------------------------------------------------

def batched_scenarios(url: str, name: str, scenario: Any, counting_client: Any) -> list[Any]:
    """The batched CLOSED success path; each slice ends with a flush (counted)."""
    breaker = CircuitBreaker(name, redis=counting_client(url), record_mode="batched")
    breaker.reset()
    return [scenario("batched_closed", "distbreaker batched CLOSED success",
                     lambda: breaker.call(ok), finish=breaker.flush)]


def interlock_available() -> bool:
    try:
        import interlock
        import interlock.integrations.redis  # noqa: F401
    except ImportError:
        return False
    return True


def interlock_breaker(client: redis.Redis, name: str) -> Any:
    from interlock import CircuitBreaker as InterlockBreaker
    from interlock import Config
    from interlock.integrations.redis import RedisStorage

    config = Config(failure_rate_threshold=0.5, minimum_number_of_calls=MINIMUM_CALLS,
                    window_size=MINIMUM_CALLS, wait_duration_in_open=3600.0)
    return InterlockBreaker(name=name, config=config,
                            storage=RedisStorage(client, key_prefix="bench:interlock:"))


def interlock_scenarios(url: str, tag: str, scenario: Any, counting_client: Any) -> list[Any]:
    if not interlock_available():
        print("interlock-cb is not installed (pip install interlock-cb): skipping it")
        return []
    breaker = interlock_breaker(counting_client(url), f"{tag}-interlock")
    return [scenario("interlock_closed", "interlock-cb+Redis CLOSED success",
                     lambda: breaker.call(ok))]


# -- fleet detection cost --------------------------------------------------------------

def _distbreaker_factory(record_mode: str) -> Callable[[str, str], Any]:
    def make(url: str, name: str) -> Any:
        breaker = CircuitBreaker(name, redis=url, record_mode=record_mode, redis_timeout=2.0,
                                 sliding_window_size=MINIMUM_CALLS,
                                 minimum_number_of_calls=MINIMUM_CALLS,
                                 failure_rate_threshold=50.0,
                                 wait_duration_in_open_state=3600.0)
        breaker.state  # noqa: B018 - learn the fleet state before the start line
        return breaker
    return make


def _pybreaker_factory(url: str, name: str) -> Any:
    import pybreaker

    storage = pybreaker.CircuitRedisStorage(pybreaker.STATE_CLOSED, redis.Redis.from_url(url),
                                            namespace=name)
    return pybreaker.CircuitBreaker(fail_max=MINIMUM_CALLS, reset_timeout=3600,
                                    state_storage=storage)


def _interlock_factory(url: str, name: str) -> Any:
    return interlock_breaker(redis.Redis.from_url(url), name)


def _rejections() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [CallNotPermitted]
    try:
        import pybreaker
        types.append(pybreaker.CircuitBreakerError)
    except ImportError:
        pass
    if interlock_available():
        from interlock import CircuitOpenError
        types.append(CircuitOpenError)
    return tuple(types)


def _worker(make: Callable[[str, str], Any], url: str, name: str, start: Any,
            results: Any) -> None:
    outcome = "timeout"
    try:
        breaker = make(url, name)
        rejected = _rejections()
        start.wait(30)
        deadline = time.monotonic() + DETECTION_TIMEOUT
        while time.monotonic() < deadline:
            try:
                breaker.call(failing_dependency)
            except DependencyDown:
                continue
            except rejected:  # (pybreaker raises it from the call that trips, too)
                outcome = "rejected"
                break
    except Exception as error:  # an overloaded machine: report, do not hang the bench
        outcome = f"error: {type(error).__name__}: {error}"
    results.put((_dependency_calls, outcome))
    results.close()
    results.join_thread()  # the item is in the pipe before the process leaves


def detection_libraries() -> dict[str, Callable[[str, str], Any]]:
    libraries: dict[str, Callable[[str, str], Any]] = {
        "distbreaker exact": _distbreaker_factory("exact"),
        "distbreaker batched": _distbreaker_factory("batched"),
    }
    try:
        import pybreaker  # noqa: F401
        libraries["pybreaker+Redis"] = _pybreaker_factory
    except ImportError:
        print("pybreaker is not installed: skipping it in the detection cost")
    if interlock_available():
        libraries["interlock-cb+Redis"] = _interlock_factory
    else:
        print("interlock-cb is not installed: skipping it in the detection cost")
    return libraries


def detection_cost(url: str, tag: str, rounds: int = 1,
                   fleet: int = FLEET) -> dict[str, dict[str, Any]]:
    """Dependency calls a fleet of `fleet` processes makes before all of them reject."""
    context = multiprocessing.get_context("fork")
    report: dict[str, dict[str, Any]] = {}
    for label, make in detection_libraries().items():
        totals: list[int] = []
        timeouts = 0
        for index in range(rounds):
            name = f"{tag}-detect-{label.split()[0]}-{label.split()[-1]}-{index}"
            start, results = context.Event(), context.Queue()
            workers = [context.Process(target=_worker, args=(make, url, name, start, results))
                       for _ in range(fleet)]
            for worker in workers:
                worker.start()
            time.sleep(0.3)  # every worker built its breaker and waits at the start line
            start.set()
            got = [results.get(timeout=DETECTION_TIMEOUT + 30) for _ in range(fleet)]
            for worker in workers:
                worker.join(10)
            totals.append(sum(calls for calls, _ in got))
            timeouts += sum(1 for _, outcome in got if outcome != "rejected")
        report[label] = {"dependency_calls": round(sum(totals) / len(totals), 1),
                         "runs": totals, "processes_never_rejecting": timeouts}
    return report


def detection_ratios(report: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each library's detection cost relative to distbreaker batched (higher: costlier)."""
    base = report.get("distbreaker batched", {}).get("dependency_calls")
    if not base:
        return {}
    return {f"{label} / distbreaker batched": round(entry["dependency_calls"] / base, 2)
            for label, entry in report.items() if label != "distbreaker batched"}


def print_detection(report: dict[str, dict[str, Any]]) -> None:
    print(f"\nfleet detection cost: {FLEET} processes, dependency fails after "
          f"{DEPENDENCY_LATENCY * 1000:g} ms, minimum {MINIMUM_CALLS} calls, 50 % threshold")
    print(f"{'library':24} {'dependency calls before every process rejects':>46}  runs")
    for label, entry in report.items():
        never = entry["processes_never_rejecting"]
        note = f"  ({never} process(es) never rejected)" if never else ""
        print(f"{label:24} {entry['dependency_calls']:46.1f}  {entry['runs']}{note}")
    for label, value in detection_ratios(report).items():
        print(f"  {label:44} {value:8.2f}x")


# -- bench.py's command line ------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--detection", action="store_true",
                        help=f"also measure the fleet detection cost ({FLEET} processes)")
    parser.add_argument("--detection-rounds", type=int, default=1,
                        help="--detection: runs per library, averaged (default 1)")


def detection(options: argparse.Namespace, url: str) -> dict[str, dict[str, Any]] | None:
    if not options.detection:
        return None
    return detection_cost(url, f"bench-{os.getpid()}-{secrets.token_hex(3)}",
                          max(1, options.detection_rounds))


def detection_json(report: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    if report is None:
        return {}
    return {"detection": report, "detection_ratios": detection_ratios(report)}
