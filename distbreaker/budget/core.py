"""The retry budget's pure core, shared by the sync and asyncio front ends (no I/O).

It builds the ``lua/budget.lua`` calls, batches deposits, decodes replies and keeps
the Redis health and the local fallback budget; the front ends only send the calls.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from .._runtime import forking
from .._runtime.health import shared_health
from .._runtime.keys import DEFAULT_PREFIX, BudgetKeys, validate_name
from .._runtime.local import LocalScriptRunner
from .._runtime.options import check_int, to_ms
from .._runtime.scripts import Owed, PendingCall, load_script
from ..errors import ConfigDriftWarning, RetryBudgetExhausted
from .config import BudgetConfig, build_budget_config

SCRIPT_NAME = "budget"


@dataclasses.dataclass(frozen=True)
class BudgetReply:
    """A decoded budget script reply (see lua/budget.lua)."""

    ok: bool
    balance: int
    deposits: int
    withdrawals: int
    now_ms: int
    drift: bool


def decode_budget_reply(raw: Sequence[Any] | int) -> BudgetReply:
    """The script's reply array; or the integer drift flag an `add` answers (a deposit
    whose figures the caller does not need)."""
    if isinstance(raw, int):
        return BudgetReply(ok=True, balance=0, deposits=0, withdrawals=0, now_ms=0,
                           drift=bool(raw))
    return BudgetReply(ok=bool(int(raw[0])), balance=int(raw[1]), deposits=int(raw[2]),
                       withdrawals=int(raw[3]), now_ms=int(raw[4]), drift=bool(int(raw[5])))


class BudgetCore:
    """Everything about one retry budget that is neither I/O nor a front end.

    While Redis is unreachable the same script runs on a private in-process
    fakeredis (`LocalScriptRunner`): the local budget has the same formula and
    window, scoped to this process, so during an outage the fleet may retry up
    to `workers x floor` + `percent_can_retry` of its requests. When Redis
    answers again the local budget is discarded.
    """

    #: The Redis client (set by the front end).
    _client: Any

    def __init__(self, name: str, config: BudgetConfig | None, prefix: str,
                 overrides: dict[str, Any], redis: Any = None) -> None:
        self.name = validate_name(name)
        self.config = build_budget_config(config, overrides)
        self.keys = BudgetKeys.build(name, prefix or DEFAULT_PREFIX)
        self._script = load_script(SCRIPT_NAME)
        #: Shared with the process's other components of the same Redis.
        self._health = shared_health(redis, self.config.redis_retry_max_backoff)
        self._local = LocalScriptRunner()
        self._local_used = False
        self._drift_warned = False
        self.last_source = "redis"   # where the last answer came from: "redis" or "local"
        self._pending_deposits = 0
        self._pending_lock = threading.Lock()
        cfg = self.config
        self._args = (str(cfg.percent_millionths), str(cfg.reserve_millionths),
                      str(to_ms(cfg.ttl)), str(cfg.slices))
        forking.register(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock; batched deposits stay the parent's to send."""
        self._pending_lock = threading.Lock()
        self._pending_deposits = 0

    def script_args(self, op: str, amount: int = 0) -> list[str]:
        """ARGV of one budget script call: `amount` deposits (for withdraw and
        balance: carried deposits, added first; ARGV[7])."""
        if op in ("deposit", "add"):  # ARGV[6] defaults to 1 (each argument costs Redis)
            return [op, *self._args] if amount == 1 else [op, *self._args, str(amount)]
        return [op, *self._args, "1", str(amount)]

    def deposit_args(self, amount: int, op: str = "deposit") -> list[str] | None:
        """Count `amount` deposits; the deposit call to make now, or None (batched).
        `op` "add": a deposit whose reply carries only the drift flag (no balance)."""
        check_int(amount, "amount", 1, 1_000_000_000)
        with self._pending_lock:
            self._pending_deposits += amount
            if self._pending_deposits < self.config.deposit_batch:
                return None
            amount, self._pending_deposits = self._pending_deposits, 0
        return self.script_args(op, amount)

    def _pending(self, args: list[str]) -> PendingCall:
        """One script call; its result is the reply from Redis or, while Redis is
        unavailable, from this process's local budget."""

        def answered(raw: Any) -> BudgetReply:
            self._redis_ok()
            return self._decode(raw, "redis")

        def unavailable(error: BaseException | None) -> BudgetReply:
            if error is not None:
                self._health.failed(error)
            self._local_used = True
            return self._decode(self._local.run(self._script, [self.keys.slices], args),
                                "local")

        return PendingCall(self._script, [self.keys.slices], args, self._health.usable,
                           answered, unavailable)

    def owed_deposit(self, amount: int = 1) -> Owed | None:
        """Count deposits; the deposit call owed now (sent by a Policy with its release and
        record, which needs no balance back: an `add`), or None."""
        args = self.deposit_args(amount, "add")
        return None if args is None else Owed(self._client, self._pending(args))

    def carrying_args(self, op: str) -> list[str]:
        """A withdraw or balance call that also carries the pending deposits."""
        with self._pending_lock:
            amount, self._pending_deposits = self._pending_deposits, 0
        return self.script_args(op, amount)

    def flush_args(self) -> list[str] | None:
        """The deposit call sending the pending deposits now, or None if there are none."""
        with self._pending_lock:
            amount, self._pending_deposits = self._pending_deposits, 0
        return self.script_args("deposit", amount) if amount else None

    @property
    def local_fallback_active(self) -> bool:
        """True while Redis is marked unreachable and this process's own budget answers."""
        return self._health.down

    def _redis_ok(self) -> None:
        if self._local_used:  # Redis answers again: the fleet's budget governs
            self._local_used = False
            self._local.reset([self.keys.slices])
        self._health.succeeded()

    def _decode(self, raw: Sequence[Any] | None, source: str) -> BudgetReply:
        if raw is None:  # the local fallback is still loading: no retry (the safe side)
            self.last_source = source
            return BudgetReply(ok=False, balance=0, deposits=0, withdrawals=0, now_ms=0,
                               drift=False)
        reply = decode_budget_reply(raw)
        self.last_source = source
        if reply.drift and not self._drift_warned and source == "redis":
            self._drift_warned = True
            warnings.warn(
                f"retry budget {self.name!r}: the stored window geometry differs from this "
                f"process's ttl/slices; the stored one is used until the key expires or "
                f"reset() is called", ConfigDriftWarning, stacklevel=4)
        return reply

    def check_withdrawal(self, reply: BudgetReply) -> None:
        """Raise `RetryBudgetExhausted` unless the withdrawal `reply` answers was granted."""
        if not reply.ok:
            raise RetryBudgetExhausted(self.name, reply.balance, reply.deposits,
                                       reply.withdrawals)
    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
