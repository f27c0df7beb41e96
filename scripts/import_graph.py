#!/usr/bin/env python3
"""Print distbreaker's import circles, upward imports and reach-ins; exit 1 if any.

Why: the package is layered (shared machinery at the bottom, components above it,
composition and front ends on top), and a layer that knows one above it, or two
modules that need each other, is where a change in one place breaks another.

The graph is read from the source (``ast``, nothing is imported), one node per
module of ``distbreaker``:

* Every ``import`` / ``from ... import`` of a ``distbreaker`` module counts, at
  module level *and inside functions* (a lazy import is still a dependency),
  except under ``if TYPE_CHECKING:`` (never executed, so it cannot make a circle;
  it still counts as an upward import: a type is knowledge of the layer above).
* ``from pkg import name`` is an edge to ``pkg.name`` when that is a module,
  else to ``pkg``. Importing ``a.b.c`` runs ``a/b/__init__.py`` first, but that
  implicit edge is left out: a package's ``__init__`` re-exporting its own
  modules would otherwise be a circle with each of them.

(a) **Circles** are reported at two levels: between modules (the strongly
connected components of the module graph) and between *units*, a unit being a
top-level module or subpackage of ``distbreaker`` (``_runtime``, ``breaker``,
``errors``, ...), edges inside one unit left out.

(b) **Upward imports**: each unit has a layer in `LAYERS`; a unit may import
any lower layer, never a higher one, and units of its own layer only where
`ALLOWED` says so (so one component never imports another, and the CLI and the
dashboard share operator actions through `distbreaker.operate`). Importing a
``_private`` name or module of another unit in `SEALED` is reported at any layer.

(c) **Reach-ins**: ``x._private`` where ``x`` is not ``self``, ``cls`` or
``type(self)``: one object using another's private attribute (``policy`` setting
``self.breaker._codec.ramp_enabled``). `HOOKS` are private by convention but
called from outside on purpose; any other case needs a ``# reach-in: why``
comment on its line (e.g. building a third-party object the library offers no
constructor for).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "distbreaker"
PACKAGE = "distbreaker"

#: Bottom to top. A unit may import units of a lower layer.
LAYERS: list[tuple[str, set[str], bool]] = [
    # (layer name, its units, whether units of this layer may import each other)
    ("errors", {"errors"}, False),
    ("runtime", {"_runtime"}, False),  # shared machinery, classification included
    ("component", {"breaker", "bulkhead", "budget", "retry", "ganesha", "ratelimiter", "pool"},
     False),
    # Compose the components: the policy, the fleet's read side, operator actions.
    ("composition", {"policy", "readside", "readside_pool", "operate", "inject", "recording"},
     False),
    ("registry", {"registry"}, False),
    ("integration", {"contrib", "_facade"}, False),
    ("package", {"__init__", "aio"}, False),
    ("front end", {"cli", "dashboard", "demo", "__main__"}, False),
]

#: Declared exceptions to "same layer: no imports between units": (importer, imported).
#: The CLI starts the dashboard and the demo (two of its commands); the package root
#: and `distbreaker.aio` share `_facade`'s names; `__main__` runs the CLI.
#: Operator actions read stored breakers through the read side.
ALLOWED: set[tuple[str, str]] = {
    ("cli", "dashboard"), ("cli", "demo"), ("__main__", "cli"), ("operate", "readside"),
}

#: Units whose modules others import by public name only (no ``_private`` names).
SEALED = {"_runtime", "breaker", "bulkhead", "budget", "retry", "ganesha", "ratelimiter", "pool",
          "policy"}

#: Private methods other modules call on purpose (the fork-safety protocol of
#: `distbreaker._runtime.forking`).
HOOKS = {"_after_fork"}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module
    line: int
    names: tuple[str, ...]  # the names imported (from-imports), or ()
    typing_only: bool


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def layer_of(unit: str) -> int:
    for index, (_, units, _) in enumerate(LAYERS):
        if unit in units:
            return index
    raise SystemExit(f"import_graph: unit {unit!r} has no layer: add it to LAYERS")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Imports(ast.NodeVisitor):
    """Collects the imports of one module, noting those under ``if TYPE_CHECKING``."""

    def __init__(self, module: str, is_package: bool, modules: set[str]) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.modules = modules
        self.edges: list[Edge] = []
        self._typing = 0

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._typing += 1
            for child in node.body:
                self.visit(child)
            self._typing -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def _add(self, target: str, line: int, names: tuple[str, ...]) -> None:
        while target and target not in self.modules:  # `import a.b.Name` -> a.b
            target = target.rpartition(".")[0]
        if target and target != self.module:
            self.edges.append(Edge(self.module, target, line, names, self._typing > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                self._add(alias.name, node.lineno, ())

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            if node.level > 1:
                base = base[: -(node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        if not (origin == PACKAGE or origin.startswith(PACKAGE + ".")):
            return
        plain: list[str] = []
        for alias in node.names:
            submodule = f"{origin}.{alias.name}"
            if submodule in self.modules:
                self._add(submodule, node.lineno, ())
            else:
                plain.append(alias.name)
        if plain:
            self._add(origin, node.lineno, tuple(plain))


def _is_self(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "type" and len(node.args) == 1 and _is_self(node.args[0]))


def reach_ins(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(path, line, expression) of every ``x._private`` access not on ``self``."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source, str(path))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and node.attr not in HOOKS
                    and not _is_self(node.value)
                    and "# reach-in:" not in lines[node.lineno - 1]):
                found.append((str(path.relative_to(root.parent)), node.lineno,
                              ast.unparse(node)))
    return sorted(found)


def build_graph(root: Path = ROOT) -> tuple[set[str], list[Edge]]:
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(p, root) for p in paths}
    edges: list[Edge] = []
    for path in paths:
        collector = _Imports(module_name(path, root), path.name == "__init__.py", modules)
        collector.visit(ast.parse(path.read_text(), str(path)))
        edges.extend(collector.edges)
    return modules, edges


def circles(nodes: set[str], pairs: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in pairs:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def strongconnect(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                strongconnect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(nodes) + 100))
    for node in sorted(nodes):
        if node not in index:
            strongconnect(node)
    return sorted(found)


def upward(edges: list[Edge]) -> list[tuple[Edge, str]]:
    """Every import that breaks the declared layering, with the reason."""
    found: list[tuple[Edge, str]] = []
    for edge in edges:
        source, target = unit_of(edge.source), unit_of(edge.target)
        private = [n for n in edge.names if n.startswith("_") and not n.startswith("__")]
        private_module = any(part.startswith("_") and not part.startswith("__")
                             for part in edge.target.split(".")[2:])
        if source == target:
            continue
        if target in SEALED and (private or private_module):
            what = ", ".join(private) if private else edge.target
            found.append((edge, f"private piece of {target}: {what}"))
            continue
        if (source, target) in ALLOWED:
            continue
        low, high = layer_of(target), layer_of(source)
        if low > high:
            found.append((edge, f"{source} ({LAYERS[high][0]}) imports {target} "
                                f"({LAYERS[low][0]}), a higher layer"))
        elif low == high and not LAYERS[low][2]:
            found.append((edge, f"{source} and {target} are both {LAYERS[low][0]}s: "
                                "no imports between them unless ALLOWED"))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--edges", action="store_true", help="also print every edge")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the package directory (default: this checkout's distbreaker)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    modules, edges = build_graph(root)
    runtime = [e for e in edges if not e.typing_only]
    module_circles = circles(modules, {(e.source, e.target) for e in runtime})
    unit_pairs = {(unit_of(e.source), unit_of(e.target)) for e in runtime
                  if unit_of(e.source) != unit_of(e.target)}
    unit_circles = circles({unit_of(m) for m in modules}, unit_pairs)
    bad = upward(edges)
    reaches = reach_ins(root)
    if args.edges:
        for e in edges:
            print(f"edge {e.source} -> {e.target}{' (typing)' if e.typing_only else ''}")
    print(f"circles between modules: {len(module_circles)}")
    for circle in module_circles:
        print("  " + " <-> ".join(circle))
    print(f"circles between units: {len(unit_circles)}")
    for circle in unit_circles:
        print("  " + " <-> ".join(circle))
    print(f"upward imports: {len(bad)}")
    for edge, reason in bad:
        path = edge.source.replace(".", "/")
        print(f"  {path}.py:{edge.line}: {edge.target}"
              f"{' (TYPE_CHECKING)' if edge.typing_only else ''}: {reason}")
    print(f"reach-ins: {len(reaches)}")
    for path, line, expression in reaches:
        print(f"  {path}:{line}: {expression}")
    return 1 if module_circles or unit_circles or bad or reaches else 0


if __name__ == "__main__":
    sys.exit(main())
