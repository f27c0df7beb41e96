"""A fake clock for retry tests and a dependency that fails a set number of times."""

from __future__ import annotations


class FakeTime:
    """A monotonic clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


class Flaky:
    """Raises `errors` one by one, then returns "ok"; counts calls."""

    def __init__(self, *errors: BaseException, forever: BaseException | None = None) -> None:
        self.errors = list(errors)
        self.forever = forever
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        if self.forever is not None:
            raise self.forever
        return "ok"


def check_exhausted(error: BaseException, name: str) -> None:
    """The final error is marked (and, where notes exist, noted) as the budget's refusal."""
    assert getattr(error, "retry_budget_exhausted", False) is True
    notes = getattr(error, "__notes__", None)
    if hasattr(error, "add_note"):
        assert notes and f"retry budget {name!r} is exhausted" in notes[-1]
