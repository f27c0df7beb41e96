"""The CLI starts without importing what the command does not use.

`distbreaker --version` imports neither redis-py nor any component; `distbreaker ls`
imports the read side but no bulkhead, budget, policy, registry or dashboard. The
time this saves is measured by scripts/bench_cli_start.py, never asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import distbreaker
from distbreaker import _facade
from distbreaker.cli import cli
from distbreaker.cli.app import COMMAND_MODULES

PROBE = """
import json, sys
from distbreaker.cli import main
sys.argv = ["distbreaker", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules
                        if m.split(".")[0] in ("redis", "distbreaker", "opentelemetry"))))
"""


def modules_after(*argv: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                          text=True, timeout=60, check=True,
                          env={"DISTBREAKER_REDIS_URL": "redis://127.0.0.1:1/0",
                               "PATH": "/usr/bin:/bin"})
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_command_table_names_every_command_and_its_module() -> None:
    commands = cli.load_all()
    assert set(commands) == set(COMMAND_MODULES)
    for name, command in commands.items():
        assert command.callback is not None
        if not isinstance(command, type(cli)):
            module = COMMAND_MODULES[name]
            assert command.callback.__module__ == f"distbreaker.cli.{module}", name


def test_version_imports_no_redis_and_no_component() -> None:
    loaded = modules_after("--version")
    assert not any(m == "redis" or m.startswith("redis.") for m in loaded)
    assert not loaded & {"distbreaker._facade", "distbreaker.breaker", "distbreaker.readside"}


def test_ls_imports_the_read_side_only() -> None:
    loaded = modules_after("ls")  # Redis unreachable: the command fails, imports stay
    assert "distbreaker.readside" in loaded
    for heavy in ("distbreaker.bulkhead", "distbreaker.budget", "distbreaker.policy",
                  "distbreaker.registry", "distbreaker.dashboard", "distbreaker._facade"):
        assert heavy not in loaded, heavy
    assert not any(m.startswith("opentelemetry") for m in loaded)


def test_the_lazy_facade_gives_the_same_objects() -> None:
    assert set(_facade.__all__) <= set(distbreaker.__all__)
    for name in distbreaker.__all__:
        assert getattr(distbreaker, name) is not None
    for name in _facade.__all__:
        assert getattr(distbreaker, name) is getattr(_facade, name), name
    from distbreaker.breaker.sync import CircuitBreaker

    assert distbreaker.CircuitBreaker is CircuitBreaker
    assert set(distbreaker.__all__) <= set(dir(distbreaker))
    try:
        distbreaker.no_such_name  # noqa: B018
    except AttributeError:
        pass
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_a_redis_py_that_needs_the_sdk_is_imported_as_usual() -> None:
    """If a redis-py release imported the OpenTelemetry SDK unconditionally, hiding it
    must not break the CLI: redis-py is then imported with the SDK."""
    probe = """
import builtins, sys
real = builtins.__import__
def strict(name, *args, **kwargs):
    if name == "redis" and sys.modules.get("opentelemetry", 0) is None:
        raise ImportError("this redis-py needs opentelemetry")
    return real(name, *args, **kwargs)
builtins.__import__ = strict
from distbreaker.cli.app import _import_redis_without_otel
_import_redis_without_otel()
builtins.__import__ = real
import redis
print("opentelemetry" in sys.modules and sys.modules["opentelemetry"] is None, redis.Redis)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.startswith("False <class 'redis.client.Redis'>"), done.stdout
