"""The library is layered: no import circle among `vta_pipeline`'s modules, and none of them
(the command line aside) imports Prefect or the Prefect-facing packages (`tasks`, `flows`).

Imports are read from the source (every `import`, at module level, inside functions and
under TYPE_CHECKING alike), so a lazy import cannot hide a circle."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "vta_pipeline"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _from_module(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` in `path` (a module of ours) names."""
    if not node.level:
        return node.module or ""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, absolute names."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mod = _from_module(path, node)
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}  # `from . import tune` names a module
    return out


def _graph() -> dict[str, set[str]]:
    """module -> the library modules it imports (a package's import of its own parent excluded)."""
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    return {
        name: {d for d in _imports(path) if d in modules and d != name and not name.startswith(d + ".")}
        for name, path in modules.items()
    }


def test_no_module_of_the_library_imports_itself_back_through_another():
    try:
        order = list(graphlib.TopologicalSorter(_graph()).static_order())
    except graphlib.CycleError as e:
        pytest.fail("an import circle in vta_pipeline: " + " -> ".join(e.args[1]))
    assert "vta_pipeline.tune" in order  # the graph was read at all


# The command line is an edge like tasks/ and flows/: `run` starts the Prefect flow.
LIBRARY = sorted(p for p in PKG.rglob("*.py") if "cli" not in p.relative_to(PKG).parts)


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_library_stays_usable_without_prefect(path):
    banned = {
        d
        for d in _imports(path)
        if d.split(".")[0] in ("prefect", "prefect_dask", "tasks", "flows")
        or d.startswith(("vta_pipeline.tasks", "vta_pipeline.flows"))
    }
    assert not banned, f"{path.relative_to(ROOT)} imports {sorted(banned)}: keep Prefect at the edges (tasks/, flows/)"


def test_the_prefect_edges_are_imported_inside_the_package_namespace_only():
    """The wheel installs tasks/ and flows/ as vta_pipeline.tasks and vta_pipeline.flows (no
    generic top-level names in a user's environment): every import of them uses those names,
    which a checkout resolves too, and the wheel holds them there and nowhere else."""
    sources = [p for d in ("vta_pipeline", "tasks", "flows", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    bare = [
        f"{p.relative_to(ROOT)}: {d}"
        for p in sources
        if "results" not in p.relative_to(ROOT).parts
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)
        for d in ([node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
        if (d or "").split(".")[0] in ("tasks", "flows")
    ]
    assert not bare, "imports of the top-level names (use vta_pipeline.tasks / vta_pipeline.flows):\n" + "\n".join(bare)
    import vta_pipeline.flows.tune_network
    import vta_pipeline.tasks.common

    assert Path(vta_pipeline.tasks.common.__file__).parent == ROOT / "tasks"
    assert Path(vta_pipeline.flows.tune_network.__file__).parent == ROOT / "flows"


def test_every_tuning_database_is_opened_with_our_intrinsics_registered():
    """A record naming one of our tensor intrinsics does not parse in a process that has not
    registered them yet (a resumed run whose pack came from the cache): the library opens every
    MetaSchedule database through `search.database.open_database`, never `JSONDatabase` itself."""
    others = [
        str(p.relative_to(ROOT))
        for p in sorted(PKG.rglob("*.py"))
        if "JSONDatabase(" in p.read_text() and p.relative_to(PKG).as_posix() != "search/database.py"
    ]
    assert not others, f"{others} open a MetaSchedule database without search.database.open_database"


def _import_targets(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every `from X import names` in `path`, lazy ones (inside functions) too."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level and PKG not in path.parents:
            continue  # tasks/, flows/: relative among themselves
        mod = _from_module(path, node)
        if mod.split(".")[0] in ("vta_pipeline", "tasks", "flows", "benchmarks"):
            out.append((mod, [a.name for a in node.names]))
        elif path.parent.name == "tests" and mod.startswith("test_") and not (ROOT / "tests" / f"{mod}.py").exists():
            out.append((f"tests.{mod}", []))  # a test module another test imports by name, renamed or gone
    return out


def test_every_import_of_our_own_modules_resolves_lazy_ones_included():
    """A module moved or renamed must take every import of it along, including the imports
    inside functions, which no import of the module itself runs (a board's state file was
    written through one such import after boards.py became a package)."""
    import importlib
    import importlib.util

    sources = [
        p for d in ("vta_pipeline", "tasks", "flows", "tests", "benchmarks", "docs") for p in (ROOT / d).rglob("*.py")
    ]
    broken = []
    for path in sources:
        if "results" in path.relative_to(ROOT).parts:
            continue
        for mod, names in _import_targets(path):
            if mod.startswith("tests."):
                broken.append(f"{path.relative_to(ROOT)}: {mod[len('tests.') :]} (no such test module)")
                continue
            if importlib.util.find_spec(mod) is None:
                broken.append(f"{path.relative_to(ROOT)}: {mod}")
                continue
            module = importlib.import_module(mod)
            for n in names:
                if n != "*" and not hasattr(module, n) and importlib.util.find_spec(f"{mod}.{n}") is None:
                    broken.append(f"{path.relative_to(ROOT)}: {mod}.{n}")
    assert not broken, "imports that no longer resolve:\n" + "\n".join(broken)


def test_the_wheel_installs_one_top_level_package_whose_flows_import_from_it(tmp_path):
    """Built as CI's users would install it: only `vta_pipeline` at the top, the Prefect edges
    inside it, and a flow imported from the unpacked wheel (not the checkout) loads its tasks."""
    import os
    import shutil
    import subprocess
    import sys
    import zipfile

    uv = shutil.which("uv")
    assert uv, "uv is what .ci/run installs the project with; it builds the wheel here too"
    subprocess.run([uv, "build", "--wheel", "-o", str(tmp_path), "-q"], cwd=ROOT, check=True, timeout=600)
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
        z.extractall(tmp_path / "site")
    assert tops == {"vta_pipeline", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    probe = (
        "import vta_pipeline.flows.tune_network as f, vta_pipeline.tasks.tune as t, vta_pipeline as p; "
        "print(f.__file__); print(t.__file__); print(len(p.__path__))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    flow_file, task_file, paths = done.stdout.split()
    assert flow_file.startswith(str(tmp_path / "site")) and task_file.startswith(str(tmp_path / "site"))
    assert paths == "1"  # installed: nothing added to the package's path
