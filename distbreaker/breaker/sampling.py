"""Outcome recording, the client's part: which record calls carry a sample.

Recording is opt-in (docs/KEY_SCHEMA.md, "Outcome recording"): a record call the
client picked carries ARGV[12] ``<maxlen>;<ttl_ms>;<rate_ppm>;<worker>`` and the
breaker script appends its outcome to the capped stream ``<state key>:rec`` in the
same call. Calls not picked carry nothing (the hot path is unchanged). The rate comes
from the config (`record_sample_rate`) or, while an operator's ``distbreaker record
start`` is in force, from the switch the worker learns at its hello (about every 20 s:
reply element 21). Pure: the random draw is the only input besides the clock.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

#: Suffixes of the recording keys after the breaker's state key (same hash tag).
STREAM_SUFFIX = ":rec"
SWITCH_SUFFIX = ":rec:on"
#: Rates travel as parts per million.
PPM = 1_000_000
MAX_SAMPLES = 1_000_000


def parse_rate(value: Any, field: str = "record_sample_rate") -> float:
    """A sample rate as a fraction in [0, 1]: a number, or a string ``"10%"`` / ``"0.1"``."""
    raw = value
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
        except ValueError:
            raise ValueError(f"{field} must be a fraction in [0, 1] or a percentage "
                             f"like '10%', got {raw!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{field} must be a fraction in [0, 1] or a percentage like "
                         f"'10%', got {raw!r}")
    return float(value)


def to_ppm(rate: float) -> int:
    return max(0, min(PPM, round(rate * PPM)))


class Sampler:
    """One breaker's sampling decision: the config's rate, or the operator's switch
    while it is in force (it wins, stopping included: rate 0). No lock (fork-safe): the
    switch is one tuple, replaced whole."""

    def __init__(self, rate: float, max_samples: int, ttl_ms: int,
                 draw: Any = random.random) -> None:
        self._base = (to_ppm(rate), max_samples, ttl_ms)
        #: (rate ppm, maxlen, ttl ms, monotonic end) of the operator's switch, or None.
        self._switch: tuple[int, int, int, float] | None = None
        self._draw = draw

    @property
    def active(self) -> bool:
        return self._current()[0] > 0

    def _current(self) -> tuple[int, int, int]:
        switch = self._switch
        if switch is not None:
            if time.monotonic() < switch[3]:
                return switch[0], switch[1], switch[2]
            self._switch = None   # it ended: the config's rate again
        return self._base

    def learn(self, answer: str, now_ms: int) -> None:
        """A hello's reply element 21: the switch (rate 0: stopped; it lasts until its
        end, then the config's rate applies again)."""
        parts = answer.split(";") if answer else []
        try:
            rate, until = int(parts[0]), int(parts[1])
            maxlen = int(parts[2]) if parts[2] else self._base[1]
            ttl = int(parts[3]) if parts[3] else self._base[2]
        except (ValueError, IndexError):
            self._switch = None
            return
        self._switch = (max(0, min(PPM, rate)), max(1, min(MAX_SAMPLES, maxlen)),
                        max(1000, ttl), time.monotonic() + max(0, until - now_ms) / 1000.0)

    def spec(self, worker: Callable[[], str]) -> str | None:
        """ARGV[12] for this record call when it is sampled, else None (recording off
        costs one comparison: no clock, no draw)."""
        if self._switch is None:
            rate, maxlen, ttl = self._base
        else:
            rate, maxlen, ttl = self._current()
        if rate <= 0 or (rate < PPM and self._draw() * PPM >= rate):
            return None
        return f"{maxlen};{ttl};{rate};{worker()}"
