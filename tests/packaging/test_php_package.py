"""clients/php is a composer package that carries the Lua it runs.

`lua/` is the one source of the scripts; `scripts/sync_php_lua` writes the EVAL
form (`distbreaker._runtime.scripts.eval_form`) of the ones the PHP client loads
into `clients/php/lua/`, so that the package works wherever composer installs
it. These tests check that the shipped scripts are exactly those EVAL forms,
that the sync script's check catches a stale copy, that
composer accepts the package, and that a project installing it with composer
runs a breaker from its vendor folder alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

import distbreaker
from distbreaker._runtime.keys import BreakerKeys
from distbreaker._runtime.scripts import eval_form

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "php"
SYNC = ROOT / "scripts" / "sync_php_lua"


def scripts_the_php_client_loads() -> set[str]:
    names = set()
    for source in (PACKAGE / "src").rglob("*.php"):
        names |= set(re.findall(r"const SCRIPT = '([a-z_]+)'", source.read_text()))
    return names


def sync_env() -> dict[str, str]:
    """The sync script runs this interpreter (it imports distbreaker)."""
    return {**os.environ, "PYTHON": sys.executable}


def test_the_package_carries_the_eval_form_of_each_script() -> None:
    needed = scripts_the_php_client_loads()
    assert needed == {"breaker", "bulkhead", "budget"}
    shipped = {p.stem for p in (PACKAGE / "lua").glob("*.lua")}
    assert shipped == needed, "clients/php/lua must hold exactly the scripts the client loads"
    for name in needed:
        copy, source = PACKAGE / "lua" / f"{name}.lua", ROOT / "lua" / f"{name}.lua"
        assert copy.read_text(encoding="utf-8") == eval_form(source.read_text(encoding="utf-8")), \
            f"{copy.relative_to(ROOT)} is not the EVAL form of lua/{name}.lua: " \
            "run scripts/sync_php_lua"
    assert (PACKAGE / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    result = subprocess.run([str(SYNC), "--check"], capture_output=True, text=True, timeout=30,
                            env=sync_env())
    assert result.returncode == 0, result.stderr


def test_sync_script_check_catches_a_stale_copy_and_sync_fixes_it(tmp_path: Path) -> None:
    tree = tmp_path / "repo"
    for part in ("lua", "clients/php/lua", "scripts"):
        (tree / part).mkdir(parents=True)
    for script in (ROOT / "lua").glob("*.lua"):
        shutil.copy(script, tree / "lua")
    for copy in (PACKAGE / "lua").glob("*.lua"):
        shutil.copy(copy, tree / "clients/php/lua")
    shutil.copy(ROOT / "LICENSE", tree / "LICENSE")
    shutil.copy(PACKAGE / "LICENSE", tree / "clients/php/LICENSE")
    shutil.copy(SYNC, tree / "scripts")
    sync = tree / "scripts" / "sync_php_lua"

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(sync), "--check"], capture_output=True, text=True, timeout=30,
                              env=sync_env())

    assert check().returncode == 0
    with (tree / "lua" / "breaker.lua").open("a") as edited:
        edited.write("-- changed\n")
    (tree / "clients/php/lua/stray.lua").write_text("return 1\n")
    stale = check()
    assert stale.returncode == 1
    assert "clients/php/lua/breaker.lua differs" in stale.stderr
    assert "stray.lua is not a script the PHP client runs" in stale.stderr

    subprocess.run([str(sync)], check=True, capture_output=True, timeout=30, env=sync_env())
    assert check().returncode == 0
    assert (tree / "clients/php/lua/breaker.lua").read_text(encoding="utf-8") == \
        eval_form((tree / "lua/breaker.lua").read_text(encoding="utf-8"))
    assert not (tree / "clients/php/lua/stray.lua").exists()


@pytest.fixture(scope="module")
def composer() -> list[str]:
    binary = shutil.which("composer")
    if binary is None:
        pytest.fail("composer is not installed: run scripts/test (it installs it) or "
                    "`apt-get install -y composer`")
    return [binary, "--no-interaction", "--no-ansi"]


def composer_env(home: Path) -> dict[str, str]:
    """No user config, no network: a composer of its own in `home`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("COMPOSER")},
            "COMPOSER_HOME": str(home / ".composer"), "COMPOSER_ALLOW_SUPERUSER": "1",
            "COMPOSER_DISABLE_NETWORK": "1"}


def test_composer_validates_the_package(composer: list[str], tmp_path: Path) -> None:
    done = subprocess.run([*composer, "validate", "--strict", "--no-check-publish",
                           "--no-check-lock"], cwd=PACKAGE, env=composer_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((PACKAGE / "composer.json").read_text())
    assert manifest["name"] == "distbreaker/distbreaker"
    assert manifest["autoload"]["psr-4"] == {"Distbreaker\\": "src/"}
    assert manifest["extra"]["distbreaker-schema"] == distbreaker.SCHEMA_VERSION
    laravel = manifest["extra"]["laravel"]
    for cls in [*laravel["providers"], *laravel["aliases"].values()]:
        path = PACKAGE / "src" / (cls.removeprefix("Distbreaker\\").replace("\\", "/") + ".php")
        assert path.is_file(), f"{cls} has no file {path}"


def path_repository_project(tmp_path: Path, require: dict[str, str]) -> Path:
    """A composer project requiring clients/php from a path repository (copied, not
    symlinked: what an install from a package archive gives)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "composer.json").write_text(json.dumps({
        "name": "example/app", "type": "project", "require": require,
        "repositories": [
            {"type": "path", "url": str(PACKAGE),
             "options": {"symlink": False,
                         "versions": {"distbreaker/distbreaker": distbreaker.__version__}}},
            {"packagist.org": False},
        ],
    }, indent=2))
    return project


INSTALLED = r"""<?php
require __DIR__ . '/vendor/autoload.php';
$redis = new Redis();
$redis->connect('127.0.0.1', (int) $argv[1], 2.0);
$breaker = new Distbreaker\CircuitBreaker($redis, $argv[2], [
    'sliding_window_size' => 2, 'minimum_number_of_calls' => 2,
    'wait_duration_in_open_state' => 60]);
$outcomes = [];
for ($i = 0; $i < 3; $i++) {
    try {
        $breaker->call(static function () { throw new RuntimeException('down'); });
    } catch (Distbreaker\CallNotPermitted) {
        $outcomes[] = 'rejected';
    } catch (RuntimeException) {
        $outcomes[] = 'failed';
    }
}
echo json_encode(['lua_dir' => realpath(Distbreaker\Scripts::defaultDir()),
                  'outcomes' => $outcomes]);
"""


def test_a_composer_install_runs_from_its_vendor_folder_alone(
        composer: list[str], php: str, tmp_path: Path, redis_url: str,
        redis_client: redis.Redis, name: str) -> None:
    project = path_repository_project(tmp_path, {"distbreaker/distbreaker":
                                                 f"^{distbreaker.__version__}"})
    env = composer_env(tmp_path)
    done = subprocess.run([*composer, "install", "--no-progress"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    installed = project / "vendor" / "distbreaker" / "distbreaker"
    assert not installed.is_symlink()
    assert sorted(p.name for p in (installed / "lua").glob("*.lua")) == \
        ["breaker.lua", "budget.lua", "bulkhead.lua"]
    assert (installed / "config" / "distbreaker.php").is_file()

    (project / "run.php").write_text(INSTALLED)
    php_env = {k: v for k, v in os.environ.items() if k != "DISTBREAKER_LUA_DIR"}
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    run = subprocess.run([php, "run.php", port, name], cwd=project, env=php_env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert Path(report["lua_dir"]) == (installed / "lua").resolve(), \
        "the installed client must load the Lua it carries, not the repository's lua/"
    assert report["outcomes"] == ["failed", "failed", "rejected"]
    assert redis_client.hget(BreakerKeys.build(name).state, "state") == b"OPEN"
