"""Replay a recorded timeline against candidate configs on the REAL breaker script.

Each config runs the timeline on its own keys of a throwaway Redis (the CLI starts an
embedded ``redis-server``): the same `lua/breaker.lua` the fleet runs, on the recorded
time. The clock: the script's entry already takes the server time from its caller (a
merged call, ``lua/finish.lua``, reads TIME once for three scripts); the replay's EVAL
form is the production EVAL form whose last line passes ARGV[1] as that time instead of
reading TIME, so ARGV[1] is the recorded ms and ARGV[2..] the usual arguments. That
form exists only here and is only ever sent to the replay's own server: the production
library and EVAL forms never take a time from their arguments, so no production call
can be fooled by it, and nothing on the wire changes (docs/KEY_SCHEMA.md, "Replay").

Like a worker, the replay asks Redis only when its view needs it: a call while the
last reply said CLOSED is permitted locally (0 round trips, as the Python client), a
call during a known OPEN wait is rejected locally, anything else is an `acquire`; every
permitted call's outcome is a `record` at its end (a probe's with its token).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from .._runtime.keys import BreakerKeys
from .._runtime.scripts import eval_form, lua_dir
from ..breaker.config import BreakerConfig
from ..breaker.core import config_fingerprint, decode_reply
from ..breaker.state import State
from .replay_core import ACQUIRE, ReplayResult, Tally, Truth, plan, weights
from .timeline import Sample

REPLAY_PREFIX = "distbreaker-replay"
_ENTRY = "return main(KEYS, ARGV)\n"
#: The clock override: ARGV[1] is the time (ms); the open wait's random draw is the
#: middle of its spread (microseconds 500), so a replay is deterministic.
_REPLAY_ENTRY = """local at = tonumber(ARGV[1])
local args = {}
for i = 2, #ARGV do args[i - 1] = ARGV[i] end
return main(KEYS, args, at, 500)
"""


def replay_source() -> str:
    """The breaker's EVAL form with the clock taken from ARGV[1] (replay only)."""
    source = eval_form((lua_dir() / "breaker.lua").read_text(encoding="utf-8"))
    if not source.endswith(_ENTRY):
        raise RuntimeError("lua/breaker.lua's EVAL form no longer ends with its entry call")
    return source[: -len(_ENTRY)] + _REPLAY_ENTRY


class Replayer:
    """Runs timelines on one Redis client (a throwaway server: it writes keys under
    ``distbreaker-replay``, each with the config's key TTL)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sha = client.script_load(replay_source())

    def _eval(self, keys: list[str], t_ms: int, args: Sequence[Any]) -> Any:
        return decode_reply(self.client.evalsha(self.sha, len(keys), *keys, t_ms, *args))

    def run(self, samples: Sequence[Sample], config: BreakerConfig, *, target: float,
            truth_window_ms: int = 5_000, truth_min_calls: int = 10, scale: bool = True,
            label: str = "", changes: dict[str, Any] | None = None) -> ReplayResult:
        """Replay `samples` (sorted by time) with `config`; the result judged against
        `target` (percent)."""
        w = weights(samples, scale)
        truth = Truth(samples, w, truth_window_ms, truth_min_calls)
        start = samples[0].t_ms if samples else 0
        end = samples[-1].t_ms if samples else 0
        tally = Tally(label, changes or {}, start)
        name = f"r{secrets.token_hex(6)}"
        keys = BreakerKeys.build(name, REPLAY_PREFIX)
        wire = config.to_wire()
        head = (str(config_fingerprint(wire)), wire, name, keys.channel)
        view, open_until = State.CLOSED, 0
        pending: dict[int, str] = {}   # sample index -> probe token ('' none)

        def apply(reply: Any) -> None:
            nonlocal view, open_until
            for frm, to, _ in reply.transitions:
                tally.transition(reply.now_ms, frm.value, to.value)
            view = reply.state
            open_until = reply.now_ms + reply.wait_ms if view is State.OPEN else 0

        for step in plan(samples):
            sample, weight = samples[step.index], w[step.index]
            if step.kind == ACQUIRE:
                if view is State.CLOSED:
                    pending[step.index] = ""
                    continue
                if view is State.OPEN and step.t_ms < open_until:
                    tally.rejected(sample, weight)
                    continue
                token = secrets.token_hex(8)
                reply = self._eval([keys.state], step.t_ms, ("acquire", *head, token))
                apply(reply)
                if reply.permitted:
                    pending[step.index] = token if reply.state is State.HALF_OPEN else ""
                else:
                    tally.rejected(sample, weight)
                continue
            probe = pending.pop(step.index, None)
            if probe is None:
                continue
            # a probe is one call: the sample's own counts; the calls it stands for
            # beyond it were turned away with the probes' slots taken
            n = 1 if probe else weight
            if probe and weight > 1:
                tally.rejected(sample, weight - 1)
            tally.permitted(sample, n)
            reply = self._eval([keys.state], step.t_ms,
                               ("record", *head, probe, sample.ok * n, sample.failed * n,
                                sample.slow * n, sample.duration_ms * n))
            apply(reply)
        return tally.result(end, truth, target)
