"""The package stays layered: no import circle, no upward import, no reach-in.

`scripts/import_graph.py` declares the layers and prints all three; here it must
find none in this checkout, and must find each kind in a small package made to
have it (so a checker that silently sees nothing cannot pass).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "import_graph.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=60, check=False)


def counts(output: str) -> dict[str, int]:
    """{"circles between modules": 0, ...} from the script's summary lines."""
    found = {}
    for line in output.splitlines():
        head, sep, tail = line.partition(": ")
        if sep and not line.startswith(" ") and tail.isdigit():
            found[head] = int(tail)
    return found


def test_the_package_has_no_circle_no_upward_import_and_no_reach_in() -> None:
    done = run()
    assert counts(done.stdout) == {"circles between modules": 0, "circles between units": 0,
                                   "upward imports": 0, "reach-ins": 0}, done.stdout
    assert done.returncode == 0, done.stdout + done.stderr


def write(root: Path, files: dict[str, str]) -> Path:
    package = root / "distbreaker"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_each_fault_is_found(tmp_path: Path) -> None:
    package = write(tmp_path, {
        "__init__.py": "",
        "errors.py": "from .breaker.state import State\n",  # upward
        "_runtime/__init__.py": "",
        "_runtime/a.py": "def f():\n    from . import b\n",  # a circle through a lazy import
        "_runtime/b.py": "from .a import f\n",
        "breaker/__init__.py": "",
        "breaker/state.py": "from .. import errors\nState = str\n",  # a circle of units
        "bulkhead/__init__.py": "",
        "bulkhead/core.py": "from ..breaker import state\n",  # component -> component
        "policy/__init__.py": "",
        "policy/core.py": ("from ..retry.core import _private\n"  # private piece
                           "def g(retry):\n    return retry._core\n"),  # reach-in
        "retry/__init__.py": "",
        "retry/core.py": "_private = 1\n",
    })
    done = run("--root", str(package))
    assert done.returncode == 1
    assert counts(done.stdout) == {"circles between modules": 2, "circles between units": 1,
                                   "upward imports": 3, "reach-ins": 1}, done.stdout
    assert "distbreaker._runtime.a <-> distbreaker._runtime.b" in done.stdout
    assert "distbreaker.breaker.state <-> distbreaker.errors" in done.stdout
    assert "  breaker <-> errors" in done.stdout
    for fault in ("errors.py:1: distbreaker.breaker.state",
                  "bulkhead/core.py:1: distbreaker.breaker.state",
                  "private piece of retry: _private", "retry._core"):
        assert fault in done.stdout, done.stdout


def test_type_checking_imports_make_no_circle_but_still_point_upward(tmp_path: Path) -> None:
    package = write(tmp_path, {
        "__init__.py": "",
        "_runtime/__init__.py": "",
        "_runtime/sub.py": ("from typing import TYPE_CHECKING\n"
                            "if TYPE_CHECKING:\n    from ..breaker.core import Core\n"),
        "breaker/__init__.py": "",
        "breaker/core.py": "from .._runtime.sub import x\n",
    })
    done = run("--root", str(package))
    assert counts(done.stdout)["circles between units"] == 0, done.stdout
    assert "(TYPE_CHECKING): _runtime (runtime) imports breaker" in done.stdout
    assert done.returncode == 1
