"""What the server ran, from INFO commandstats: the round-trip assertions' one source.

Redis counts the commands a script runs too, so a round trip is one FCALL (or EVALSHA,
EVAL: the EVAL form); the other names are what the scripts did inside.
"""

from __future__ import annotations

import redis

SCRIPT_CALLS = ("fcall", "fcall_ro", "evalsha", "eval", "evalsha_ro", "eval_ro")
_NOT_COUNTED = ("info", "config|resetstat")


def commands(client: redis.Redis) -> dict[str, int]:
    """Commands run since the last CONFIG RESETSTAT, by name (INFO and CONFIG excluded)."""
    stats = client.info("commandstats")
    counts = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    return {k: v for k, v in counts.items() if k not in _NOT_COUNTED}


def round_trips(client: redis.Redis) -> int:
    """Script calls (FCALL, EVALSHA, EVAL and their read-only forms)."""
    counts = commands(client)
    return sum(counts.get(c, 0) for c in SCRIPT_CALLS)


def script_commands(client: redis.Redis) -> int:
    """Commands run inside scripts."""
    return sum(v for k, v in commands(client).items() if k not in SCRIPT_CALLS)
