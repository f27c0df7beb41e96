"""The documentation site keeps up with the code: a guide and an API entry per
integration, every CLI command in the CLI guide, every nav page present.

`scripts/test` builds the site with ``mkdocs build --strict`` (broken links,
missing pages and docstrings mkdocstrings cannot render fail it); these checks
catch what a strict build cannot see: an integration or a command that was
added without being documented.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from distbreaker.cli import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def nav_pages(entries: Any) -> list[str]:
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in nav_pages(value)]
    return []


def config() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "mkdocs.yml").read_text()))


def test_every_nav_page_exists_and_docs_dir_is_docs() -> None:
    cfg = config()
    assert cfg.get("docs_dir", "docs") == "docs"
    pages = [p for p in nav_pages(cfg["nav"]) if not p.startswith(("http://", "https://"))]
    missing = [p for p in pages if not (DOCS / p).is_file()]
    assert not missing, missing
    for existing in ("KEY_SCHEMA.md", "OPERATIONS.md", "CLI_JSON.md", "CHAOS.md"):
        assert existing in pages, f"docs/{existing} is not in the site's nav"


def integrations() -> list[str]:
    return sorted(p.stem for p in (ROOT / "distbreaker" / "contrib").glob("*.py")
                  if not p.stem.startswith("_"))


def test_every_integration_has_a_guide_and_an_api_entry() -> None:
    pages = set(nav_pages(config()["nav"]))
    api = (DOCS / "api" / "contrib.md").read_text()
    assert integrations(), "no integration found"
    for module in integrations():
        assert f"guides/{module}.md" in pages, f"no guide page for distbreaker.contrib.{module}"
        assert f"::: distbreaker.contrib.{module}" in api, f"{module} missing from api/contrib.md"


def test_every_cli_command_is_in_the_cli_guide() -> None:
    guide = (DOCS / "guides" / "cli.md").read_text()
    for command in cli.load_all():
        assert re.search(rf"distbreaker (\S+ )*{re.escape(command)}\b", guide), \
            f"`distbreaker {command}` is not shown in docs/guides/cli.md"


def test_the_site_includes_readme_install_and_changelog() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "--8<-- [start:install]" in readme and "--8<-- [end:install]" in readme
    assert '--8<-- "README.md:install"' in (DOCS / "install.md").read_text()
    assert '--8<-- "CHANGELOG.md"' in (DOCS / "changelog.md").read_text()


def test_the_install_section_names_every_extra() -> None:
    """Every extra of pyproject.toml is named in README's install section (users
    learn the extras there; one added without a word is invisible)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    readme = (ROOT / "README.md").read_text()
    install = readme.split("--8<-- [start:install]")[1].split("--8<-- [end:install]")[0]
    missing = sorted(name for name in extras if f"`{name}`" not in install)
    assert not missing, f"README's install section does not name the extras {missing}"


def test_user_docs_name_no_internal_module() -> None:
    """README and the guides send users to public names only (`distbreaker._runtime`
    is internal, CHANGELOG's versioning policy): e.g. `distbreaker.after_fork()`."""
    pages = [ROOT / "README.md", *sorted((DOCS / "guides").glob("*.md"))]
    offenders = [p.name for p in pages if "distbreaker._runtime" in p.read_text()]
    assert not offenders, offenders


def test_web_framework_guides_are_not_copies() -> None:
    """The ASGI, Django and Flask pages keep only what differs; what they share is
    written once, in guides/web.md, which each of them links to."""
    common = (DOCS / "guides" / "web.md").read_text()
    assert "guides/web.md" in nav_pages(config()["nav"])
    paragraphs: dict[str, list[str]] = {}
    for framework in ("asgi", "django", "flask"):
        page = (DOCS / "guides" / f"{framework}.md").read_text()
        assert "(web.md)" in page, f"guides/{framework}.md does not link to web.md"
        for paragraph in (p.strip() for p in page.split("\n\n") if len(p.strip()) > 60):
            assert paragraph not in common, f"guides/{framework}.md copies web.md"
            paragraphs.setdefault(paragraph, []).append(framework)
    shared = {p[:60]: names for p, names in paragraphs.items() if len(names) > 1}
    assert not shared, shared
