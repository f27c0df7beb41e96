"""The state record layout is declared once (distbreaker/_runtime/record_layout.py);
every copy generated from it must be current, and the Lua must use it."""

from __future__ import annotations

import importlib.util
import re
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from distbreaker._runtime import record_layout, state_record

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "scripts" / "sync_record_layout.py"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sync_record_layout", GENERATOR)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_copy_is_current() -> None:
    result = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_check_catches_a_stale_copy(tmp_path: Path) -> None:
    gen = generator()
    for relative, text in gen.outputs(ROOT).items():
        target = tmp_path / relative.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    assert gen.stale(tmp_path) == []
    lua = tmp_path / gen.LUA
    lua.write_text(lua.read_text().replace("HOT_AT = '104'", "HOT_AT = '96'"))
    doc = tmp_path / gen.DOC
    doc.write_text(doc.read_text().replace("| 27 | 216 | `state`", "| 27 | 216 | `status`"))
    assert gen.stale(tmp_path) == [lua, doc]


def test_the_python_decoder_reads_through_the_declaration() -> None:
    assert state_record.FIELDS == tuple(f.name for f in record_layout.FIELDS)
    assert state_record.WINDOW_OFFSET == record_layout.WINDOW_OFFSET
    values = list(range(record_layout.HEADER_FIELDS))
    values[record_layout.FIELD_NAMES.index("magic")] = record_layout.MAGIC
    for name in ("state", "initial_state", "after_half_open"):
        values[record_layout.FIELD_NAMES.index(name)] = 1
    decoded = state_record.decode_record(struct.pack(f">{record_layout.HEADER_FIELDS}q", *values))
    assert decoded["ttl_at"] == 30 and decoded["state"] == "OPEN"


def test_no_raw_record_offset_is_left_in_the_lua() -> None:
    """Offsets come from lua/lib/record_layout.lua: a GETRANGE / SETRANGE / put of a
    literal byte position, or a byte() of a literal index, would be a second copy."""
    offending = []
    for script in sorted((ROOT / "lua").glob("*.lua")):
        for number, line in enumerate(script.read_text().splitlines(), 1):
            code = line.split("--", 1)[0]
            if re.search(r"(GETRANGE|SETRANGE)'?, *[\w_]+, *'?\d|\bput\('?\d|byte\(raw, *\d"
                         r"|#raw *< *\d", code):
                offending.append(f"{script.name}:{number}: {line.strip()}")
    assert offending == []
