"""benchmarks/ is a tool: every benchmark runs as a module from the repository's root and
says how it is used (`python -m benchmarks.<name> --help`), so a moved helper or a renamed
option of the library shows here, not on the night someone reruns a benchmark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py")


def test_there_are_benchmarks_to_check():
    assert {"compare", "unseen", "conv_gap", "vta_knobs"} <= set(BENCHMARKS)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_each_benchmark_runs_as_a_module_and_explains_its_options(name):
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("usage:") and "--" in done.stdout, done.stdout[:500]


def test_benchmarks_share_helpers_through_their_lib_only():
    """A benchmark imports what it shares from benchmarks/lib, never from another benchmark, and
    edits no sys.path: each script can change without breaking the others."""
    import ast

    for name in BENCHMARKS + [f"lib/{p.stem}" for p in (ROOT / "benchmarks" / "lib").glob("*.py")]:
        src = (ROOT / "benchmarks" / f"{name}.py").read_text()
        assert "sys.path" not in src, name
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks"):
                assert node.module.startswith("benchmarks.lib") or (
                    node.module == "benchmarks" and all(a.name == "lib" for a in node.names)
                ), f"benchmarks/{name}.py imports {node.module}"
