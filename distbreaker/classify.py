"""Outcome classification of exceptions, in Resilience4j's order."""

from __future__ import annotations

from enum import Enum

from .config import BreakerConfig


class Outcome(str, Enum):
    """How one finished call counts in the window."""

    SUCCESS = "success"
    FAILURE = "failure"
    IGNORED = "ignored"


def classify_exception(config: BreakerConfig, exc: BaseException) -> Outcome:
    """Ignore wins; then record_exceptions / record_predicate; not recorded => success.

    Exceptions that are not `Exception` (KeyboardInterrupt, asyncio's
    CancelledError, SystemExit) say nothing about the dependency: ignored.
    """
    if not isinstance(exc, Exception):
        return Outcome.IGNORED
    if isinstance(exc, config.ignore_exceptions) or (
            config.ignore_predicate is not None and config.ignore_predicate(exc)):
        return Outcome.IGNORED
    if config.record_exceptions:
        recorded = isinstance(exc, config.record_exceptions) or (
            config.record_predicate is not None and bool(config.record_predicate(exc)))
    elif config.record_predicate is not None:
        recorded = bool(config.record_predicate(exc))
    else:
        recorded = True
    return Outcome.FAILURE if recorded else Outcome.SUCCESS
