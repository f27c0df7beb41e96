"""A retry budget's window (layout 2: a binary string) read back as layout 1's fields,
so tests say what is stored in the names docs/KEY_SCHEMA.md uses."""
from __future__ import annotations

import struct
from typing import Any

from distbreaker.readside import budget_fields


def window(client: Any, key: str) -> dict[str, int]:
    """The fields of the budget window at `key` ({} when there is none): v, n, slice_ms,
    head, D, W, ppm, reserve, and d:<id> / w:<id> for each slice that counted anything."""
    raw = client.get(key)
    if not raw:
        return {}
    return {k: int(v) for k, v in budget_fields(bytes(raw)).items()}


def encode(fields: dict[str, int]) -> bytes:
    """A layout-2 window from layout 1's fields (the head slice's d:/w: go in the header,
    the other slices after it, oldest first), as lua/budget.lua writes it."""
    head = fields["head"]
    ids = sorted({int(k[2:]) for k in fields if k[:2] in ("d:", "w:")} - {head})
    values = [2, fields["n"], fields["slice_ms"], head, fields["D"], fields["W"],
              fields.get(f"d:{head}", 0), fields.get(f"w:{head}", 0), fields.get("ppm", 0),
              fields.get("reserve", 0)]
    for sid in ids:
        values += [sid, fields.get(f"d:{sid}", 0), fields.get(f"w:{sid}", 0)]
    return struct.pack(f">{len(values)}q", *values)
