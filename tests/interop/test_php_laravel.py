"""clients/php in a real Laravel application, as its README's Laravel section says.

`tests/helpers/laravel_app/` is a small Laravel application (HTTP and console kernels,
the framework's service providers, routes, an AppServiceProvider). The test
copies it, installs `clients/php` into it with composer, lets Laravel discover
the package's provider and facade, publishes the package's config with
`vendor:publish`, and drives it through HTTP (`php -S` serving
`public/index.php`) and artisan commands, next to Python workers on the same
redis-server. The framework is Debian's php-laravel-framework (Laravel 8,
installed by scripts/test); composer and php-redis too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

import distbreaker
from distbreaker import CircuitBreaker
from distbreaker._runtime.keys import BreakerKeys
from distbreaker._runtime.scripts import load_script
from distbreaker.breaker.config import BreakerConfig
from distbreaker.breaker.state import State
from distbreaker.demo.embedded import RedisServer, free_port
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "tests" / "helpers" / "laravel_app"
PACKAGE = ROOT / "clients" / "php"
LARAVEL = Path("/usr/share/php/Illuminate/Foundation/Application.php")

# The `payments` instance a developer adds to the published config/distbreaker.php.
PAYMENTS = {"sliding_window_size": 4, "minimum_number_of_calls": 4,
            "wait_duration_in_open_state": 30.0, "permitted_calls_in_half_open": 2}
PAYMENTS_PHP = """'payments' => [
                'sliding_window_size' => 4,
                'minimum_number_of_calls' => 4,
                'wait_duration_in_open_state' => '30s',
                'permitted_calls_in_half_open' => 2,
            ],"""


@dataclass
class LaravelApp:
    php: str
    root: Path
    published: str       # config/distbreaker.php as vendor:publish wrote it
    redis_port: int

    def env(self, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("DISTBREAKER_", "REDIS_", "COMPOSER"))}
        return {**base, "DISTBREAKER_REDIS_PORT": str(self.redis_port), **extra}

    def artisan(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.php, "artisan", *args], cwd=self.root, env=self.env(**env),
                              capture_output=True, text=True, timeout=60)

    def command(self, *args: str, **env: str) -> Any:
        done = self.artisan(*args, **env)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])


def laravel_tools() -> tuple[str, str]:
    php, composer = shutil.which("php"), shutil.which("composer")
    if php is None or composer is None or not LARAVEL.is_file():
        pytest.fail("the Laravel test needs php, composer and php-laravel-framework: run "
                    "scripts/test (it installs them) or `apt-get install -y php-cli php-redis "
                    "composer php-laravel-framework`")
    return php, composer


@pytest.fixture(scope="module")
def laravel(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
            php: str) -> LaravelApp:
    _, composer = laravel_tools()
    root = tmp_path_factory.mktemp("laravel") / "app"
    shutil.copytree(APP, root)
    for folder in ("bootstrap/cache", "storage/logs", "storage/app", "storage/framework/cache",
                   "storage/framework/views", "storage/framework/sessions", "resources/views"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    manifest = json.loads((root / "composer.json").read_text())
    manifest["repositories"] = [
        {"type": "path", "url": str(PACKAGE),
         "options": {"symlink": False,
                     "versions": {"distbreaker/distbreaker": distbreaker.__version__}}},
        {"packagist.org": False},
    ]
    (root / "composer.json").write_text(json.dumps(manifest, indent=4))
    composer_env = {**{k: v for k, v in os.environ.items() if not k.startswith("COMPOSER")},
                    "COMPOSER_HOME": str(root.parent / ".composer"),
                    "COMPOSER_ALLOW_SUPERUSER": "1", "COMPOSER_DISABLE_NETWORK": "1"}
    # composer runs `package:discover` itself in laravel/laravel's post-autoload-dump
    # script; this app has no composer scripts, so artisan does it below.
    done = subprocess.run([composer, "install", "--no-interaction", "--no-progress"], cwd=root,
                          env=composer_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

    app = LaravelApp(php=php, root=root, published="", redis_port=redis_server.port)
    for step in (("package:discover",), ("vendor:publish", "--tag=distbreaker-config")):
        result = app.artisan(*step)
        assert result.returncode == 0, f"artisan {' '.join(step)}: {result.stdout}{result.stderr}"
    config = root / "config" / "distbreaker.php"
    app.published = config.read_text()
    # what a developer does next: add an instance to the published config
    marker = "'instances' => [\n            // 'payments'"
    assert marker in app.published
    config.write_text(app.published.replace(marker, "'instances' => [\n            "
                                            + PAYMENTS_PHP + "\n            // 'payments'", 1))
    return app


@pytest.fixture
def served(laravel: LaravelApp, redis_url: str) -> Iterator[Any]:
    """Start `php -S` on public/index.php with the given env; yields a GET helper."""
    servers: list[subprocess.Popen[bytes]] = []

    def start(**env: str) -> Any:
        port = free_port()
        server = subprocess.Popen([laravel.php, "-S", f"127.0.0.1:{port}", "-t", "public",
                                   "public/index.php"], cwd=laravel.root, env=laravel.env(**env),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers.append(server)
        def serving() -> bool:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/missing", timeout=5)
            except urllib.error.HTTPError:
                return True                  # Laravel answered (404): serving
            except OSError:
                assert server.poll() is None, "php -S exited"
                return False
            return True

        wait_until(serving, timeout=60, interval=0.05, what="php -S serves")

        def get(path: str) -> Any:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=20) as reply:
                return json.loads(reply.read())

        return get

    yield start
    for server in servers:
        server.terminate()
        server.wait(10)


def test_provider_and_facade_are_discovered_and_config_published(laravel: LaravelApp) -> None:
    manifest = (laravel.root / "bootstrap" / "cache" / "packages.php").read_text()
    assert "Distbreaker\\\\Laravel\\\\DistbreakerServiceProvider" in manifest
    assert "Distbreaker\\\\Laravel\\\\Facades\\\\Distbreaker" in manifest
    assert "DistbreakerServiceProvider" not in (laravel.root / "config" / "app.php").read_text(), \
        "the provider must come from package discovery, not config/app.php"
    assert laravel.published == (PACKAGE / "config" / "distbreaker.php").read_text()
    installed = laravel.root / "vendor" / "distbreaker" / "distbreaker"
    assert (installed / "lua" / "breaker.lua").read_text(encoding="utf-8") == \
        load_script("breaker").source  # the EVAL form generated from lua/breaker.lua


def test_config_file_and_service_provider_options_reach_the_breaker(
        laravel: LaravelApp, redis_url: str) -> None:
    options = laravel.command("distbreaker:options", "breaker", "payments")
    assert options["wait_duration_in_open_state"] == 30          # '30s' from the config file
    assert options["minimum_number_of_calls"] == 4
    assert options["ignore_predicate"] == "closure"              # from AppServiceProvider
    assert options["prefix"] == "distbreaker"
    # the published defaults are Python's: no config drift between the languages
    search = laravel.command("distbreaker:options", "breaker", "search")
    assert "ignore_predicate" not in search
    search.pop("prefix")
    assert BreakerConfig(**search).to_wire() == BreakerConfig().to_wire()


def test_failures_through_a_laravel_route_open_the_breaker_for_python(
        laravel: LaravelApp, served: Any, redis_url: str, redis_client: redis.Redis) -> None:
    get = served()
    assert get("/charge/payments") == {"status": "charged"}
    answers = [get("/charge/payments?fail=1") for _ in range(4)]
    rejected = "Distbreaker\\CallNotPermitted"
    assert [a["error"] for a in answers] == ["RuntimeException"] * 3 + [rejected]
    assert answers[-1]["state"] == "OPEN"

    python = CircuitBreaker("payments", redis=redis_url, **PAYMENTS)
    assert python.state is State.OPEN
    python.metrics()
    assert python.config_drift is None, "PHP (from the Laravel config) and Python disagree"
    assert get("/state/payments")["wire"] == BreakerConfig(**PAYMENTS).to_wire()


def test_a_breaker_python_trips_rejects_laravel_jobs(laravel: LaravelApp, redis_url: str) -> None:
    python = CircuitBreaker("payments", redis=redis_url, **PAYMENTS)
    python.trip("gateway down")
    rejected = laravel.command("distbreaker:charge", "payments")
    assert rejected["outcome"] == "rejected" and rejected["state"] == "OPEN"
    assert 10 < rejected["retry_after"] <= 30  # what is left of the 30 s wait


def test_client_errors_ignored_by_the_providers_predicate_are_not_counted(
        laravel: LaravelApp, redis_url: str, redis_client: redis.Redis) -> None:
    for _ in range(5):
        result = laravel.command("distbreaker:charge", "payments", "--invalid")
        assert result == {"outcome": "failed", "error": "InvalidArgumentException",
                          "counted": "ignored"}
    python = CircuitBreaker("payments", redis=redis_url, **PAYMENTS)
    metrics = python.metrics()
    assert (metrics.calls, metrics.failed) == (0, 0)
    assert python.state is State.CLOSED


def test_bulkhead_and_budget_from_the_facade(laravel: LaravelApp, redis_url: str,
                                            redis_client: redis.Redis) -> None:
    result = laravel.command("distbreaker:guarded", "payments")
    assert result == {"deposit": result["deposit"], "bulkhead": "ran", "retry_allowed": True,
                      "connected": True, "same_instance": True}
    assert result["deposit"] >= 1


def test_redis_down_at_boot_fails_open_in_routes_and_jobs(
        laravel: LaravelApp, served: Any, redis_url: str, redis_client: redis.Redis) -> None:
    dead = str(free_port())
    get = served(DISTBREAKER_REDIS_PORT=dead)
    assert [get("/charge/payments") for _ in range(3)] == [{"status": "charged"}] * 3
    job = laravel.command("distbreaker:charge", "payments", DISTBREAKER_REDIS_PORT=dead)
    assert job == {"outcome": "ran"}
    guarded = laravel.command("distbreaker:guarded", "payments", DISTBREAKER_REDIS_PORT=dead)
    assert guarded == {"deposit": 0, "bulkhead": "ran", "retry_allowed": False,
                       "connected": False, "same_instance": True}
    assert redis_client.exists(BreakerKeys.build("payments").state) == 0


def test_fail_closed_from_the_environment_rejects_while_redis_is_down(
        laravel: LaravelApp, redis_url: str) -> None:
    job = laravel.command("distbreaker:charge", "payments", DISTBREAKER_REDIS_PORT=str(free_port()),
                          DISTBREAKER_ON_REDIS_ERROR="fail_closed")
    assert job["outcome"] == "rejected" and job["state"] == "UNKNOWN"
