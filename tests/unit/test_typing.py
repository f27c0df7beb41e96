"""Decorated functions keep their signatures for type checkers (issue 17).

`mypy --strict` runs on a sample user module (tests/helpers/typed_user_module.py) that
uses every public decorator, sync and asyncio, and the Celery `protect`: it must pass,
and wrong calls of the decorated functions must be reported, which they were not while
the decorators were typed `Callable[..., T]`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import distbreaker

SAMPLE = Path(__file__).parent.parent / "helpers" / "typed_user_module.py"
PACKAGE_ROOT = Path(distbreaker.__file__).resolve().parent.parent
# A checkout (or the worktree PYTHONPATH points at) goes on MYPYPATH; an installed
# package is found by mypy in site-packages, which MYPYPATH must not name.
SEARCH = ({"MYPYPATH": str(PACKAGE_ROOT)} if (PACKAGE_ROOT / "pyproject.toml").exists()
          else {})

# The package is checked as a user's mypy would see an installed, typed dependency:
# its types are used, its own strictness findings are not the user's.
CONFIG = """\
[mypy]
[mypy-distbreaker.*]
ignore_errors = True
"""

# Each line a wrong use of a decorated function or of `call`; mypy must flag every one.
WRONG_CALLS = [
    'breaker_fn("not an int")',
    "breaker_fn(1, label=2)",
    'bulkhead_fn("not an int")',
    'retry_fn("not an int")',
    'policy_fn("not an int")',
    'ganesha_fn("not an int")',
    'stacked_fn("not an int")',
    "celery_task(None)",
    '_ = abreaker_fn("not an int")',
    '_ = abulkhead_fn("not an int")',
    '_ = aretry_fn("not an int")',
    '_ = apolicy_fn("not an int")',
    '_ = aganesha_fn("not an int")',
    'breaker.call(plain, "not an int")',
    "retry.call(plain)",
    "bad: int = bulkhead_fn(1)",
    'registry_breaker_fn("not an int")',
    'registry_policy_fn("not an int")',
    '_ = aregistry_policy_fn("not an int")',
]


def run_mypy(workdir: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    """`python -m mypy --strict` on `files`, with this checkout's package importable."""
    config = workdir / "mypy.ini"
    config.write_text(CONFIG)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(config),
         "--cache-dir", str(workdir / "cache"), "--no-error-summary",
         "--show-error-codes", *map(str, files)],
        cwd=workdir, env={**os.environ, **SEARCH},
        capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("typing")
    shutil.copy(SAMPLE, path / "typed_user_module.py")
    return path


def test_sample_user_module_passes_mypy_strict(workdir: Path) -> None:
    result = run_mypy(workdir, workdir / "typed_user_module.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_wrong_calls_of_decorated_functions_are_reported(workdir: Path) -> None:
    wrong = workdir / "wrong_user_module.py"
    header = "from typed_user_module import *  # noqa: F403\n\n\ndef misuse() -> None:\n"
    wrong.write_text(header + "".join(f"    {line}\n" for line in WRONG_CALLS))
    first = header.count("\n") + 1
    result = run_mypy(workdir, wrong)
    assert result.returncode == 1, result.stdout + result.stderr
    flagged = {int(n) for n in re.findall(r"^wrong_user_module\.py:(\d+): error:",
                                          result.stdout, re.M)}
    missed = [line for index, line in enumerate(WRONG_CALLS) if first + index not in flagged]
    assert not missed, f"mypy accepted {missed}:\n{result.stdout}"


def test_sample_user_module_imports_without_connecting() -> None:
    """The sample is a real module: decorating connects to nothing, names are kept."""
    from tests.helpers import typed_user_module as sample

    assert sample.breaker_fn.__name__ == "breaker_fn"
    assert sample.abreaker_fn.__name__ == "abreaker_fn"
    assert sample.celery_task.__wrapped__.__name__ == "celery_task"  # type: ignore[attr-defined]
