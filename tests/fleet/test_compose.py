"""docker-compose.yml: valid, and its commands run locally as one fleet sharing a breaker.

Docker cannot run here, so the test runs the compose file's own `command`
strings against the session's redis-server: the upstream, gunicorn with 4
workers, the Celery worker and the load generator. Only option values that
name ports or the upstream's timeline are replaced (free ports, a short
timeline), and the compose `environment` hostnames become local addresses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from distbreaker._runtime.keys import BreakerKeys
from distbreaker.demo.embedded import free_port
from tests.helpers.records import read_record
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
BIN = Path(sys.executable).parent


def services() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text())["services"])


def command(service: str, **values: str) -> list[str]:
    """The service's compose command, with the given options' values replaced."""
    args = shlex.split(services()[service]["command"])
    for option, value in values.items():
        flag = "--" + option.replace("_", "-")
        args[args.index(flag) + 1] = value
    return args


def test_compose_file_is_valid_and_names_what_exists() -> None:
    spec = services()
    assert set(spec) == {"redis", "upstream", "web", "worker", "load"}
    assert spec["redis"]["image"].startswith("redis:")
    for name in ("upstream", "web", "worker", "load"):
        build = spec[name]["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).is_file()
    for name in ("web", "worker", "load"):
        env = spec[name]["environment"]
        assert env["REDIS_URL"].startswith("redis://redis:")
        assert env["UPSTREAM_URL"] == "http://upstream:8080"
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    for copied in ("distbreaker", "lua", "docker", "pyproject.toml"):
        assert f"COPY {copied}" in dockerfile and (ROOT / copied).exists()
    upstream = command("upstream")
    assert upstream[:3] == ["python", "-m", "distbreaker.demo.upstream"]
    assert importlib.util.find_spec("distbreaker.demo.upstream") is not None
    web = command("web")
    assert web[0] == "gunicorn" and web[web.index("--workers") + 1] == "4"
    module, _, attr = web[-1].partition(":")
    assert (ROOT / web[web.index("--chdir") + 1] / f"{module}.py").is_file() and attr == "app"
    worker = command("worker")
    assert worker[:1] == ["celery"] and worker[worker.index("-A") + 1] == "tasks"
    assert (ROOT / worker[worker.index("--workdir") + 1] / "tasks.py").is_file()
    assert (ROOT / command("load")[1]).is_file()


@contextlib.contextmanager
def started(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[Any]]:
    """A compose command as a local process group (ended by its own id)."""
    program = BIN / args[0] if (BIN / args[0]).exists() else Path(args[0])
    with log.open("wb") as out:
        proc = subprocess.Popen([str(program), *args[1:]], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def wait_for(check: Any, seconds: float, what: str, logs: list[Path]) -> Any:
    """`wait_until` that shows the services' logs when it times out."""
    return wait_until(check, timeout=seconds, interval=0.1, what=what,
                      ignoring=(OSError, ValueError), describe=lambda: "\n".join(
                          f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                          for p in logs if p.exists()))


#: The upstream's healthy phase, from its start (the warm-up below) and again from the
#: test's /restart: long, so a loaded machine's slow warm-up never meets the failing phase.
OK_PHASE = 45


@pytest.mark.timeout(600)  # three services and a load run on a possibly loaded machine
def test_compose_commands_run_one_fleet_sharing_the_breaker(
        redis_url: str, redis_client: redis.Redis, name: str, tmp_path: Path) -> None:
    base = redis_url.rsplit("/", 1)[0]
    up_port, web_port = free_port(), free_port()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "REDIS_URL": redis_url, "CELERY_BROKER_URL": f"{base}/1",
           "CELERY_RESULT_BACKEND": f"{base}/2", "UPSTREAM_URL": f"http://127.0.0.1:{up_port}",
           "BREAKER_NAME": name, "OPEN_WAIT": "300", "WEB_URL": f"http://127.0.0.1:{web_port}",
           "LOAD_SECONDS": "4", "RATE": "20", "TASK_EVERY": "2"}
    logs = [tmp_path / f"{s}.log" for s in ("upstream", "web", "worker", "load")]
    upstream_url, web_url = env["UPSTREAM_URL"], env["WEB_URL"]
    with started(command("upstream", host="127.0.0.1", port=str(up_port),
                         timeline=f"ok:{OK_PHASE},failing:600"), env, logs[0]), \
            started(command("web", bind=f"127.0.0.1:{web_port}"), env, logs[1]), \
            started(command("worker"), env, logs[2]):
        sys.path.insert(0, str(ROOT / "docker"))
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            import tasks  # the compose worker's task module, as the load service imports it

            # Healthy upstream: the web answers 200 and a Celery task charges.
            wait_for(lambda: get(web_url + "/")[0] == 200, 120, "gunicorn serving", logs)
            wait_for(lambda: tasks.charge_task.delay(0).get(timeout=5)["status"] == 200, 120,
                     "the Celery worker charging", logs)
            urllib.request.urlopen(urllib.request.Request(  # the timeline starts now
                upstream_url + "/restart", data=b"", method="POST"), timeout=5).read()
            time.sleep(OK_PHASE + 0.2)                       # the upstream is failing now
            load = subprocess.run([str(BIN / "python"), *command("load")[1:]], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=60)
            assert load.returncode == 0, load.stderr
            # Tripped once for the whole fleet; web workers fail fast without a call.
            keys = BreakerKeys.build(name)
            assert read_record(redis_client, keys)["state"] == "OPEN"
            steps = [(f[b"from"], f[b"to"]) for _, f in redis_client.xrange(keys.history)]
            assert steps.count((b"CLOSED", b"OPEN")) == 1
            answers = [get(web_url + "/") for _ in range(12)]
            assert all(code == 503 and body["state"] == "OPEN" for code, body in answers)
            # the rest of the 300 s wait (generous: a loaded machine is slow to get here)
            assert all(100 < body["retry_after"] <= 300 for _, body in answers), answers
            # The Celery worker sees the same OPEN breaker: its task is re-queued.
            result = tasks.charge_task.delay(99)
            wait_for(lambda: result.state == "RETRY", 60, "the task re-queued", logs)
            assert f"circuit breaker '{name}' is OPEN" in str(result.info)
            # Load on the failing upstream: about what tripping takes (at least half of
            # the 10 minimum calls failed, the window's earlier successes count too), not
            # every request the load generator made (plus its Celery tasks).
            stats = get(upstream_url + "/stats")[1]
            failing = sum(stats["by_mode"]["failing"].values())
            sent = 4 * 20
            assert 5 <= failing <= sent // 2, (failing, stats)
            ls = subprocess.run([str(BIN / "distbreaker"), "--url", redis_url, "ls", "--json"],
                                capture_output=True, text=True, timeout=30)
            listed = json.loads(ls.stdout)
            assert any(b.get("name") == name and b.get("state") == "OPEN"
                       for b in listed.get("breakers", listed)), listed
        finally:
            sys.path.remove(str(ROOT / "docker"))
            sys.modules.pop("tasks", None)
            sys.modules.pop("fleet", None)
            for key, value in old.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
