"""The package's shape: `tools/check_structure.py` on zarr_fused, and on tiny
synthetic packages under ``tmp_path`` that show it can fail."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import zarr_fused

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(zarr_fused.__file__).resolve().parent


def _load_checker() -> ModuleType:
    path = ROOT / "tools" / "check_structure.py"
    spec = importlib.util.spec_from_file_location("check_structure", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


def make_package(root: Path, files: dict[str, str]) -> Path:
    """A package ``pkg`` under ``root`` with these modules (relative paths)."""
    pkg = root / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return pkg


def long_body(lines: int) -> str:
    """A function of exactly ``lines`` lines."""
    return "def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(lines - 1))


# -- zarr_fused itself ----------------------------------------------------------------


@pytest.fixture(scope="module")
def report() -> Any:
    return checker.analyze(PACKAGE)


def test_package_is_checked(report: Any) -> None:
    assert "zarr_fused.pipeline" in report.modules
    assert report.edges["zarr_fused"]


def test_package_has_no_import_cycles(report: Any) -> None:
    assert report.cycles == []


def test_package_import_depth_at_most_six(report: Any) -> None:
    assert report.depth <= 6, checker._chain_text(report.chain)


def test_package_has_no_long_functions_outside_allow_list(report: Any) -> None:
    assert [(f.name, f.lines) for f in report.unallowed] == []


def _crossing(graph: dict[str, set[str]], source: str, target: str) -> list[str]:
    """The imports (``a -> b``) from modules of folder ``source`` into ``target``."""
    return sorted(
        f"{module} -> {imported}"
        for module, imports in graph.items()
        if module.startswith(f"zarr_fused.{source}.")
        for imported in imports
        if imported == f"zarr_fused.{target}" or imported.startswith(f"zarr_fused.{target}.")
    )


@pytest.mark.parametrize(
    ("source", "target"),
    [
        pytest.param("chunks", "shard", id="chunks-to-shard"),
        pytest.param("shard", "chunks", id="shard-to-chunks"),
    ],
)
def test_chunk_and_shard_paths_import_nothing_from_each_other(source: str, target: str) -> None:
    # imports under TYPE_CHECKING and inside functions count: what both
    # paths share lives below them (`_buffers`, `_merge`, `_batch`)
    graph = checker.import_graph(PACKAGE, type_checking=True)
    assert any(m.startswith(f"zarr_fused.{source}.") for m in graph)
    assert _crossing(graph, source, target) == []


# -- the checker can fail -------------------------------------------------------------


def test_checker_finds_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    pkg = make_package(
        tmp_path,
        {
            "a.py": "from pkg.b import g\n",
            "b.py": "def g():\n    from pkg import a\n    return a\n",
        },
    )
    found = checker.analyze(pkg)
    assert found.cycles == [["pkg.a", "pkg.b"]]
    assert checker.main([str(pkg)]) == 1


def test_checker_finds_a_cycle_through_a_type_checking_import(tmp_path: Path) -> None:
    pkg = make_package(
        tmp_path,
        {
            "a.py": "from pkg.b import g\n",
            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import T\n",
        },
    )
    assert checker.analyze(pkg).cycles == [["pkg.a", "pkg.b"]]


def test_checker_runtime_only_ignores_type_checking_imports(tmp_path: Path) -> None:
    pkg = make_package(
        tmp_path,
        {
            "a.py": "from pkg.b import g\n",
            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import T\n",
        },
    )
    assert checker.analyze(pkg, type_checking=False).cycles == []


def test_checker_resolves_relative_imports(tmp_path: Path) -> None:
    pkg = make_package(
        tmp_path,
        {
            "sub/__init__.py": "from .x import y\n",
            "sub/x.py": "from .. import top\n",
            "top.py": "",
        },
    )
    graph = checker.import_graph(pkg)
    assert graph["pkg.sub"] == {"pkg.sub.x"}
    assert graph["pkg.sub.x"] == {"pkg.top"}


def test_checker_from_package_import_name_is_the_init(tmp_path: Path) -> None:
    pkg = make_package(
        tmp_path,
        {
            "__init__.py": "from pkg.a import A\n",
            "a.py": "A = 1\n",
            "b.py": "from pkg import A\nfrom pkg import a\n",
        },
    )
    assert checker.import_graph(pkg)["pkg.b"] == {"pkg", "pkg.a"}


def test_checker_extensions_are_leaves(tmp_path: Path) -> None:
    pkg = make_package(tmp_path, {"a.py": "from pkg import _ext\nimport pkg._ext as e\n"})
    (pkg / "_ext.pyx").write_text("")
    assert checker.import_graph(pkg)["pkg.a"] == set()


def test_checker_measures_depth(tmp_path: Path) -> None:
    pkg = make_package(
        tmp_path,
        {
            "a.py": "import pkg.b\n",
            "b.py": "def f():\n    import pkg.c\n",
            "c.py": "import os\n",
            "d.py": "import pkg.c\n",
        },
    )
    found = checker.analyze(pkg)
    assert (found.depth, found.chain) == (3, [["pkg.a"], ["pkg.b"], ["pkg.c"]])


def test_checker_depth_over_the_limit_fails(tmp_path: Path) -> None:
    pkg = make_package(tmp_path, {"a.py": "import pkg.b\n", "b.py": "import pkg.c\n", "c.py": ""})
    assert checker.main([str(pkg), "--max-depth", "2"]) == 1


@pytest.mark.parametrize(
    ("lines", "flagged"),
    [pytest.param(60, False, id="60-lines"), pytest.param(61, True, id="61-lines")],
)
def test_checker_flags_long_functions(tmp_path: Path, lines: int, flagged: bool) -> None:
    pkg = make_package(tmp_path, {"a.py": long_body(lines)})
    found = checker.analyze(pkg, allowed={})
    assert [(f.name, f.lines) for f in found.unallowed] == ([("pkg.a.f", lines)] if flagged else [])


def test_checker_flags_long_methods_and_nested_functions(tmp_path: Path) -> None:
    nested = "class K:\n    def m(self):\n" + textwrap.indent(long_body(61), "        ")
    pkg = make_package(tmp_path, {"a.py": nested})
    names = [f.name for f in checker.analyze(pkg, allowed={}).unallowed]
    assert names == ["pkg.a.K.m", "pkg.a.K.m.f"]


def test_checker_allow_list_excuses_a_long_function(tmp_path: Path) -> None:
    pkg = make_package(tmp_path, {"a.py": long_body(61)})
    found = checker.analyze(pkg, allowed={"pkg.a.f": "a table the reader scans"})
    assert [f.name for f in found.long_functions] == ["pkg.a.f"]
    assert found.unallowed == []
    assert found.problems(checker.MAX_DEPTH) == []


def test_checker_clean_package_passes(tmp_path: Path) -> None:
    pkg = make_package(tmp_path, {"a.py": "import pkg.b\n", "b.py": "X = 1\n"})
    assert checker.main([str(pkg)]) == 0


# -- Cython sources -------------------------------------------------------------------


def cython_body(keyword: str, lines: int) -> str:
    """A Cython function of exactly ``lines`` lines, its header on three."""
    head = f"{keyword} f(\n    int a,\n) noexcept nogil:\n"
    return head + "".join(f"    x{i} = {i}\n" for i in range(lines - 3))


@pytest.mark.parametrize(
    ("keyword", "lines", "flagged"),
    [
        pytest.param("cdef int", 60, False, id="cdef-60-lines"),
        pytest.param("cdef int", 61, True, id="cdef-61-lines"),
        pytest.param("cdef inline Py_ssize_t", 61, True, id="cdef-inline-61-lines"),
        pytest.param("cpdef object", 61, True, id="cpdef-61-lines"),
    ],
)
def test_checker_flags_long_cython_functions(
    tmp_path: Path, keyword: str, lines: int, flagged: bool
) -> None:
    pkg = make_package(tmp_path, {"_ext.pyx": cython_body(keyword, lines)})
    found = checker.analyze(pkg, allowed={})
    assert [(f.name, f.lines) for f in found.unallowed] == (
        [("pkg._ext.f", lines)] if flagged else []
    )


def test_checker_flags_long_inline_functions_of_a_pxd(tmp_path: Path) -> None:
    pkg = make_package(tmp_path, {"_ext.pxd": cython_body("cdef inline int", 61)})
    assert [f.name for f in checker.analyze(pkg, allowed={}).unallowed] == ["pkg._ext.f"]


def test_checker_names_cython_methods_after_their_class(tmp_path: Path) -> None:
    source = "cdef class K:\n    cdef int m(self):\n" + textwrap.indent(long_body(61), "        ")
    pkg = make_package(tmp_path, {"_ext.pyx": source})
    names = [f.name for f in checker.analyze(pkg, allowed={}).unallowed]
    assert names == ["pkg._ext.K.m", "pkg._ext.K.m.f"]


def test_checker_skips_cython_declarations(tmp_path: Path) -> None:
    # prototypes, variables, structs and extern blocks are no functions,
    # and a string at column 0 inside a body does not end it
    source = (
        "cdef int proto(int a) noexcept nogil\n"
        "cdef struct S:\n    int a\n"
        'cdef extern from *:\n    """\n#define X 1\n"""\n    int X\n'
        "cdef int g():\n"
        "    cdef int y = h(1)\n"
        '    s = """\n' + "\n" * 60 + '"""\n'
        "    return y\n"
    )
    pkg = make_package(tmp_path, {"_ext.pyx": source})
    found = checker.analyze(pkg, allowed={})
    assert [(f.name, f.lines) for f in found.unallowed] == [("pkg._ext.g", 65)]
