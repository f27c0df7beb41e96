"""The sdist is complete: build it from the source tree and check what it carries.

A source distribution is what a packager (or a user without git) starts from,
so it must hold everything the project's own tests and docs need: the PHP
client with its sources and Lua copy, the docker-compose fleet, the scripts and
the tests themselves. Its metadata must carry the SPDX licence, the licence
file and the one version written in ``distbreaker/__init__.py``.
"""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import distbreaker

ROOT = Path(__file__).resolve().parents[2]

REQUIRED = [
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
    "mkdocs.yml",
    "distbreaker/__init__.py",
    "distbreaker/py.typed",
    "lua/breaker.lua",
    "clients/php/composer.json",
    "clients/php/src/CircuitBreaker.php",
    "clients/php/src/Scripts.php",
    "clients/php/src/autoload.php",
    "clients/php/src/Connection.php",
    "clients/php/src/Laravel/DistbreakerServiceProvider.php",
    "clients/php/lua/breaker.lua",
    "clients/php/config/distbreaker.php",
    "clients/php/LICENSE",
    "clients/php/tests/worker.php",
    "docker/Dockerfile",
    "docker/app.py",
    "docker-compose.yml",
    "docs/KEY_SCHEMA.md",
    "docs/index.md",
    "scripts/test",
    "scripts/sync_php_lua",
    "tests/conftest.py",
    "tests/interop/test_php.py",
    "tests/fleet/test_compose.py",
    "tests/interop/test_php_laravel.py",
    "tests/helpers/laravel_app/artisan",
    "tests/packaging/test_sdist.py",
]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    built = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation",
                            "--outdir", str(out), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, f"building the sdist failed:\n{built.stdout}\n{built.stderr}"
    (archive,) = out.glob("distbreaker-*.tar.gz")
    return archive


def members(archive: Path) -> list[str]:
    """Paths inside the sdist, without the leading ``distbreaker-<version>/``."""
    with tarfile.open(archive) as tar:
        return [name.split("/", 1)[1] for name in tar.getnames() if "/" in name]


def test_sdist_is_named_after_the_one_version(sdist: Path) -> None:
    assert sdist.name == f"distbreaker-{distbreaker.__version__}.tar.gz"


def test_sdist_carries_what_its_own_tests_need(sdist: Path) -> None:
    names = set(members(sdist))
    missing = [path for path in REQUIRED if path not in names]
    assert not missing, f"the sdist lacks {missing}"
    # every tracked file of these folders, not a sample of them
    folders = ("clients/php", "docker", "lua", "docs", "tests", "scripts")
    tracked = subprocess.run(["git", "ls-files", "--", *folders], cwd=ROOT,
                             capture_output=True, text=True)
    if tracked.returncode == 0 and tracked.stdout:
        missing_files = set(tracked.stdout.splitlines()) - names
        assert not missing_files, f"tracked files missing from the sdist: {sorted(missing_files)}"


def test_sdist_leaves_out_build_litter(sdist: Path) -> None:
    names = members(sdist)
    litter = [n for n in names if "__pycache__" in n or n.endswith(".pyc")
              or n.startswith((".venv/", "site/", "dist/", "build/", ".git/"))
              or "/vendor/" in n]
    assert not litter, litter


def test_sdist_metadata_has_spdx_licence_and_urls(sdist: Path) -> None:
    with tarfile.open(sdist) as tar:
        (info,) = [m for m in tar.getmembers() if m.name.count("/") == 1
                   and m.name.endswith("/PKG-INFO")]
        handle = tar.extractfile(info)
        assert handle is not None
        meta = email.parser.Parser().parsestr(handle.read().decode())
    assert meta["Version"] == distbreaker.__version__
    assert meta["License-Expression"] == "MIT"
    assert "LICENSE" in meta.get_all("License-File", [])
    assert "Typing :: Typed" in meta.get_all("Classifier", [])
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL", []))
    assert urls["Repository"] == "https://github.com/distbreaker/distbreaker"
    assert {"Documentation", "Issues", "Changelog"} <= set(urls)


@pytest.mark.timeout(1200)  # a sub-suite (compose, Laravel, PHP) and a docs build
def test_the_sdists_own_tests_and_docs_build_run_from_it(sdist: Path, tmp_path: Path) -> None:
    """Unpacked on its own, the sdist runs the tests that need its non-Python files
    (the PHP package and its Lua, the Laravel app, docker-compose) and builds its docs."""
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp_path, filter="data")
        else:  # Python without extraction filters (before 3.10.12 / 3.11.4)
            tar.extractall(tmp_path)  # our own archive, built just now
    (tree,) = tmp_path.iterdir()
    env = {**os.environ, "PYTHONPATH": str(tree), "NO_MKDOCS_2_WARNING": "1"}
    tests = ["tests/packaging/test_php_package.py", "tests/packaging/test_docs.py",
             "tests/unit/test_key_schema_doc.py", "tests/interop/test_php_laravel.py",
             "tests/fleet/test_compose.py",
             "tests/interop/test_php.py::test_php_computes_the_same_config_wire_string_as_python"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout

    docs = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=300)
    assert docs.returncode == 0, docs.stdout + docs.stderr
    assert (tmp_path / "site" / "api" / "index.html").is_file()
