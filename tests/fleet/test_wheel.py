"""The wheel ships the Lua scripts: build it, install it in a fresh venv outside
the repo, and run a breaker against the session's redis-server from there.

The source tree's ``lua/`` folder is the single copy of the scripts; the
wheel must carry it as ``distbreaker/lua/`` and the installed package must load
its scripts from there, not from a checkout that happens to be nearby.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import distbreaker
from distbreaker._runtime.keys import BreakerKeys
from tests.helpers.records import read_record

ROOT = Path(__file__).resolve().parents[2]

CHECK = r"""
import json, sys
import distbreaker
from distbreaker import CallNotPermitted, CircuitBreaker
from distbreaker._runtime.scripts import lua_dir

def failing():
    raise ConnectionError("down")

breaker = CircuitBreaker(sys.argv[2], redis=sys.argv[1], sliding_window_size=2,
                         minimum_number_of_calls=2, wait_duration_in_open_state=60)
outcomes = []
for _ in range(3):
    try:
        breaker.call(failing)
    except CallNotPermitted:
        outcomes.append("rejected")
    except ConnectionError:
        outcomes.append("failed")
print(json.dumps({"package": distbreaker.__file__, "lua_dir": str(lua_dir()),
                  "lua": {p.relative_to(lua_dir()).as_posix(): p.read_text()
                          for p in lua_dir().rglob("*.lua")},
                  "outcomes": outcomes, "state": breaker.state.value,
                  "path": sys.path}))
"""


def pip(*args: str, cwd: Path, python: str = sys.executable,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "pip", "--disable-pip-version-check", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=180)


def outer_pip_can_target() -> bool:
    """pip >= 22.3 installs into another interpreter's environment (``--python``)."""
    import pip as outer

    major, minor = (int(part) for part in outer.__version__.split(".")[:2])
    return (major, minor) >= (22, 3)


def make_venv(home: Path, wheel: Path) -> Path:
    """A fresh venv holding the wheel and its dependencies; returns its python.

    The outer pip installs into it (``pip --python``), which skips bootstrapping
    pip into the new venv. If the dependencies cannot be fetched (offline), the
    wheel alone is installed and this venv borrows the outer venv's third-party
    packages through a .pth file: distbreaker itself still comes from the wheel.
    """
    venv = home / "venv"
    targeted = outer_pip_can_target()
    subprocess.run([sys.executable, "-m", "venv", *(["--without-pip"] if targeted else []),
                    str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    target: tuple[str, ...] = ("--python", str(python)) if targeted else ()
    runner = sys.executable if targeted else str(python)
    done = pip(*target, "install", "-q", str(wheel), cwd=home, python=runner)
    if done.returncode != 0:
        alone = pip(*target, "install", "-q", "--no-deps", str(wheel), cwd=home, python=runner)
        assert alone.returncode == 0, f"installing the wheel failed:\n{alone.stderr}"
        site = subprocess.run([str(python), "-c", "import sysconfig; "
                               "print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        Path(site, "zz_outer_deps.pth").write_text("\n".join(sorted(outer)) + "\n")
    return python


def test_wheel_ships_and_loads_the_lua_scripts(tmp_path: Path, redis_url: str,
                                              redis_client: redis.Redis, name: str) -> None:
    dist = tmp_path / "dist"
    built = pip("wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT), cwd=tmp_path)
    assert built.returncode == 0, f"building the wheel failed:\n{built.stderr}"
    (wheel,) = dist.glob("distbreaker-*.whl")

    # the scripts and their library modules (lua/lib/)
    source_lua = {p.relative_to(ROOT / "lua").as_posix(): p.read_text()
                  for p in (ROOT / "lua").rglob("*.lua")}
    assert "breaker.lua" in source_lua and "lib/prelude.lua" in source_lua
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        shipped = {n[len("distbreaker/lua/"):]: archive.read(n).decode()
                   for n in names if n.startswith("distbreaker/lua/") and n.endswith(".lua")}
    assert shipped == source_lua, "the wheel's distbreaker/lua/ must equal the source lua/"
    assert not [n for n in names if n.startswith("lua/")], "no stray top-level lua/ package"
    assert "distbreaker/py.typed" in names, "the wheel must mark the package as typed (PEP 561)"
    version = distbreaker.__version__
    assert wheel.name.startswith(f"distbreaker-{version}-")
    assert f"distbreaker-{version}.dist-info/licenses/LICENSE" in names

    python = make_venv(tmp_path, wheel)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    run = subprocess.run([str(python), "-c", CHECK, redis_url, name], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.splitlines()[-1])

    site_packages = Path(python).parent.parent / "lib"
    package = Path(report["package"])
    assert package.is_relative_to(site_packages) and "site-packages" in package.parts
    assert not any(Path(p).resolve() == ROOT for p in report["path"] if p)
    lua = Path(report["lua_dir"])
    assert lua == package.parent / "lua", "scripts must load from inside the installed package"
    assert report["lua"] == source_lua

    # The installed breaker really ran its scripts on the test's redis-server.
    assert report["outcomes"] == ["failed", "failed", "rejected"]
    assert report["state"] == "OPEN"
    assert read_record(redis_client, BreakerKeys.build(name))["state"] == "OPEN"


@pytest.fixture(autouse=True)
def _no_stray_build_dirs() -> Iterator[None]:
    """Building from the source tree must not leave build/ or *.egg-info behind."""
    before = {p.name for p in ROOT.iterdir()}
    yield
    stray = {p.name for p in ROOT.iterdir()} - before
    assert not {n for n in stray if n == "build" or n.endswith(".egg-info")}
