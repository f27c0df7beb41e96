"""Names are checked on a fixed Unicode basis (14.0), not on the running Python's
Unicode version: the generated table is current, matches Python 3.11's rule where
this Python's tables are 14.0, and decides the same on any Python."""

from __future__ import annotations

import itertools
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from distbreaker._runtime.keys import validate_name, validate_prefix
from distbreaker._runtime.name_chars import REFUSED, REFUSED_CHAR, UNICODE_VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_files_are_current() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_name_chars.py"),
                           "--check"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_table_is_unicode_14s_printable_and_not_space() -> None:
    assert UNICODE_VERSION == "14.0.0"
    refused = set()
    for a, b in REFUSED:
        refused.update(range(a, b + 1))
    assert all(a <= b for a, b in REFUSED)
    assert all(b < c for (_, b), (c, _) in itertools.pairwise(REFUSED))
    if unicodedata.unidata_version == UNICODE_VERSION:  # the table's own source
        assert refused == {cp for cp in range(0x110000)
                           if not chr(cp).isprintable() or chr(cp).isspace()}
    assert all(bool(REFUSED_CHAR.search(chr(cp))) == (cp in refused)
               for cp in range(0, 0x110000, 7))


@pytest.mark.parametrize("char", ["\u200b", " ", "\xa0", "\u2028", "\x1f", "\ue000",
                                  # unassigned in Unicode 14.0, assigned in 15.0 (WIRELESS):
                                  # refused whatever the running Python knows
                                  "\U0001f6dc"])
def test_refused(char: str) -> None:
    with pytest.raises(ValueError, match="whitespace or control"):
        validate_name(f"a{char}b")
    with pytest.raises(ValueError, match="whitespace or control"):
        validate_prefix(f"a{char}b")


@pytest.mark.parametrize("name", ["payments", "é-ü", "\U0001f600", "a{b}", "数据库"])
def test_accepted(name: str) -> None:
    assert validate_name(name) == name


def test_the_ascii_fast_path_refuses_exactly_what_the_table_refuses() -> None:
    from distbreaker._runtime.keys import _ASCII_REFUSED

    assert all(bool(_ASCII_REFUSED.search(chr(cp))) == bool(REFUSED_CHAR.search(chr(cp)))
               for cp in range(128))
