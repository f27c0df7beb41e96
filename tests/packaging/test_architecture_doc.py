"""docs/ARCHITECTURE.md stays true: every path and dotted name it cites exists, its
layout names every module of the package and every script, and it is in the site nav.

A newcomer reads ARCHITECTURE.md before changing anything; a page that names
functions or files that no longer exist sends them to the wrong place. These
checks read the page as text and the package as source (AST), so a rename that
forgets the page fails here.
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "distbreaker"
DOC = ROOT / "docs" / "ARCHITECTURE.md"

#: Names the page may call that the package does not define (the caller's code, the
#: standard library and redis-py).
FOREIGN_CALLS = {
    "O",  # O(1)
    "fn", "charge", "time.monotonic", "os.register_at_fork", "atexit", "asyncio.run",
    "TIME", "unpack", "redis.call", "redis.pcall", "print", "run_in_threadpool",
    "InvalidArgumentException",  # PHP's own
    "_private", "x._private",  # the rule about other components' `_private` attributes
}

_PATH = re.compile(
    r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.(?:py|lua|md|php|yml|json)|(?:[\w-]+/)+)(?![\w/])")
_CALL = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)\(")
_TICKED = re.compile(r"`([^`\n]+)`")


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def defined_names() -> set[str]:
    """Every name the package defines (functions, classes, methods, module constants,
    attributes set on self, dataclass fields), its module names, and the Lua scripts'
    functions and locals."""
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        names.add(path.stem)
        names.add(path.parent.name)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    for path in (ROOT / "lua").rglob("*.lua"):
        text = path.read_text(encoding="utf-8")
        names.update(re.findall(r"\bfunction\s+(?:[\w.]+[.:])?(\w+)", text))
        names.update(re.findall(r"\blocal\s+(\w+)", text))
        names.update(re.findall(r"^\s*(\w+)\s*=", text, re.M))
        names.update(re.findall(r"'([\w]+)", text))  # field names and error codes
    for path in (ROOT / "clients" / "php" / "src").rglob("*.php"):
        names.update(re.findall(r"\b(?:class|function)\s+(\w+)", path.read_text(encoding="utf-8")))
    names.update(dir(builtins))
    return names


def repository_paths() -> set[str]:
    """Every file and folder of the repository (tracked or not, caches left out), as
    paths relative to its root; folders end with a slash."""
    found: set[str] = set()
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in {".git", ".venv", "site", "build", "dist"} or "__pycache__" in rel.parts:
            continue
        found.add(str(rel) + ("/" if path.is_dir() else ""))
    return found


def cited_path_exists(cited: str, existing: set[str]) -> bool:
    """A cited path names something real: relative to the root, or as the tail of a
    real path (the page says `breaker/core.py` for `distbreaker/breaker/core.py`;
    the wheel's `distbreaker/lua/` is the source tree's `lua/`)."""
    cited = cited.replace("distbreaker/lua/", "lua/")
    return any(path == cited or path.endswith("/" + cited) for path in existing)


def test_every_cited_path_exists() -> None:
    existing = repository_paths()
    missing = sorted({m for m in _PATH.findall(doc_text())
                      if not cited_path_exists(m, existing)})
    assert not missing, f"ARCHITECTURE.md cites paths that do not exist: {missing}"


def test_every_called_or_ticked_name_is_defined() -> None:
    known = defined_names()
    text = doc_text()
    cited: set[str] = set(_CALL.findall(text))
    for ticked in _TICKED.findall(text):
        # `Class.method`, `module.name`, `name` (identifiers only; paths and code are
        # checked elsewhere or are not names)
        for token in re.findall(r"(?<![\w/.-])((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?![\w/-])", ticked):
            if "_" in token or "." in token or re.match(r"[A-Z][a-z]+[A-Z]", token):
                cited.add(token)
    bad = []
    for name in sorted(cited):
        if name in FOREIGN_CALLS or name.split(".")[0] in {"redis", "os", "time", "asyncio"}:
            continue
        parts = [p for p in name.split(".") if p not in {"py", "lua", "md"}]
        if not parts or parts[0] in {"distbreaker", "lua", "docs"}:
            parts = parts[1:]
        if any(part not in known and not (part.endswith("_") and any(
                k.startswith(part) for k in known)) for part in parts):
            bad.append(name)
    assert not bad, f"ARCHITECTURE.md names what the code does not define: {bad}"


def test_every_module_attribute_it_cites_is_defined_there() -> None:
    """`cli/actions.stored_breaker`: the module exists and defines the name."""
    existing = repository_paths()
    bad = []
    for folder, module, attr in re.findall(r"((?:[\w-]+/)+)(\w+)\.(\w+)", doc_text()):
        if attr in {"py", "lua", "md", "php", "yml", "json"}:
            continue
        files = [p for p in existing if p.endswith(f"{folder}{module}.py")]
        if not any(re.search(rf"\b(?:def|class)\s+{attr}\b|^{attr}\s*[:=]",
                             (ROOT / f).read_text(encoding="utf-8"), re.M) for f in files):
            bad.append(f"{folder}{module}.{attr}")
    assert not bad, f"ARCHITECTURE.md cites module attributes that do not exist: {bad}"


def layout_block() -> str:
    text = doc_text()
    start = text.index("## Layout")
    body = text[start:]
    return body.split("```", 2)[1]


def layout_paths() -> set[str]:
    """The paths the layout tree names: each line's leading names joined to its
    parent folders by indentation, plus the files its description names (`x.py`)."""
    paths: set[str] = set()
    stack: list[tuple[int, str]] = []
    described_from, described_base = 10**6, ""
    for line in layout_block().splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent >= described_from:  # the previous entry's description goes on
            for name in re.findall(r"(?<![\w/.])([\w]+\.py)\b", line):
                paths.add(f"{described_base}/{name}".lstrip("/"))
            continue
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        described_from = indent + len(head[0]) + 2 if len(head) > 1 else 10**6
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = "/".join(name for _, name in stack)
        entries = [e.strip() for e in head[0].split(",") if e.strip()]
        described = re.findall(r"(?<![\w/.])([\w]+\.py)\b", head[1]) if len(head) > 1 else []
        for entry in entries:
            full = f"{parent}/{entry}".lstrip("/").rstrip("/") if parent else entry.rstrip("/")
            paths.add(full)
        folder = next((e for e in entries if e.endswith("/")), None)
        base = f"{parent}/{folder}".strip("/") if folder else parent
        for name in described:
            paths.add(f"{base}/{name}".lstrip("/"))
        described_base = base
        if folder and len(entries) == 1:
            stack.append((indent, folder.rstrip("/")))
    return paths


def test_the_layout_names_only_what_exists() -> None:
    missing = sorted(p for p in layout_paths() if not (ROOT / p).exists())
    assert not missing, f"ARCHITECTURE.md's layout names what does not exist: {missing}"


def test_the_layout_names_every_module_and_script() -> None:
    named = layout_paths()
    modules = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
               if p.name != "__init__.py" and "__pycache__" not in p.parts}
    scripts = {str(p.relative_to(ROOT)) for p in (ROOT / "scripts").iterdir() if p.is_file()}
    lua = {str(p.relative_to(ROOT)) for p in (ROOT / "lua").rglob("*.lua")}
    absent = sorted((modules | scripts | lua) - named)
    assert not absent, f"ARCHITECTURE.md's layout leaves out: {absent}"


def test_architecture_is_in_the_site_nav() -> None:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    assert "ARCHITECTURE.md" in str(nav)
