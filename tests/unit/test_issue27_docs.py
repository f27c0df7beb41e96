"""The registry YAML of the issue-27 guides is valid as written (a reader copies it):
fault injection, recording and shadow configs (issue 27 review)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from distbreaker.registry.config import RegistrySpec

DOCS = Path(__file__).resolve().parents[2] / "docs" / "guides"


def registry_blocks(page: str) -> list[str]:
    text = (DOCS / page).read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    return [b for b in blocks if re.search(r"^breakers:", b, re.M)]


@pytest.mark.parametrize("page", ["fault_injection.md", "tuning.md", "shadow.md"])
def test_every_registry_example_of_the_guide_loads(page: str) -> None:
    blocks = registry_blocks(page)
    assert blocks, page
    for block in blocks:
        spec = RegistrySpec(yaml.safe_load(block), source=page, environ={})
        for name in ("payments", "llm:chat"):
            spec.resolve("breaker", name)


def test_the_fault_injection_example_allows_the_names_the_guide_injects() -> None:
    spec = RegistrySpec(yaml.safe_load(registry_blocks("fault_injection.md")[0]),
                        source="guide", environ={})
    for name in ("payments", "llm:chat"):
        assert spec.resolve("breaker", name).config.allow_fault_injection
