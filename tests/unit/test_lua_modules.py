"""Library modules (lua/lib/, `--!lib`): defined once, carried by the forms that need
them, and the one home of the helpers every script shares."""

from __future__ import annotations

import re
from pathlib import Path

from distbreaker._runtime.scripts import SCRIPT_NAMES, eval_form, library, lua_dir, needs

LIBS = sorted(p.stem for p in (lua_dir() / "lib").glob("*.lua"))


def test_the_functions_library_defines_each_module_once() -> None:
    code = library().code
    for lib in LIBS:
        assert code.count(f"local function {lib}()\n") == 1, lib


def test_an_eval_form_carries_what_it_needs_and_nothing_else() -> None:
    budget = eval_form((lua_dir() / "budget.lua").read_text())
    assert "local function prelude()" in budget and "record_layout" not in budget
    breaker = eval_form((lua_dir() / "breaker.lua").read_text())
    for lib in needs((lua_dir() / "breaker.lua").read_text()):
        assert breaker.count(f"local function {lib}()\n") == 1, lib
    # finish carries the three scripts it calls, and each module they need once
    finish = eval_form((lua_dir() / "finish.lua").read_text())
    assert finish.count("local function prelude()\n") == 1
    assert all(f"local function {n}(KEYS, ARGV, ...)" in finish
               for n in ("budget", "bulkhead", "breaker"))


def test_every_script_shares_the_prelude_and_defines_no_copy() -> None:
    for name in SCRIPT_NAMES:
        if name == "finish":  # it only calls the others
            continue
        source = (lua_dir() / f"{name}.lua").read_text()
        assert "prelude" in needs(source), name
        assert not re.search(r"function (schema_error|foreign_type|failed_on)\b", source), name
    prelude = (lua_dir() / "lib" / "prelude.lua").read_text()
    assert re.search(r"local function schema_error\b", prelude)


def test_every_module_is_marked() -> None:
    for lib in LIBS:
        assert Path(lua_dir() / "lib" / f"{lib}.lua").read_text().startswith("--!lib"), lib


def test_doctor_counts_the_commands_a_script_runs_through_its_modules() -> None:
    from distbreaker.cli.doctor import script_commands

    commands = script_commands()
    assert {"XADD", "PUBLISH", "GETRANGE"} <= set(commands["breaker"])  # in lua/lib/
    assert "TYPE" in commands["budget"]  # the prelude's foreign-type check
