#!/usr/bin/env python3
"""Check the shape of a Python package: import cycles, import depth, long functions.

    python tools/check_structure.py [PACKAGE_DIR] [--max-depth 6] [--max-lines 60] [--json]

PACKAGE_DIR defaults to ``zarr_fused`` next to this tool. The exit status is
1 when the package has an import cycle, an import chain deeper than
``--max-depth`` modules, or a function longer than ``--max-lines`` lines
that `ALLOWED_LONG_FUNCTIONS` does not list; 0 otherwise.

What counts (standard library ``ast`` only, nothing is imported):

- **Modules** are the ``.py`` files under PACKAGE_DIR (``a/__init__.py`` is
  the package ``pkg.a``). Compiled extensions (a ``.pyx`` or a built
  ``.so``/``.pyd`` of that name) are leaves: importing one adds no edge.
- **Edges** are the imports of the package's own modules written anywhere
  in a module: at the top, inside functions and methods (a lazy import
  still ties the two modules together), absolute or relative.
  ``from pkg.a import x`` is an edge to ``pkg.a.x`` when that is a module,
  else to ``pkg.a``; ``from pkg import name`` is an edge to ``pkg`` (its
  ``__init__``) unless ``name`` is a submodule. Imports under
  ``if TYPE_CHECKING:`` count as well (as import-linter counts them): a
  type one module needs from another is a dependency of its reader and of
  mypy, and a cycle through one is a layering problem even though it never
  runs (``--runtime-only`` leaves them out). The parent packages
  Python initialises before a submodule are left out too: they are not a
  dependency the code chose, and counting them would make every
  ``__init__`` that imports its own submodules a cycle.
- **Depth** is the number of modules on the longest chain of imports that
  run (a module that imports none of the package has depth 1): an import
  under ``if TYPE_CHECKING:`` names a type and loads nothing, so it takes
  part in the cycle check but not in the depth. With cycles, each
  strongly connected component counts with all its modules.
- **Function length** is from the ``def`` line to the last line of the
  body, docstring and nested functions included, decorators excluded.
  The Cython sources (``.pyx``, and ``.pxd`` files, whose ``inline``
  functions have bodies) are measured the same way: every ``def``,
  ``cdef`` and ``cpdef`` function and method, from the line that starts it
  to the last line of its body (found with ``tokenize``, which reads
  Cython's syntax as Python tokens; declarations without a body, such as
  a ``.pxd`` prototype, are no function). They are named like Python
  functions, after the extension: ``pkg._ext.Class.method``.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MAX_DEPTH = 6
MAX_LINES = 60

#: Functions allowed to be longer than MAX_LINES: qualified name -> reason.
#: A name is ``module.Class.method`` or ``module.outer.inner``.
ALLOWED_LONG_FUNCTIONS: dict[str, str] = {}


@dataclass(frozen=True)
class LongFunction:
    name: str
    lines: int
    path: str
    lineno: int


@dataclass
class Report:
    package: str
    modules: list[str]
    edges: dict[str, set[str]]
    cycles: list[list[str]]
    depth: int
    chain: list[list[str]]  # the longest chain, one component (usually one module) per step
    long_functions: list[LongFunction]
    allowed: dict[str, str] = field(default_factory=dict)

    @property
    def unallowed(self) -> list[LongFunction]:
        return [f for f in self.long_functions if f.name not in self.allowed]

    @property
    def stale_allowances(self) -> list[str]:
        """Allow-list entries that name no long function (any more)."""
        long = {f.name for f in self.long_functions}
        return sorted(name for name in self.allowed if name not in long)

    def problems(self, max_depth: int) -> list[str]:
        out = [f"import cycle: {' -> '.join(c + c[:1])}" for c in self.cycles]
        if self.depth > max_depth:
            out.append(f"import depth {self.depth} > {max_depth}: {_chain_text(self.chain)}")
        out += [
            f"{f.path}:{f.lineno}: {f.name} is {f.lines} lines (not in ALLOWED_LONG_FUNCTIONS)"
            for f in self.unallowed
        ]
        return out


# -- modules and imports --------------------------------------------------------------


def find_modules(package_dir: Path) -> tuple[dict[str, Path], set[str]]:
    """The ``.py`` modules under ``package_dir`` by dotted name, and the names
    of its compiled extensions."""
    root = package_dir.name
    modules: dict[str, Path] = {}
    extensions: set[str] = set()
    for path in sorted(package_dir.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        parts = path.relative_to(package_dir).with_suffix("").parts
        if path.suffix == ".py":
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((root, *parts))] = path
        elif path.suffix in (".pyx", ".so", ".pyd"):
            # _codecs.cpython-313-x86_64-linux-gnu.so -> _codecs
            name = parts[-1].split(".", 1)[0]
            extensions.add(".".join((root, *parts[:-1], name)))
    return modules, extensions


def _nodes(tree: ast.AST, type_checking: bool) -> Iterator[ast.AST]:
    """Every node of ``tree``; without those under ``if TYPE_CHECKING:``
    unless ``type_checking``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not type_checking and isinstance(child, ast.If) and _is_type_checking(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The absolute module named by ``from <node.module> import ...`` in ``module``."""
    if node.level == 0:
        return node.module
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    if not base:
        return None
    return ".".join(base + ([node.module] if node.module else []))


def _target(name: str, modules: dict[str, Path], extensions: set[str]) -> str | None:
    """The package module ``name`` lands on: itself, or the nearest module
    above it (``pkg.a.attr`` -> ``pkg.a``); None outside the package or for
    a compiled extension."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in extensions:
            return None
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def module_imports(
    module: str,
    path: Path,
    modules: dict[str, Path],
    extensions: set[str],
    type_checking: bool = True,
) -> set[str]:
    """The package modules ``module`` imports, anywhere in its code."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str | None] = set()
    for node in _nodes(tree, type_checking):
        if isinstance(node, ast.Import):
            found.update(_target(alias.name, modules, extensions) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node)
            if base is None:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                # `from pkg import sub`: the submodule (or extension) itself;
                # `from pkg import name`: the module that defines the name
                if sub in modules or sub in extensions:
                    found.add(_target(sub, modules, extensions))
                else:
                    found.add(_target(base, modules, extensions))
    return {m for m in found if m is not None and m != module}


def import_graph(package_dir: Path, type_checking: bool = True) -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    modules, extensions = find_modules(package_dir)
    return {m: module_imports(m, p, modules, extensions, type_checking) for m, p in modules.items()}


# -- cycles and depth -------------------------------------------------------------------


def components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of ``graph`` (Tarjan), each sorted;
    every node is in exactly one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(start: str) -> None:
        # iterative DFS: (node, iterator over its successors)
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        comp.append(member)
                        if member == node:
                            break
                    out.append(sorted(comp))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def find_cycle(graph: dict[str, set[str]], members: list[str]) -> list[str]:
    """One cycle through the component ``members``, as a module path."""
    inside = set(members)
    start = members[0]
    previous: dict[str, str] = {}
    queue = [start]
    while queue:  # breadth first: the shortest way back to start
        node = queue.pop(0)
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return path[::-1]
            if nxt in inside and nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return members


def longest_chain(graph: dict[str, set[str]]) -> tuple[int, list[list[str]]]:
    """Modules on the longest import chain, and the chain (one component per step)."""
    comps = components(graph)
    where = {m: i for i, comp in enumerate(comps) for m in comp}
    # Tarjan emits a component after every component it reaches, so the
    # list is already in dependency order
    best: list[tuple[int, int | None]] = []
    for i, comp in enumerate(comps):
        below = {where[t] for m in comp for t in graph.get(m, ()) if where[t] != i}
        step = max(((best[j][0], j) for j in below), default=(0, None))
        best.append((len(comp) + step[0], step[1]))
    if not best:
        return 0, []
    top = max(range(len(comps)), key=lambda i: (best[i][0], comps[i]))
    chain: list[list[str]] = []
    at: int | None = top
    while at is not None:
        chain.append(comps[at])
        at = best[at][1]
    return best[top][0], chain


def _chain_text(chain: list[list[str]]) -> str:
    return " -> ".join(c[0] if len(c) == 1 else "{" + ", ".join(c) + "}" for c in chain)


# -- long functions ---------------------------------------------------------------------


def long_functions(module: str, path: Path, max_lines: int, root: Path) -> list[LongFunction]:
    """Functions and methods (nested ones too) of ``module`` over ``max_lines`` lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[LongFunction] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{child.name}"
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                if lines > max_lines:
                    rel = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
                    found.append(LongFunction(name, lines, rel, child.lineno))
                walk(child, name)
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}.{child.name}")
            else:
                walk(child, prefix)

    walk(tree, module)
    return found


# -- Cython sources --------------------------------------------------------------------

#: Words after ``cdef`` that start a declaration which is not a function.
_CDEF_NOT_FUNCTION = frozenset(
    {"class", "struct", "union", "enum", "extern", "packed", "fused", "cppclass", "ctypedef"}
)


@dataclass(frozen=True)
class _Line:
    """One logical line of a Cython source: its rows, indentation and tokens."""

    first: int
    last: int
    indent: int
    tokens: list[tokenize.TokenInfo]


def _logical_lines(text: str) -> list[_Line]:
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines: list[_Line] = []
    current: list[tokenize.TokenInfo] = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NEWLINE:
            if current:
                lines.append(_Line(current[0].start[0], tok.start[0], current[0].start[1], current))
            current = []
        elif tok.type not in skip:
            current.append(tok)
    return lines


def _block_header(line: _Line) -> tuple[str, str] | None:
    """``("function" | "class", name)`` when ``line`` opens a function or a
    class body (``def``/``cdef``/``cpdef``, ``class``/``cdef class``)."""
    words = [t.string for t in line.tokens]
    if words[-1] != ":" or words[0] not in ("def", "cdef", "cpdef", "class"):
        return None
    if words[0] == "class" or words[:2] == ["cdef", "class"]:
        at = words.index("class") + 1
        return ("class", words[at]) if at < len(words) else None
    if words[0] == "cdef" and (len(words) < 2 or words[1] in _CDEF_NOT_FUNCTION or words[1] == ":"):
        return None
    # the name is the word before the first "(" (a declaration ``cdef int x =
    # f(y)`` has "=" before it, and ends in no ":")
    for i, word in enumerate(words):
        if word == "=":
            return None
        if word == "(":
            tok = line.tokens[i - 1]
            return ("function", tok.string) if tok.type == tokenize.NAME and i > 1 else None
    return None


def cython_functions(name: str, path: Path) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, lines)`` of every function and method
    in a Cython source, nested ones too."""
    lines = _logical_lines(path.read_text(encoding="utf-8"))
    found: list[tuple[str, int, int]] = []
    open_blocks: list[tuple[int, str]] = [(-1, name)]  # (indent, qualified name)
    for at, line in enumerate(lines):
        while line.indent <= open_blocks[-1][0]:
            open_blocks.pop()
        header = _block_header(line)
        if header is None:
            continue
        qualified = f"{open_blocks[-1][1]}.{header[1]}"
        open_blocks.append((line.indent, qualified))
        if header[0] == "function":
            end = line.last
            for body in lines[at + 1 :]:
                if body.indent <= line.indent:
                    break
                end = body.last
            found.append((qualified, line.first, end - line.first + 1))
    return found


def cython_sources(package_dir: Path) -> dict[Path, str]:
    """The ``.pyx`` and ``.pxd`` files under ``package_dir``, with the dotted
    name of the extension each belongs to."""
    root = package_dir.name
    found: dict[Path, str] = {}
    for path in sorted(package_dir.rglob("*")):
        if path.suffix in (".pyx", ".pxd") and path.is_file():
            parts = path.relative_to(package_dir).with_suffix("").parts
            found[path] = ".".join((root, *parts))
    return found


def long_cython_functions(name: str, path: Path, max_lines: int, root: Path) -> list[LongFunction]:
    """Functions and methods of a Cython source over ``max_lines`` lines."""
    rel = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    return [
        LongFunction(qualified, lines, rel, lineno)
        for qualified, lineno, lines in cython_functions(name, path)
        if lines > max_lines
    ]


# -- the report -------------------------------------------------------------------------


def analyze(
    package_dir: Path,
    max_lines: int = MAX_LINES,
    allowed: dict[str, str] | None = None,
    type_checking: bool = True,
) -> Report:
    """Everything this tool checks, for the package at ``package_dir``."""
    package_dir = Path(package_dir)
    modules, _ = find_modules(package_dir)
    graph = import_graph(package_dir, type_checking)
    cycles = [find_cycle(graph, comp) for comp in components(graph) if len(comp) > 1]
    depth, chain = longest_chain(import_graph(package_dir, False))
    root = package_dir.parent
    long = [f for m, p in modules.items() for f in long_functions(m, p, max_lines, root)]
    long += [
        f
        for p, name in cython_sources(package_dir).items()
        for f in long_cython_functions(name, p, max_lines, root)
    ]
    return Report(
        package=package_dir.name,
        modules=sorted(modules),
        edges=graph,
        cycles=cycles,
        depth=depth,
        chain=chain,
        long_functions=sorted(long, key=lambda f: (-f.lines, f.name)),
        allowed=ALLOWED_LONG_FUNCTIONS if allowed is None else allowed,
    )


def format_report(report: Report, max_depth: int, max_lines: int) -> str:
    edges = sum(map(len, report.edges.values()))
    lines = [f"{report.package}: {len(report.modules)} modules, {edges} import edges"]
    lines.append(f"import cycles: {len(report.cycles)}")
    lines += [f"  {' -> '.join(c + c[:1])}" for c in report.cycles]
    lines.append(f"import depth: {report.depth} modules (limit {max_depth})")
    lines.append(f"  {_chain_text(report.chain)}")
    lines.append(
        f"functions over {max_lines} lines: {len(report.long_functions)} "
        f"({len(report.unallowed)} not allowed)"
    )
    for f in report.long_functions:
        why = report.allowed.get(f.name)
        lines.append(
            f"  {f.lines:4d}  {f.name}  ({f.path}:{f.lineno})"
            + (f"  allowed: {why}" if why else "")
        )
    for name in report.stale_allowances:
        lines.append(f"note: ALLOWED_LONG_FUNCTIONS lists {name}, which is not over the limit")
    problems = report.problems(max_depth)
    lines.append("OK" if not problems else f"FAILED: {len(problems)} problem(s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "package",
        nargs="?",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "zarr_fused",
    )
    parser.add_argument("--max-depth", type=int, default=MAX_DEPTH)
    parser.add_argument("--max-lines", type=int, default=MAX_LINES)
    parser.add_argument(
        "--runtime-only", action="store_true", help="leave out imports under `if TYPE_CHECKING:`"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = analyze(args.package, args.max_lines, type_checking=not args.runtime_only)
    if args.json:
        doc = {
            "package": report.package,
            "modules": report.modules,
            "edges": {m: sorted(t) for m, t in sorted(report.edges.items())},
            "cycles": report.cycles,
            "depth": report.depth,
            "chain": report.chain,
            "long_functions": [vars(f) for f in report.long_functions],
            "problems": report.problems(args.max_depth),
        }
        print(json.dumps(doc, indent=2))
    else:
        print(format_report(report, args.max_depth, args.max_lines))
    return 1 if report.problems(args.max_depth) else 0


if __name__ == "__main__":
    sys.exit(main())
