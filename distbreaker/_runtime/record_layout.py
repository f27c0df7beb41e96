"""The one declaration of the breaker's v2 state record layout (docs/KEY_SCHEMA.md).

Everything else is generated from or imports this module (design principle 16):
`state_record` (the Python decoder) imports it, and ``scripts/sync_record_layout``
writes ``lua/lib/record_layout.lua`` (the offsets the Lua scripts use) and the field
table of docs/KEY_SCHEMA.md from it; ``tests/unit/test_record_layout.py`` fails while a
generated copy is stale. Change the layout here, then run the generator.

The record: a header of big-endian signed 64-bit fields (field k at byte 8k), a few
reserved bytes, then the sliding window. Fields are read and written by *group*, each
group one contiguous byte range, so the script reads or writes it with one GETRANGE
or SETRANGE.
"""

from __future__ import annotations

from typing import NamedTuple

MAGIC = 1684174386  # "dbv2"
FIELD_WIDTH = 8
#: Where the window starts (bytes between the header's end and here are reserved, 0).
WINDOW_OFFSET = 320
#: State codes (field `state`, `initial_state`, `after_half_open`), in code order.
STATES = ("CLOSED", "OPEN", "HALF_OPEN", "FORCED_OPEN", "DISABLED", "METRICS_ONLY")
#: A count window slot (u32): bit 31 an outcome is present, 30 failed, 29 slow, 0-28 ms.
PRESENT, FAILED, SLOW, MS_MASK = 1 << 31, 1 << 30, 1 << 29, (1 << 29) - 1
COUNT_SLOT_BYTES = 4
#: A time window slot: five u32, the running totals at the end of its second (ms high
#: bits, calls, failures, slow, ms low bits; docs/KEY_SCHEMA.md "Window").
TIME_SLOT_BYTES = 20


class Field(NamedTuple):
    """One header field: its name (as `state_record.decode_record` returns it) and what
    it holds, for the KEY_SCHEMA table."""

    name: str
    meaning: str

    @property
    def index(self) -> int:
        """The field's number k (it sits at byte 8k)."""
        return FIELDS.index(self)

    @property
    def offset(self) -> int:
        """The field's first byte."""
        return FIELD_WIDTH * self.index


class Group(NamedTuple):
    """Fields read or written together: one contiguous byte range of the header."""

    name: str
    first: int  # first field
    last: int  # last field, inclusive
    role: str  # who reads or writes it, for the docs

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    @property
    def first_byte(self) -> int:
        return FIELD_WIDTH * self.first

    @property
    def last_byte(self) -> int:
        return FIELD_WIDTH * (self.last + 1) - 1


FIELDS: tuple[Field, ...] = (
    Field("open_until", "ms; in OPEN: when it becomes HALF_OPEN, else 0"),
    Field("gen", "transitions so far"),
    Field("opens", "OPENs entered since the last CLOSED (the exponent of the open wait)"),
    Field("rejected", "calls rejected by the script (fleet-wide; local fast-fails are not "
                      "counted)"),
    Field("slow_total", "slow calls recorded since the record was created (fleet-wide, "
                        "every state that records: a counter, never reduced; written with "
                        "the counters group by a record with slow calls; was reserved, 0, "
                        "before)"),
    Field("drift_fp", "fingerprint of meta `drift_cfg` (0: none)"),
    Field("open_wait_ms", "open wait, ms (config field 7)"),
    Field("initial_state", "initial state, state code (config field 13)"),
    Field("after_half_open", "state after max wait in half-open, state code (config field 14)"),
    Field("wait_multiplier_e6", "open wait multiplier, millionths (config field 15: "
                                "`round(x * 1e6)`)"),
    Field("max_open_wait_ms", "max open wait, ms, 0 = the key TTL (config field 16)"),
    Field("randomization_e6", "open wait randomization factor, millionths (config field 17)"),
    Field("slow_call_ms", "slow call duration, ms (config field 12; informational: each "
                          "client decides slowness)"),
    Field("hp_done", "half-open: probes reported"),
    Field("hp_fail", "half-open: probes failed"),
    Field("hp_slow", "half-open: probes slow"),
    Field("permitted_probes", "permitted calls in half-open, calls (config field 8)"),
    Field("lease_ms", "half-open lease, ms (config field 10)"),
    Field("max_half_open_ms", "max wait in half-open, ms, 0 = none (config field 9)"),
    Field("magic", f"always `{MAGIC}` (`\"dbv2\"`); anything else is foreign data"),
    Field("fp", "fingerprint of the stored config (see below); 0 = unset"),
    Field("window_type", "0 COUNT_BASED, 2 TIME_BASED (cumulative slots); 1: TIME_BASED in "
                         "the per-second layout of earlier versions, which the next call "
                         "re-bases to 2"),
    Field("window_size", "calls or seconds"),
    Field("minimum_calls", "minimum number of calls"),
    Field("failure_threshold_e4", "failure rate threshold, 1/10000 of a percent "
                                  "(`round(percent * 10000)`: 50 % is 500000)"),
    Field("slow_threshold_e4", "slow call rate threshold, 1/10000 of a percent"),
    Field("key_ttl_ms", "key TTL, ms"),
    Field("state", "state code: " + ", ".join(f"{code} {state}"
                                               for code, state in enumerate(STATES))),
    Field("since", "ms; when the current state was entered"),
    Field("ov_until", "ms; when the operator's override of the current state ends "
                      "(0: it does not expire); zeroed by every transition"),
    Field("ttl_at", "ms; when the keys' TTLs were last all refreshed"),
    Field("calls", "window total: calls"),
    Field("failures", "window total: failed calls"),
    Field("slow", "window total: slow calls"),
    Field("total_ms", "window total: ms of all calls"),
    Field("head", "count window: next ring slot to write; time window: its epoch second "
                  "(the running totals are 0 before it)"),
    Field("wsec", "time window: the last epoch second the window was moved to (0: never)"),
    Field("seq", "write sequence number: +1 (mod 2^32) on every write of the `state` "
                 "group; the hot read ends near it, with the cumulative counters (Lua 5.1 "
                 "hashes only some bytes of a long string, the last one always: strings "
                 "differing elsewhere would collide). Bit 32 (2^32, kept by every write): "
                 "the breaker has shadow configs (`<state key>:shadow`), which records feed"),
    Field("calls_total", "calls recorded since the record was created (fleet-wide, every "
                         "state that records: a counter, never reduced; the bytes were "
                         "reserved, 0, before)"),
    Field("failures_total", "failed calls recorded since the record was created (likewise)"),
)
FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in FIELDS)
HEADER_FIELDS = len(FIELDS)

#: The read groups (every field in exactly one) and the write groups (likewise), then
#: the parts of a write group written alone.
GROUPS: tuple[Group, ...] = (
    Group("cold", 0, 12, "read: only by calls that need them (a transition, OPEN, a "
                         "rejection, a `set`, a full reply)"),
    Group("hot", 13, 39, "read: by every call, one GETRANGE"),
    Group("counters", 0, 5, "written when a counter changes"),
    Group("config", 6, 26, "written when the config changes (with the half-open figures, "
                           "magic and fingerprint between its fields)"),
    Group("half_open", 13, 15, "written alone when only the half-open figures change"),
    Group("state", 27, 39, "written when the state or the window changes or the TTLs are "
                           "refreshed"),
    Group("totals", 31, 39, "written alone by the hot path's CLOSED record (27-30 unchanged)"),
)
GROUP = {g.name: g for g in GROUPS}
HEADER_BYTES = FIELD_WIDTH * HEADER_FIELDS
assert HEADER_BYTES <= WINDOW_OFFSET
assert [f.name for f in FIELDS].count("state") == 1 and len(set(FIELD_NAMES)) == HEADER_FIELDS
for _partition in (("cold", "hot"), ("counters", "config", "state")):
    _fields = [i for g in _partition for i in range(GROUP[g].first, GROUP[g].last + 1)]
    assert _fields == list(range(HEADER_FIELDS)), _partition
