"""The store stays bounded: `vta-pipeline store gc`, the free-space check a run starts with,
and a disk that fills mid-run (a real tmpfs where the machine lets us mount one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vta_pipeline import guard
from vta_pipeline.cli.main import app
from vta_pipeline.report import RunResult
from vta_pipeline.search.trial_log import read_trials
from vta_pipeline.store import gc as store_gc
from vta_pipeline.store import history, variant
from vta_pipeline.store.artifacts import ArtifactStore

DAY = 86400.0


def _age(path: Path, days: float) -> None:
    t = time.time() - days * DAY
    for p in [path, *(path.rglob("*") if path.is_dir() else ())]:
        os.utime(p, (t, t), follow_symlinks=False)


def _build(store: ArtifactStore, key: str, size: int = 4096):
    return store.produce("build", key, lambda out: (out / "model.so").write_bytes(key.encode() * (size // len(key))))


def _result(run_id: str, night: str, build_id: str, tuned_ms: float, correct: bool = True) -> RunResult:
    ev = {"mean_ms": tuned_ms, "median_ms": tuned_ms, "std_ms": 0.01, "correct": correct, "max_abs_err": 0.0}
    return RunResult.model_validate(
        {
            "run_id": run_id,
            "night": night,
            "model": "micronet",
            "target": "host",
            "target_id": "t",
            "board_key": "test",
            "seconds": 10.0,
            "finished": 1.7e9,
            "tasks": [],
            "config": {},
            "untuned": dict(ev, mean_ms=9.0, evaluation_id=f"{run_id}-u", build_id=f"{build_id}-untuned"),
            "tuned": dict(ev, evaluation_id=f"{run_id}-t", build_id=build_id),
        }
    )


@pytest.fixture
def old_store(tmp_path):
    """A store after a month of nights: three builds (the current one, the best night's, one
    neither), tuning records, a fetched model, crash leftovers, quarantine and logs, all old."""
    store = ArtifactStore(tmp_path / "store")
    best, current, other = (_build(store, k) for k in ("best", "current", "other"))
    history.record_run(store.root, _result("r1", "2026-11-01", best.id, 1.0), [])
    history.record_run(store.root, _result("r2", "2026-11-02", other.id, 1.5), [])
    history.record_run(store.root, _result("r3", "2026-11-03", current.id, 1.2), [])
    keep = guard.Verdict(
        regressed=False,
        tonight_ms=1.2,
        best_ms=1.0,
        best_night="2026-11-01",
        best_build_id=best.id,
        worse_pct=20.0,
        max_regression_pct=50.0,
    )
    guard.promote(store, _result("r3", "2026-11-03", current.id, 1.2), keep)
    fetched = store.produce("fetch", "f", lambda out: (out / "module.json").write_text("{}"))
    trials = store.work_dir("tune", "host", "w1") / "trials.jsonl"
    trials.write_text('{"trial": 0, "latency_ms": 1.0}\n')
    (store.root / "steps" / "build" / ".tmp" / "k-crashed").mkdir(parents=True)
    (store.root / "steps" / "build" / ".tmp" / "k-crashed" / "model.so").write_bytes(b"x" * 1000)
    (store.root / "quarantine" / "build-x-1").mkdir(parents=True)
    (store.root / "logs").mkdir(exist_ok=True)
    (store.root / "logs" / "board-k-1-server0.log").write_text("old board log\n" * 100)
    (store.root / "history" / ".staging-evaluations-dead").mkdir()
    for p in store.root.iterdir():
        _age(p, 30)
    (store.root / "logs" / "run-today.log").write_text("tonight's log\n")  # young: kept
    return store, {"best": best, "current": current, "other": other, "fetched": fetched, "trials": trials}


def test_gc_drops_old_leftovers_and_builds_but_never_records_history_or_the_builds_the_guard_needs(old_store):
    store, a = old_store
    report = store_gc.collect(store.root, keep_days=14)
    gone = {r.path for r in report.removed}
    assert a["other"].path in gone and not a["other"].path.exists()
    assert store.root / "steps" / "build" / ".tmp" / "k-crashed" in gone
    assert store.root / "quarantine" / "build-x-1" in gone
    assert store.root / "logs" / "board-k-1-server0.log" in gone
    assert store.root / "history" / ".staging-evaluations-dead" in gone
    assert report.freed_bytes >= 4096 + 1000
    # what a night cannot get back, or what the guard falls back to, stays
    assert store.find_id("build", a["best"].id) and store.find_id("build", a["current"].id)
    assert "best micronet" in report.kept_builds[a["best"].id] and "current" in report.kept_builds[a["current"].id]
    assert store.lookup("fetch", "f") and a["trials"].read_text().startswith('{"trial": 0')
    assert (store.root / "logs" / "run-today.log").exists()
    assert [r["run_id"] for r in history.evaluations(store.root) if r["build"] == "tuned"] == ["r1", "r2", "r3"]
    cur = guard.read_current(store.root, "micronet", "host", "test", variant.of({}))
    assert cur["build_id"] == a["current"].id and cur["lib_ok"]


def test_gc_keeps_everything_younger_than_keep_days_and_a_dry_run_removes_nothing(old_store):
    store, a = old_store
    before = sorted(p for p in store.root.rglob("*"))
    planned = store_gc.collect(store.root, keep_days=14, dry_run=True)
    assert planned.removed and planned.compacted_parts == 0  # one part per night: nothing to merge
    assert sorted(p for p in store.root.rglob("*")) == before
    assert store_gc.collect(store.root, keep_days=60).removed == []
    assert a["other"].path.exists()


def test_a_nights_history_parts_are_merged_into_one_and_every_row_is_still_read(tmp_path):
    root = tmp_path / "store"
    (root / "steps").mkdir(parents=True)
    for i in range(4):  # four runs of one night: four parts
        history.record_run(root, _result(f"r{i}", "2026-11-05", f"b{i}", 1.0 + i), [])
    night = history.history_dir(root) / history.EVALUATIONS / "night=2026-11-05"
    assert len(list(night.glob("*.parquet"))) == 4
    rows = sorted((r["evaluation_id"], r["mean_ms"]) for r in history.evaluations(root))
    assert store_gc.collect(root, keep_days=0).compacted_parts == 3
    assert len(list(night.glob("*.parquet"))) == 1
    assert sorted((r["evaluation_id"], r["mean_ms"]) for r in history.evaluations(root)) == rows
    assert history.record_run(root, _result("r0", "2026-11-05", "b0", 1.0), []) == {"measurements": 0, "evaluations": 0}


def test_gc_of_a_directory_that_is_no_store_says_so_and_the_cli_prints_what_went(old_store, tmp_path):
    store, _ = old_store
    out = CliRunner().invoke(app, ["store", "gc", "--store", str(tmp_path / "nothing")])
    assert out.exit_code == 2 and "is not a vta-pipeline store" in out.output
    out = CliRunner().invoke(app, ["store", "gc", "--store", str(store.root), "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "would remove" in out.output and "kept build" in out.output
    out = CliRunner().invoke(app, ["store", "gc", "--store", str(store.root), "--json"])
    assert json.loads(out.output)["freed_bytes"] > 0


def test_the_disk_full_error_is_found_behind_what_prefect_and_tvm_reraise(tmp_path):
    import errno

    err = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "x"))
    try:
        try:
            raise err
        except OSError as e:
            raise RuntimeError("task failed") from e
    except RuntimeError as wrapped:
        assert store_gc.disk_full(wrapped) is err
    tvm_like = RuntimeError("Traceback ...\nInternalError: cannot write: No space left on device")
    assert "No space left" in store_gc.disk_full(tvm_like)
    assert store_gc.disk_full(ValueError("unrelated")) is None
    msg = store_gc.disk_full_message(tmp_path, err)
    assert "store gc --store" in msg and "rerun the same command" in msg


# ---- a real full filesystem ----------------------------------------------------------------------
@pytest.fixture
def small_fs(tmp_path):
    """A 48 MiB tmpfs, where the machine lets this process mount one (root, no seccomp veto)."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({done.stderr.strip()}): "
            "test_the_disk_full_error_is_found_behind_what_prefect_and_tvm_reraise covers the message"
        )
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_run_refuses_to_start_on_a_nearly_full_disk_naming_store_gc(small_fs):
    out = CliRunner().invoke(
        app, ["run", "--model", "micronet", "--store", str(small_fs / "store"), "--tracker", "127.0.0.1:9"]
    )
    assert out.exit_code == 2 and "GiB free" in out.output and "store gc" in out.output, out.output
    assert not (small_fs / "store" / "steps").exists()  # nothing was started


def _cmd(store: Path, key: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vta_pipeline.cli",
        "run",
        "--model",
        "micronet",
        "--source",
        "builtin",
        "--key",
        key,
        "--trials-per-task",
        "4",
        "--trials-per-batch",
        "2",
        "--task-filter",
        "conv2d",
        "--number",
        "2",
        "--timeout",
        "10",
        "--eval-repeat",
        "3",
        "--no-compare",
        "--store",
        str(store),
        "--config",
        str(store.parent / "cfg.json"),
    ]


def _trials(store: Path) -> dict[str, list[dict]]:
    """Each tuning work dir's whole rows (a row the full disk tore is not one)."""
    return {p.parent.name: read_trials(p.parent) for p in (store / "work").rglob("trials.jsonl")}


@pytest.mark.slow
def test_a_disk_that_fills_mid_tuning_ends_the_run_with_one_message_and_the_rerun_finishes_with_nothing_lost(
    small_fs, tmp_path
):
    store = small_fs / "store"
    (small_fs / "cfg.json").write_text(json.dumps({"min_free_gib": 0}))
    env = dict(
        os.environ, PREFECT_HOME=str(tmp_path / "prefect"), VTA_PIPELINE_BOARD_REGISTRY=str(tmp_path / "registry")
    )
    proc = subprocess.Popen(_cmd(store, "full1"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    filler = small_fs / "filler"
    try:
        deadline = time.monotonic() + 600
        while not any(len(v) >= 2 for v in _trials(store).values()):
            assert proc.poll() is None and time.monotonic() < deadline, "no batch was measured"
            time.sleep(0.05)
        with open(filler, "wb") as f:  # the rest of the disk, at once, as another process would
            try:
                while True:
                    f.write(b"\0" * 2**20)
            except OSError:
                pass
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, out[-3000:] + err[-3000:]
    assert err.count("error: the disk is full") == 1 and "store gc --store" in err, err[-3000:]
    assert "RecursionError" not in err and "--- Logging error ---" not in err, err[-3000:]
    assert err.count("the run log") <= 1  # said once, where the log could no longer be written
    measured = {k: [r["schedule_hash"] for r in v] for k, v in _trials(store).items()}
    assert sum(map(len, measured.values())) >= 2
    filler.unlink()
    again = subprocess.run(_cmd(store, "full1"), env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for k, rows in _trials(store).items():
        assert [r["trial"] for r in rows] == list(range(len(rows)))  # no index reused, no row glued on
        assert len({r["schedule_hash"] for r in rows}) == len(rows) == 4  # none lost, none measured twice
        assert [r["schedule_hash"] for r in rows[: len(measured.get(k, []))]] == measured.get(k, [])
