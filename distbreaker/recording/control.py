"""Outcome recording, the operator's part: the run-time switch (`distbreaker record
start` / `stop`), its status, and reading the recorded stream (`record export`).

The switch is the hash ``<state key>:rec:on`` (rate in parts per million, `until`
server ms, `max` entries, `ttl` ms, `actor`, `at`, and `v`: the four numbers as one
field ``rate;until;max;ttl``, which hellos read), expiring by itself at `until`
(`stop` leaves rate 0 for a minute: workers hear it at their next hello);
workers learn it at their next hello (about every 20 s) and sample that share of their
record calls into ``<state key>:rec`` (docs/KEY_SCHEMA.md, "Outcome recording").
Each function is one Redis command or transaction; nothing here decides for a worker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from .._runtime.keys import DEFAULT_PREFIX, BreakerKeys
from .._runtime.scripts import text
from ..breaker.sampling import MAX_SAMPLES, STREAM_SUFFIX, SWITCH_SUFFIX, to_ppm
from ..errors import SchemaError
from .timeline import Sample

#: XRANGE page size of an export.
PAGE = 1000


def stream_key(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    return BreakerKeys.build(name, prefix).state + STREAM_SUFFIX


def switch_key(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    return BreakerKeys.build(name, prefix).state + SWITCH_SUFFIX


def breaker_exists(client: Any, name: str, prefix: str = DEFAULT_PREFIX) -> bool:
    return bool(client.exists(BreakerKeys.build(name, prefix).state))


def _number(value: Any) -> int | None:
    """A stored integer field, or None when it is not one (foreign data)."""
    try:
        return int(text(value))
    except (TypeError, ValueError):
        return None


def _switch_fields(key: str, raw: dict[Any, Any] | None) -> dict[str, str]:
    """The switch hash's fields, refusing one whose numbers are not ours."""
    fields = {text(k): text(v) for k, v in (raw or {}).items()}
    for field in ("rate", "until"):
        if field in fields and fields[field] != "" and _number(fields[field]) is None:
            raise SchemaError(f"foreign or corrupt data: {key} field {field!r} is "
                              f"{fields[field][:40]!r}, not an integer", key=key)
    return fields


def _check_switch_type(client: Any, key: str) -> None:
    """Refuse to overwrite a key of another type (foreign data is never destroyed)."""
    kind = text(client.type(key))
    if kind not in ("none", "hash"):
        raise SchemaError(f"foreign or corrupt data: {key} holds a {kind}, expected a hash",
                          key=key)


def _server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@dataclasses.dataclass(frozen=True)
class RecordingStatus:
    """What `record status` shows: the switch (if on) and the stream."""

    name: str
    switch_rate: float | None      # None: no operator switch in force
    switch_until_ms: int | None
    switch_actor: str
    samples: int                   # entries in the stream now
    stream_ttl_s: float | None     # None: no stream
    now_ms: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def start(client: Any, name: str, rate: float, for_s: float, *, max_samples: int = 10_000,
          ttl_s: float = 86_400.0, actor: str = "", prefix: str = DEFAULT_PREFIX) -> int:
    """Turn recording on for `for_s` seconds at `rate` (a fraction); the switch's end
    (server ms). Workers follow from their next hello."""
    check_start(rate, for_s, max_samples, ttl_s)
    key = switch_key(name, prefix)
    _check_switch_type(client, key)
    now = _server_ms(client)
    until = now + round(for_s * 1000)
    pipe = client.pipeline(transaction=True)
    pipe.delete(key)
    ppm, ttl_ms = to_ppm(rate), round(ttl_s * 1000)
    pipe.hset(key, mapping={"rate": ppm, "until": until, "max": max_samples, "ttl": ttl_ms,
                            "actor": actor, "at": now,
                            "v": f"{ppm};{until};{max_samples};{ttl_ms}"})
    pipe.pexpireat(key, until)
    pipe.execute()
    return until


def check_start(rate: float, for_s: float, max_samples: int, ttl_s: float) -> None:
    """`start`'s arguments, checked before Redis is asked anything (ValueError names the
    option)."""
    if not 0 < rate <= 1:
        raise ValueError(f"--rate must be in (0, 100%], got {rate!r}")
    if not 1 <= max_samples <= MAX_SAMPLES:
        raise ValueError(f"--max must be in [1, {MAX_SAMPLES}], got {max_samples!r}")
    if for_s <= 0:
        raise ValueError(f"--for must be > 0 seconds, got {for_s!r}")
    if ttl_s < 1:
        raise ValueError(f"--ttl must be at least 1 second, got {ttl_s!r}")


#: How long `stop` leaves its "rate 0" switch: longer than the hello interval (20 s), so
#: every worker's next hello hears it.
STOP_NOTICE_MS = 60_000


def stop(client: Any, name: str, prefix: str = DEFAULT_PREFIX) -> bool:
    """Turn the operator's switch off: it becomes rate 0 for `STOP_NOTICE_MS`, so workers
    stop at their next hello (a config's own `record_sample_rate` applies again after
    that). The samples stay until their TTL. True if a switch was on."""
    key = switch_key(name, prefix)
    _check_switch_type(client, key)
    now = _server_ms(client)
    pipe = client.pipeline(transaction=True)
    pipe.hmget(key, "rate", "until")
    pipe.hset(key, mapping={"rate": 0, "until": now + STOP_NOTICE_MS,
                            "v": f"0;{now + STOP_NOTICE_MS};;"})
    pipe.pexpireat(key, now + STOP_NOTICE_MS)
    (rate, until), _, _ = pipe.execute()
    return (_number(rate) or 0) > 0 and (_number(until) or 0) > now


def status(client: Any, name: str, prefix: str = DEFAULT_PREFIX) -> RecordingStatus:
    _check_switch_type(client, switch_key(name, prefix))
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(switch_key(name, prefix))
    pipe.xlen(stream_key(name, prefix))
    pipe.pttl(stream_key(name, prefix))
    pipe.time()
    switch, count, pttl, (seconds, micros) = pipe.execute()
    now = int(seconds) * 1000 + int(micros) // 1000
    fields = _switch_fields(switch_key(name, prefix), switch)
    on = int(fields.get("rate") or 0) > 0 and int(fields.get("until") or 0) > now
    return RecordingStatus(
        name=name, switch_rate=int(fields["rate"]) / 1e6 if on else None,
        switch_until_ms=int(fields["until"]) if on else None,
        switch_actor=fields.get("actor", "") if on else "", samples=int(count),
        stream_ttl_s=pttl / 1000 if pttl and pttl > 0 else None, now_ms=now)


def _sample(name: str, entry_id: Any, fields: dict[Any, Any]) -> Sample | None:
    """One stream entry as a sample; None for an entry the script did not write."""
    f = {text(k): text(v) for k, v in fields.items()}
    parsed = [_number(f.get(k) or default) for k, default in (
        ("t", text(entry_id).split("-")[0]), ("ok", "0"), ("f", "0"), ("s", "0"),
        ("ms", "0"), ("r", "1000000"))]
    numbers = [n for n in parsed if n is not None and n >= 0]
    if len(numbers) < len(parsed):
        return None
    t_ms, ok, failed, slow, duration_ms, rate = numbers
    if not 0 < rate <= 1_000_000 or ok + failed == 0 or slow > ok + failed:
        return None
    return Sample(t_ms=t_ms, ok=ok, failed=failed, slow=slow, duration_ms=duration_ms,
                  worker=f.get("w", ""), rate=rate / 1e6, state=f.get("st", ""), name=name)


def export(client: Any, name: str, prefix: str = DEFAULT_PREFIX,
           skipped: list[str] | None = None) -> Iterator[Sample]:
    """Every recorded sample of `name`, oldest first (XRANGE in pages). Entries that are
    not samples (foreign data) are left out, their ids appended to `skipped`."""
    key = stream_key(name, prefix)
    start_id = "-"
    while True:
        page = client.xrange(key, min=start_id, max="+", count=PAGE)
        for entry_id, fields in page:
            sample = _sample(name, entry_id, fields)
            if sample is not None:
                yield sample
            elif skipped is not None:
                skipped.append(text(entry_id))
        if len(page) < PAGE:
            return
        start_id = "(" + text(page[-1][0])
