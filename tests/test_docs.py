"""The documentation holds together: its links lead somewhere, the configuration reference is
the code's own, and the README stays an entrance that opens with the two commands CI trusts.

Text only: nothing here starts a board or compiles."""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BENCHMARKS_README = ROOT / "benchmarks" / "README.md"
BENCHMARKS_HISTORY = ROOT / "benchmarks" / "HISTORY.md"
PAGES = [README, *sorted(DOCS.glob("*.md")), BENCHMARKS_README, BENCHMARKS_HISTORY]
DOCS_PAGES = (
    "index.md",
    "getting-started.md",
    "boards-and-targets.md",
    "int8-and-vta.md",
    "nightly-operations.md",
    "performance.md",
    "when-things-fail.md",
    "configuration.md",
    "command-line.md",
    "architecture.md",
    "development.md",
)
README_MAX_BYTES = 12_000
REGENERATE = "uv run python docs/gen_config_reference.py"

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target), text may hold one level of brackets; an optional "title"
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'][^\"']*[\"'])?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+[\"'(].*)?\s*$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _split_fences(text: str) -> tuple[list[str], list[str]]:
    """(the lines outside fenced code blocks, the fenced blocks' contents in order)."""
    prose: list[str] = []
    blocks: list[str] = []
    fence: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence, body = m.group(1), []
            else:
                prose.append(line)
        elif (
            m
            and m.group(1)[0] == fence[0]
            and len(m.group(1)) >= len(fence)
            and not line.strip()[len(m.group(1)) :].strip()
        ):
            blocks.append("\n".join(body))
            fence = None
        else:
            body.append(line)
    return prose, blocks


def _links(page: Path) -> list[str]:
    """Every link target written in the page's prose (code blocks and code spans are not links)."""
    prose, _ = _split_fences(page.read_text())
    targets = []
    for line in prose:
        line = CODE_SPAN.sub("code", line)
        targets += INLINE_LINK.findall(line)
        m = REFERENCE_DEF.match(line)
        if m:
            targets.append(m.group(1))
    return [t for t in targets if t]


def _relative(target: str) -> bool:
    return not SCHEME.match(target) and not target.startswith("//")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: links reduced to their text, lower case, punctuation
    other than '-' and '_' dropped, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings (a repeated heading gets -1, -2, ...)."""
    prose, _ = _split_fences(page.read_text())
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for line in prose:
        anchors.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        slug = _slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _destination(page: Path, target: str) -> tuple[Path, str]:
    """The file a relative link points at, and its #anchor ('' when none)."""
    path, _, anchor = target.partition("#")
    path = path.split("?", 1)[0]
    dest = page if not path else (page.parent / unquote(path)).resolve()
    return dest, unquote(anchor)


def _relative_links(page: Path) -> list[str]:
    return [t for t in _links(page) if _relative(t)]


def test_there_is_one_docs_page_per_user_concern_and_a_benchmarks_readme():
    missing = [name for name in DOCS_PAGES if not (DOCS / name).is_file()]
    assert not missing, f"docs/ lacks {missing}"
    assert BENCHMARKS_README.is_file(), "benchmarks/README.md (how to run, latest results, history) is missing"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_leads_to_a_file_that_exists(page):
    broken = [t for t in _relative_links(page) if not _destination(page, t)[0].exists()]
    assert not broken, f"{_rel(page)} links to files that do not exist: {broken}"


# `path/to/module.py` in a page: the file exists, from the repository's root or from
# vta_pipeline/ (pages name the library's modules from there: `passes/graph_pack.py`)
SOURCE_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.py)(?::[\w.]+)?`")


@pytest.mark.parametrize("page", [*PAGES, ROOT / "vta_pipeline" / "library" / "README.md"], ids=_rel)
def test_every_source_path_a_page_names_exists(page):
    named = set(SOURCE_PATH.findall(page.read_text()))
    stale = sorted(p for p in named if not (ROOT / p).exists() and not (ROOT / "vta_pipeline" / p).exists())
    assert not stale, f"{_rel(page)} names files that are not in the tree (moved or renamed?): {stale}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_anchor_link_into_a_markdown_page_names_one_of_its_headings(page):
    broken = []
    for target in _relative_links(page):
        dest, anchor = _destination(page, target)
        if anchor and dest.suffix == ".md" and dest.is_file() and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading with anchor #{anchor} in {_rel(dest)})")
    assert not broken, f"{_rel(page)} has anchor links to headings that do not exist: {broken}"


def test_the_docs_index_links_every_page_in_docs():
    linked = {_destination(DOCS / "index.md", t)[0] for t in _relative_links(DOCS / "index.md")}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "index.md" and p.resolve() not in linked]
    assert not missing, f"docs/index.md does not list {missing}"


def test_the_architecture_pages_package_tree_is_the_code_as_it_is():
    spec = importlib.util.spec_from_file_location("gen_package_tree", DOCS / "gen_package_tree.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.BEGIN in (DOCS / "architecture.md").read_text(), "docs/architecture.md lost its package tree markers"
    assert (DOCS / "architecture.md").read_text() == gen.render(), (
        "docs/architecture.md's package tree is stale: run `uv run python docs/gen_package_tree.py`"
    )


def test_the_configuration_reference_is_generated_from_the_config_models():
    spec = importlib.util.spec_from_file_location("gen_config_reference", DOCS / "gen_config_reference.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    expected = gen.render()
    actual = (DOCS / "configuration.md").read_text()
    up_to_date = actual == expected
    diff = "".join(
        list(
            difflib.unified_diff(
                actual.splitlines(True), expected.splitlines(True), "docs/configuration.md", "render()", n=1
            )
        )[:40]
    )
    assert up_to_date, (
        f"docs/configuration.md is not what vta_pipeline/config.py generates: "
        f"run `{REGENERATE}` and commit the result.\n{diff}"
    )


def test_the_readme_is_at_most_12000_bytes():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes (at most {README_MAX_BYTES}): keep it the "
        f"entrance and move detail into docs/ or benchmarks/README.md"
    )


def _readme_setup_commands() -> tuple[str, str]:
    _, blocks = _split_fences(README.read_text())
    assert len(blocks) >= 2, "README.md must open with two fenced code blocks: the main job, then the tests"
    run_cmd, test_cmd = (b.strip() for b in blocks[:2])
    for cmd in (run_cmd, test_cmd):
        assert "\n" not in cmd, f"a README set-up command is one line to copy, got:\n{cmd}"
    return run_cmd, test_cmd


def test_the_readme_opens_with_the_main_job_on_its_defaults_then_the_tests():
    run_cmd, test_cmd = _readme_setup_commands()
    assert run_cmd.endswith("&& uv run vta-pipeline run"), f"first block must run the main job, no options: {run_cmd}"
    assert " uv run pytest" in test_cmd, f"second block must run the tests: {test_cmd}"
    install = run_cmd.removesuffix("uv run vta-pipeline run")
    assert test_cmd.startswith(install), "both commands install the environment the same way"
    assert "uv sync --frozen" in install, "the set-up installs the locked environment"


def test_the_readme_test_command_is_the_one_ci_runs():
    _, test_cmd = _readme_setup_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    ci_pytest = [m.group(0).strip() for line in commands if (m := re.search(r"\buv run pytest\b.*$", line))]
    assert ci_pytest, ".ci/run runs no `uv run pytest`"
    assert test_cmd.endswith("&& " + ci_pytest[-1]), (
        f"README's test command {test_cmd!r} does not end with CI's {ci_pytest[-1]!r}"
    )
    uv_pin = re.search(r"\buv==\S+", ci)
    assert uv_pin and uv_pin.group(0) in test_cmd.split(), (
        f"README installs the uv that CI pins ({uv_pin and uv_pin.group(0)})"
    )
    assert "uv sync --frozen" in " ".join(commands) and "uv sync --frozen" in test_cmd


def test_benchmark_results_hold_results_not_scripts():
    """Scripts live in benchmarks/ (run with their --help); a results directory holds what a
    run wrote, and HISTORY.md the command that ran."""
    scripts = sorted(
        str(p.relative_to(ROOT)) for ext in ("*.py", "*.sh") for p in (ROOT / "benchmarks" / "results").rglob(ext)
    )
    assert not scripts, f"scripts inside benchmarks/results: {scripts}"
