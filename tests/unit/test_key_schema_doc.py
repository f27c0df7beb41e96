"""docs/KEY_SCHEMA.md is the wire contract: every script and every key must be in it.

A client in another language is written from that document alone, so a script
in lua/ or a key built in distbreaker/keys.py that the document does not
mention is a contract gap, and fails here.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from distbreaker._runtime.keys import (
    BreakerKeys,
    BudgetKeys,
    BulkheadKeys,
    PoolKeys,
    RateLimiterKeys,
    events_channel,
    namespace,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "KEY_SCHEMA.md"
SCRIPTS = sorted((ROOT / "lua").glob("*.lua"))
NAME = "some-name"


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def key_patterns() -> list[tuple[str, str, str]]:
    """(class.field, built key, documented pattern) for every key field of the key classes."""
    base = f"{namespace('distbreaker')}:{{{NAME}}}"
    out = []
    for cls in (BreakerKeys, BulkheadKeys, BudgetKeys, RateLimiterKeys, PoolKeys):
        keys = cls.build(NAME)
        for field in dataclasses.fields(cls):
            built = getattr(keys, field.name)
            if built == events_channel():
                pattern = "<ns>:events"
            else:
                assert built.startswith(base), f"{cls.__name__}.{field.name} = {built!r}"
                pattern = "<ns>:{<name>}" + built[len(base):]
            out.append((f"{cls.__name__}.{field.name}", built, pattern))
    return out


def test_every_lua_script_exists_and_is_found() -> None:
    assert {p.name for p in SCRIPTS} >= {"breaker.lua"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_lua_script_has_a_section(script: Path) -> None:
    text = doc_text()
    assert re.search(rf"^#+ .*`lua/{re.escape(script.name)}`", text, re.MULTILINE), (
        f"docs/KEY_SCHEMA.md has no heading for lua/{script.name}: document its KEYS, "
        f"ARGV (in order, with units), reply and errors")


@pytest.mark.parametrize("label,built,pattern", key_patterns(),
                         ids=[label for label, _, _ in key_patterns()])
def test_every_key_is_documented(label: str, built: str, pattern: str) -> None:
    assert f"`{pattern}`" in doc_text(), (
        f"{label} builds {built!r}, but docs/KEY_SCHEMA.md does not document `{pattern}` "
        f"(its type, fields, units and TTL)")


def test_the_doc_names_the_namespace_and_version_rules() -> None:
    text = doc_text()
    assert "`<prefix>:v2`" in text and "DISTBREAKER_SCHEMA" in text
    assert "Compatibility promise" in text
