"""One duration parser (`_runtime.options.to_seconds`) for keyword arguments, registry
files, the environment and the CLI's --for: the same strings mean the same everywhere."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from distbreaker import BreakerConfig, CircuitBreaker, Retry
from distbreaker._runtime.options import to_seconds
from distbreaker.cli.actions import parse_duration as cli_duration
from distbreaker.registry.config import RegistrySpec

CASES = [(90, 90.0), (2.5, 2.5), ("90", 90.0), ("30s", 30.0), ("1m30s", 90.0),
         ("1h 30m", 5400.0), ("250ms", 0.25), ("1.5h", 5400.0), ("2d", 172800.0),
         ("PT30S", 30.0), ("PT1M30S", 90.0), ("pt0.25s", 0.25), ("P1DT2H", 93600.0),
         (timedelta(minutes=1, seconds=30), 90.0)]


@pytest.mark.parametrize(("value", "seconds"), CASES)
def test_every_entry_point_reads_a_duration_alike(value: Any, seconds: float) -> None:
    assert to_seconds(value, "f") == seconds
    assert BreakerConfig(slow_call_duration=value).slow_call_duration == seconds
    assert CircuitBreaker("d", redis="memory://",
                          slow_call_duration=value).config.slow_call_duration == seconds
    assert Retry(max_attempts=2, cap=value).config.cap == seconds
    spec = RegistrySpec({"breakers": {"instances": {"a": {"slow_call_duration": value}}}},
                        environ={})
    assert spec.instances["breaker"]["a"].config.slow_call_duration == seconds
    if not isinstance(value, timedelta):
        env = {"DISTBREAKER_BREAKER_A_SLOW_CALL_DURATION": str(value)}
        spec = RegistrySpec({"breakers": {"instances": {"a": {}}}}, environ=env)
        assert spec.instances["breaker"]["a"].config.slow_call_duration == seconds
        assert cli_duration(str(value)) == seconds


@pytest.mark.parametrize("value", ["30x", "1m30", "PT", "P1Y", "-5s", "", "soon", "1h30mm"])
def test_a_bad_duration_is_refused_everywhere_naming_the_field(value: str) -> None:
    with pytest.raises(ValueError, match="wait_duration_in_open_state must be a duration"):
        BreakerConfig(wait_duration_in_open_state=value)
    with pytest.raises(ValueError, match="--for"):
        cli_duration(value)
    with pytest.raises(ValueError, match="half_open_lease"):
        RegistrySpec({"breakers": {"instances": {"a": {"half_open_lease": value}}}},
                     environ={})
