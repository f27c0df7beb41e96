"""Reading and corrupting a breaker's v2 state record in tests.

The record is binary (distbreaker/_runtime/state_record.py), so these helpers read
it with a client that does not decode replies, whatever client the test holds.
"""

from __future__ import annotations

from typing import Any

import redis

from distbreaker._runtime.keys import BreakerKeys
from distbreaker._runtime.state_record import count_slots, decode_record, encode_fields

META_FIELDS = ("cfg", "reason", "actor", "drift_cfg", "drift_at")


def raw_client(client: Any) -> redis.Redis:
    """A client on the same server as `client` that returns bytes (the record is binary)."""
    kwargs = dict(client.connection_pool.connection_kwargs)
    if not kwargs.get("decode_responses"):
        return client
    kwargs["decode_responses"] = False
    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=client.connection_pool.connection_class, **kwargs))


def record_bytes(client: Any, keys: BreakerKeys) -> bytes | None:
    """The state record as stored (None when the key does not exist)."""
    value = raw_client(client).get(keys.state)
    assert value is None or isinstance(value, bytes)
    return value


def read_record(client: Any, keys: BreakerKeys) -> dict[str, Any]:
    """The header fields by name (decode_record) plus the meta hash's fields (str, ""
    when absent); an empty dict when the breaker has no record."""
    data = record_bytes(client, keys)
    if data is None:
        return {}
    values = decode_record(data)
    meta = raw_client(client).hmget(keys.meta, META_FIELDS)
    for field, value in zip(META_FIELDS, meta, strict=True):
        values[field] = value.decode() if value is not None else ""
    return values


def count_window(client: Any, keys: BreakerKeys) -> list[tuple[bool, bool, int] | None]:
    """The count window's slots (state_record.count_slots) of the stored record."""
    data = record_bytes(client, keys) or b""
    return count_slots(data, decode_record(data)["window_size"])


def corrupt(client: Any, keys: BreakerKeys, **fields: int) -> None:
    """Overwrite header fields of the stored record (codes, not state names), keeping
    its TTL: what a buggy foreign writer would do."""
    data = record_bytes(client, keys)
    assert data is not None, "no record to corrupt"
    raw_client(client).set(keys.state, encode_fields(data, **fields), keepttl=True)


def age_time_window(client: Any, keys: BreakerKeys, gap: int, per_second: int = 10,
                    ms: int = 50, every: int = 1) -> int:
    """Rewrite a TIME window's record as if its last call was `gap` seconds ago (by the
    server's clock), after a window whose every second saw `per_second` successful
    calls taking `ms` in all: the most a first call after that gap has to evict.
    With `every` > 1 only the seconds divisible by it saw calls (the other slots are
    zero bytes, never used). Keeps the TTL; the TTL refresh is as old as that last
    call. Answers the epoch second of that last call."""
    from distbreaker._runtime.state_record import WINDOW_OFFSET, encode_time_window

    raw = raw_client(client)
    data = raw.get(keys.state)
    assert isinstance(data, bytes), "no record to age"
    size = decode_record(data)["window_size"]
    seconds, _ = raw.time()
    last = int(seconds) - gap
    busy = {t: (per_second, 0, 0, ms) for t in range(last - size, last + 1) if t % every == 0}
    slots, (calls, failures, slow, total_ms) = encode_time_window(size, last, busy)
    header = encode_fields(data, wsec=last, head=last - size, ttl_at=last * 1000, calls=calls,
                           failures=failures, slow=slow, total_ms=total_ms)
    raw.set(keys.state, header[:WINDOW_OFFSET] + slots, keepttl=True)
    return last
