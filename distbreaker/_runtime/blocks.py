"""The permits of open ``with component:`` blocks, per thread (sync) or per task (asyncio).

A block's permit cannot live on the component: one component serves many threads
or tasks at once. Each flavour keeps a stack of (component, value) entries, innermost
last; `pop` takes the innermost entry of that component.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from typing import Any


class ThreadBlocks:
    """The open blocks of the current thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def push(self, owner: object, value: Any) -> None:
        self._local.__dict__.setdefault("stack", []).append((owner, value))

    def pop(self, owner: object) -> Any:
        stack: list[tuple[object, Any]] = self._local.stack
        index = max(i for i, block in enumerate(stack) if block[0] is owner)
        return stack.pop(index)[1]


class TaskBlocks:
    """The open blocks of the current asyncio task, in one ContextVar (ContextVars must
    not be created per instance: contexts keep them alive) holding an immutable tuple,
    so tasks spawned inside a block, which copy the context, never pop their parent's."""

    def __init__(self, name: str, what: str) -> None:
        self._var: ContextVar[tuple[tuple[object, Any], ...]] = ContextVar(name, default=())
        self._what = what  # for the error: "async with bulkhead"

    def push(self, owner: object, value: Any) -> None:
        self._var.set((*self._var.get(), (owner, value)))

    def pop(self, owner: object) -> Any:
        blocks = self._var.get()
        found = [i for i, block in enumerate(blocks) if block[0] is owner]
        if not found:
            raise RuntimeError(f"{self._what}: exit without a matching enter in this task")
        index = found[-1]
        self._var.set(blocks[:index] + blocks[index + 1:])
        return blocks[index][1]
