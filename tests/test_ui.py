"""What a person sees in the Prefect UI after a tuning run, checked in a real browser.

A real `prefect server start` on 127.0.0.1 (tests/prefect_server.py), the nightly
deployment's run of micronet through a real worker (tests/nightly_deployment.py), and
Debian's headless chromium driven by Playwright through both UIs that Prefect
3.8 serves: V1 (Vue) at `/` and V2 (React) at `/v2` (the default for a new browser).

Checked on the run's page: the Task Runs tab lists one task run per tuning task, named
`tune-<task>`; the Artifacts tab lists the `tuning-tasks` table and the `evaluation`
report; the table artifact's page shows its header and the task names; the report's page
shows the tuning-curve PNG (a Markdown data-URI image) decoded by the browser. Full-page
screenshots of every step go to test-outputs/ui/.

Without chromium the test is skipped (`apt-get install chromium`), or fails when
VTA_PIPELINE_REQUIRE_BROWSER=1 (CI).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import struct
import zlib
from pathlib import Path
from uuid import UUID

import pytest
from conftest import OUTPUTS
from prefect_server import PrefectServer

pytestmark = pytest.mark.slow

SHOTS = OUTPUTS / "ui"
CHROMIUM = os.environ.get("VTA_PIPELINE_CHROMIUM", "/usr/bin/chromium")
# Root in a container, no network: no sandbox, no GPU, nothing phoning home. (Playwright
# gives every launch a fresh temporary profile; it refuses --user-data-dir in launch().)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
UI_TIMEOUT_MS = 60_000
UIS = {"v1": "", "v2": "/v2"}  # path prefix of each UI


# ---- fixtures ------------------------------------------------------------------------------------
def _chromium() -> str:
    path = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    reason = None
    if path is None:
        reason = f"no chromium at {CHROMIUM} or on PATH: apt-get install chromium (Debian's package)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError as e:
            reason = f"playwright is not installed ({e}): uv sync (dev group)"
    if reason:
        if os.environ.get("VTA_PIPELINE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"VTA_PIPELINE_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium through Playwright (no browser download)."""
    path = _chromium()
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=UI_TIMEOUT_MS)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, timeout=120_000)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def tuning_run(browser, deployed_nightly):
    """micronet tuned by the nightly deployment through a real worker against the real server
    (tests/nightly_deployment.py): the tune_network subflow's result dict, as saved in the
    store, and its Prefect flow run. (It asks for `browser` first so that a machine without
    chromium skips before the expensive part.)"""
    return deployed_nightly.result, deployed_nightly.subflow


# ---- helpers -------------------------------------------------------------------------------------
class _Page:
    """A fresh browser context + page; requests leaving 127.0.0.1 are aborted (the V2 UI
    initializes an analytics SDK that fetches its config from amplitude.com whatever the
    server's analytics setting), and a screenshot is taken when a step fails."""

    def __init__(self, browser, name: str):
        self.browser, self.name = browser, name

    def __enter__(self):
        self.context = self.browser.new_context(viewport={"width": 1400, "height": 1000})
        self.context.set_default_timeout(UI_TIMEOUT_MS)
        self.context.route(re.compile(r"^(?!https?://127\.0\.0\.1[:/]).*"), lambda route: route.abort())
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        return self.page

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is not None:
                with contextlib.suppress(Exception):  # the page may be gone
                    shot(self.page, f"{self.name}-FAILED")
                if self.errors:
                    print(f"page errors in {self.name}:", *self.errors[-5:], sep="\n  ")
        finally:
            self.context.close()


def shot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def open_tab(page, ui: str, label: str) -> None:
    """Click one of the flow-run page's tabs (V1: <li> items, V2: role=tab buttons)."""
    if ui == "v2":
        page.get_by_role("tab", name=label, exact=True).click()
    else:
        page.locator("li", has_text=re.compile(rf"^\s*{re.escape(label)}\s*$")).first.click()


def open_artifact(page, ui: str, key: str, artifact_id: str) -> None:
    """From the run's Artifacts tab to the artifact's own page, by clicking as a person
    would. V1's card links straight to /artifacts/artifact/<id>; V2's card links to the key's
    page (/v2/artifacts/key/<key>, every version of the key), where this run's version is a
    link to /v2/artifacts/artifact/<id>."""
    from playwright.sync_api import expect

    prefix = UIS[ui]
    if ui == "v2":
        page.locator(f'a[href="{prefix}/artifacts/key/{key}"]').click()
        expect(page).to_have_url(re.compile(rf"{re.escape(prefix)}/artifacts/key/{re.escape(key)}\b"))
    page.locator(f'a[href^="{prefix}/artifacts/artifact/{artifact_id}"]').first.click()
    expect(page).to_have_url(re.compile(rf"{re.escape(prefix)}/artifacts/artifact/{artifact_id}\b"))


def expect_png_rendered(page, min_width: int = 1):
    """The page shows data-URI PNG <img>s, every one decoded by the browser (natural size
    > 0); returns the first and its natural size."""
    from playwright.sync_api import expect

    imgs = page.locator('img[src^="data:image/png;base64,"]')
    expect(imgs.first).to_be_visible()
    page.wait_for_function(
        "sel => [...document.querySelectorAll(sel)].every(el => el.complete)", arg='img[src^="data:image/png;base64,"]'
    )
    sizes = imgs.evaluate_all("els => els.map(el => [el.naturalWidth, el.naturalHeight])")
    assert all(w >= min_width and h > 0 for w, h in sizes), f"data-URI image(s) not decoded: natural sizes {sizes}"
    return imgs.first, sizes[0]


def _artifact_ids(server: PrefectServer, flow_run_id: str) -> dict[str, str]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with server.client() as client:
        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run_id)]))
        )
    return {a.key: str(a.id) for a in arts if a.key}


def _png(width: int, height: int, rgb=(200, 30, 30)) -> bytes:
    """A solid-colour PNG, written by hand (no imaging library)."""
    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


# ---- tests ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("ui", list(UIS))
def test_run_page_shows_tuning_tasks_table_and_curves(browser, prefect_server, tuning_run, ui):
    from playwright.sync_api import expect

    result, flow_run = tuning_run
    run_id = result["run_id"]
    names = [f"tune-{t['task']}" for t in result["tasks"]]
    assert names, "the run tuned no task"
    arts = _artifact_ids(prefect_server, run_id)
    assert {"tuning-tasks", "evaluation"} <= set(arts), arts
    base = prefect_server.ui_url + UIS[ui]

    with _Page(browser, f"{ui}-run") as page:
        page.goto(f"{base}/runs/flow-run/{run_id}")
        expect(page.get_by_text(flow_run.name, exact=True).first).to_be_visible()

        # 1. Task Runs tab: one task run per tuning task, by name (searched, so a long run's
        #    pagination cannot hide them).
        open_tab(page, ui, "Task Runs")
        task_links = page.locator(f'a[href^="{UIS[ui]}/runs/task-run/"]')
        expect(task_links.first).to_be_visible()  # the list has loaded
        shot(page, f"{ui}-1-task-runs")
        page.get_by_placeholder("Search by run name").fill("tune-")
        expect(task_links.filter(has_not_text=re.compile(r"^\s*tune-"))).to_have_count(0)  # filter applied
        for name in names:
            expect(page.get_by_role("link", name=name, exact=True)).to_be_visible()
        expect(task_links).to_have_count(len(names))
        shot(page, f"{ui}-2-task-runs-tune")

        # 2. Artifacts tab: the table and the report, as cards.
        open_tab(page, ui, "Artifacts")
        for key in ("tuning-tasks", "evaluation"):
            expect(page.get_by_text(key, exact=True).first).to_be_visible()
        shot(page, f"{ui}-3-artifacts")

        # 3. The table artifact: header and one row per task.
        open_artifact(page, ui, "tuning-tasks", arts["tuning-tasks"])
        for col in ("task", "GFLOPS"):
            expect(page.get_by_role("columnheader", name=col, exact=True)).to_be_visible()
        for t in result["tasks"]:
            expect(page.get_by_role("table").get_by_text(t["task"], exact=True)).to_be_visible()
        shot(page, f"{ui}-4-tuning-tasks-table")

        # 4. The report: its markdown with the tuning curves as a data-URI PNG, decoded.
        page.goto(f"{base}/runs/flow-run/{run_id}")
        open_tab(page, ui, "Artifacts")
        open_artifact(page, ui, "evaluation", arts["evaluation"])
        expect(page.get_by_text(result["model"]).first).to_be_visible()
        _, size = expect_png_rendered(page, min_width=100)
        shot(page, f"{ui}-5-evaluation")
        print(f"{ui}: tuning-curve image {size[0]}x{size[1]} rendered")


@pytest.mark.parametrize("ui", list(UIS))
def test_markdown_artifact_data_uri_image_renders(browser, prefect_server, ui):
    """The mechanism the report relies on, without a tuning run: a markdown artifact with a
    `![alt](data:image/png;base64,...)` image is shown as a decoded <img> on its page."""
    from playwright.sync_api import expect
    from prefect.client.schemas.actions import ArtifactCreate

    png = base64.b64encode(_png(40, 20)).decode()
    with prefect_server.client() as client:
        art = client.create_artifact(
            ArtifactCreate(
                key=f"data-uri-probe-{ui}",
                type="markdown",
                data=f"# data-URI probe\n\n![probe plot](data:image/png;base64,{png})\n\nbelow the image",
            )
        )
    with _Page(browser, f"{ui}-data-uri-probe") as page:
        page.goto(f"{prefect_server.ui_url}{UIS[ui]}/artifacts/artifact/{art.id}")
        expect(page.get_by_text("below the image").first).to_be_visible()
        img, size = expect_png_rendered(page)
        assert size == [40, 20]
        assert img.get_attribute("alt") == "probe plot"
        shot(page, f"{ui}-data-uri-probe")
