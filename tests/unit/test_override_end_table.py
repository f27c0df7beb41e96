"""The reads' copy of where an override ends (readside.AFTER_OVERRIDE) is the state
machine's (lua/lib/breaker_transitions.lua, event override_ended): one fact, checked."""

from __future__ import annotations

import re
from pathlib import Path

from distbreaker import readside
from distbreaker.breaker.state import State

LUA = Path(__file__).resolve().parents[2] / "lua" / "lib" / "breaker_transitions.lua"


def test_after_override_matches_the_lua_transition_table() -> None:
    table = {}
    for state, row in re.findall(r"^\s+(\w+) = \{(.*?)\},?$", LUA.read_text(), re.M | re.S):
        found = re.search(r"override_ended = ('(\w+)'|RESUME)", row)
        if found:
            table[State(state)] = State(found.group(2)) if found.group(2) else State(state)
    assert table == readside.AFTER_OVERRIDE
