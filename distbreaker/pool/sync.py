"""The fleet-wide pool, sync front end: I/O only.

`pick()` a member, call it, `record()` how it went (or ``with pool.use() as pick:``); the
members' health lives in ``lua/pool.lua`` on Redis time, every other decision in
`pool.core`. The methods are in `_shell_sync.py`, generated from `_shell_aio.py` by
scripts/unasync.py.
"""

from __future__ import annotations

from ._shell_sync import PoolShell, PoolUse
from .core import MemberStatus, Pick, PoolStatus

__all__ = ["MemberStatus", "Pick", "Pool", "PoolStatus", "PoolUse"]


class Pool(PoolShell):
    """A named set of members (hosts, URLs, deployments) with one health record per
    member shared by the whole fleet.

    Envoy's outlier detection made fleet-wide: consecutive 5xx / gateway / local-origin
    failures, success-rate, failure-percentage and latency outliers eject a member for
    ``base_ejection_time x ejections`` (up to `max_ejection_time`), never more than
    `max_ejection_percent` of the pool at once (decided atomically by one script for the
    whole fleet); with fewer than `healthy_panic_threshold` percent healthy, picks go to
    every member (panic). A member back from ejection gets `probe_calls` probes first (at
    most that many in flight). `pick()` is the power of two choices on fleet-wide in-flight
    counts (or latency). Keyword arguments override fields of `config` (a `PoolConfig`).
    """
