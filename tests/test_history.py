"""The Parquet history, warm starts from earlier sessions, and the regression guard's rules."""

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from vta_pipeline import guard, steps
from vta_pipeline.boards import BoardSpec
from vta_pipeline.config import GuardConfig, MeasureConfig, ModelConfig, PipelineConfig, TuneConfig
from vta_pipeline.extract import load_tasks
from vta_pipeline.report import RunResult
from vta_pipeline.search.trial_log import read_trials
from vta_pipeline.store import history, variant
from vta_pipeline.store.artifacts import ArtifactStore
from vta_pipeline.store.hashing import sha256_file

MEASURE = MeasureConfig(number=2, repeat=1, timeout_s=60)


def _run(run_id, night, store, tune_art, tuned_ms=1.0, untuned_ms=4.0, build_id="b", correct=True, config=None):
    """A finished run's result around one real tune artifact (what the flow assembles), or none."""
    tasks = [json.loads((tune_art.path / "summary.json").read_text())] if tune_art else []
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
            "tasks": tasks,
            "config": config or {},
            "untuned": dict(ev, mean_ms=untuned_ms, evaluation_id=f"{run_id}-u", build_id=f"{build_id}-untuned"),
            "tuned": dict(ev, evaluation_id=f"{run_id}-t", build_id=build_id),
        }
    )


@pytest.fixture(scope="module")
def two_sessions(micronet, board, host_target, session_store):
    """One conv task tuned cold in session n1 (recorded in the history), then warm in n2 with
    the same budget (warm vs cold at larger budgets: benchmarks/warm_start.py)."""
    _, extracted = micronet
    task = [t for t in load_tasks(extracted.path) if t.op == "conv2d"][0]
    spec = BoardSpec(board.host, board.port, board.key, 2)

    def tune(session, warm, trials=4):
        cfg = TuneConfig(trials_per_task=trials, trials_per_batch=4, session=session, warm_start=warm)
        return steps.tune_step(session_store, extracted, task, host_target, spec, cfg, MEASURE)

    n1 = tune("n1", 32)
    run = _run("run-n1", "2026-11-19", session_store, n1)
    run.target_id, run.board_key = host_target.id, board.key
    added = history.record_run(session_store.root, run, [n1.path])
    n2 = tune("n2", 32)
    return task, n1, n2, added


def _summary(art):
    return json.loads((art.path / "summary.json").read_text())


def test_every_measurement_lands_in_a_night_partitioned_parquet_dataset(two_sessions, session_store):
    task, n1, _, added = two_sessions
    assert added == {"measurements": 4, "evaluations": 2}
    base = history.history_dir(session_store.root) / history.MEASUREMENTS
    assert [p.name for p in base.iterdir() if p.is_dir()] == ["night=2026-11-19"]
    t = ds.dataset(base, format="parquet", partitioning="hive").to_table()
    rows = t.to_pylist()
    assert {r["task"] for r in rows} == {task.name} and {r["workload_key"] for r in rows} == {task.workload_hash}
    assert sorted(r["trial"] for r in rows) == list(range(4))
    assert all(r["latency_ms"] > 0 and r["gflops"] > 0 and r["record"] and r["error"] is None for r in rows)
    assert len({r["schedule_hash"] for r in rows}) == 4


def test_recording_the_same_run_twice_adds_nothing(two_sessions, session_store, host_target, board):
    _, n1, _, _ = two_sessions
    run = _run("run-n1-retry", "2026-11-19", session_store, n1)
    run.target_id, run.board_key = host_target.id, board.key
    run.untuned.evaluation_id, run.tuned.evaluation_id = "run-n1-u", "run-n1-t"  # same artifacts
    assert history.record_run(session_store.root, run, [n1.path]) == {"measurements": 0, "evaluations": 0}


def test_a_new_session_is_warm_started_from_the_best_records_of_earlier_ones(two_sessions):
    _, n1, n2, _ = two_sessions
    s1, s2 = _summary(n1), _summary(n2)
    # each session tunes its own full budget in its own records
    assert s1["trials_this_run"] == s2["trials_this_run"] == 4
    assert s1["warm_start"] == 0 and s1["previous_best_ms"] is None
    # n2 starts from n1's four records and is measured against n1's best
    assert s2["warm_start"] == 4
    assert s2["previous_best_ms"] == pytest.approx(s1["best_latency_ms"])
    # the seeds are in the session's database (the build can use them) but are not measured again
    h1 = {r["schedule_hash"] for r in read_trials(n1.path)}
    h2 = {r["schedule_hash"] for r in read_trials(n2.path)}
    assert not h1 & h2
    assert s2["best_latency_ms"] <= s1["best_latency_ms"] + 1e-9
    assert s2["best_latency_ms"] == pytest.approx(min(s2["session_best_ms"], s1["best_latency_ms"]))
    # the trial at which tonight's own measurements reached the previous best, if they did
    reached = s2["reached_previous_best_at"]
    assert reached is None or s2["curve"][reached - 1][1] <= s2["previous_best_ms"]


def test_history_answers_best_per_night_trend_and_best_per_workload(tmp_path, two_sessions, session_store):
    _, n1, n2, _ = two_sessions
    root = tmp_path / "store"
    history.record_run(root, _run("a", "2026-11-19", session_store, n1, tuned_ms=2.0, untuned_ms=8.0), [n1.path])
    history.record_run(root, _run("b", "2026-11-20", session_store, n2, tuned_ms=1.5, untuned_ms=8.0), [n2.path])
    history.record_run(root, _run("c", "2026-11-20", session_store, n2, tuned_ms=1.2, untuned_ms=8.0), [])
    history.record_run(root, _run("d", "2026-11-21", session_store, n2, tuned_ms=0.5, correct=False), [])
    nights = history.best_per_night(root, "micronet")
    assert [(r["night"], r["best_ms"], r["runs"]) for r in nights] == [("2026-11-19", 2.0, 1), ("2026-11-20", 1.2, 2)]
    trend = history.trend(root, "micronet")
    assert [(r["night"], r["tuned_ms"]) for r in trend] == [
        ("2026-11-19", 2.0),
        ("2026-11-20", 1.2),
        ("2026-11-21", None),
    ]
    assert trend[1]["speedup"] == pytest.approx(8.0 / 1.2)
    (best,) = history.best_per_workload(root)
    all_ms = [r["latency_ms"] for a in (n1, n2) for r in read_trials(a.path)]
    assert best["latency_ms"] == min(all_ms) and best["measurements"] == 8


def test_the_guard_keeps_the_best_nights_build_when_tonight_regresses(tmp_path, session_store, two_sessions):
    _, n1, _, _ = two_sessions
    root = tmp_path / "store"
    history.record_run(root, _run("a", "2026-11-19", session_store, n1, tuned_ms=1.0, build_id="good"), [])
    first = guard.check(root, _run("b", "2026-11-20", session_store, n1, tuned_ms=1.05), 10.0)
    assert not first.regressed and first.best_night == "2026-11-19" and first.worse_pct == pytest.approx(5.0)
    bad = guard.check(root, _run("c", "2026-11-21", session_store, n1, tuned_ms=1.5), 10.0)
    assert bad.regressed and bad.best_build_id == "good" and "REGRESSION" in bad.message and "50.0%" in bad.message
    assert not guard.check(tmp_path / "empty", _run("x", "2026-11-21", session_store, n1), 10.0).regressed


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory, host_target):
    """A store with two untuned builds that take the same 1x3x64x64 input: micronet's (two
    convs) and tinynet's (four, about 3x the work), so that one is genuinely the slower."""
    store = ArtifactStore(tmp_path_factory.mktemp("guard-store"))
    built = {}
    for name in ("micronet", "tinynet"):
        fetched = steps.fetch_step(store, ModelConfig(source="builtin", name=name, input_shape=(1, 3, 64, 64)))
        built[name] = steps.build_step(store, steps.extract_step(store, fetched, host_target), None, host_target)
    return store, fetched, built


def _guarded(
    tmp_path,
    two_builds,
    board,
    host_target,
    tonight,
    best,
    best_ms,
    tonight_ms,
    rounds=5,
    key=None,
    collected=(),
    max_regression_pct=10.0,
):
    """The guard's verdict on a night whose tuned build is `tonight`, in a fresh store whose
    history has one earlier night whose build is `best`, recorded at `best_ms` (the history's
    number, not the board's). The builds in `collected` were garbage-collected from it."""
    _, fetched, built = two_builds
    store = ArtifactStore(tmp_path / "store")
    for name in set(built) - set(collected):
        shutil.copytree(built[name].path, store.root / "steps" / "build" / built[name].id)
    history.record_run(
        store.root, _run("best", "2026-11-19", None, None, tuned_ms=best_ms, build_id=built[best].id), []
    )
    tonight_run = _run("tonight", "2026-11-20", None, None, tuned_ms=tonight_ms, build_id=built[tonight].id)
    return steps.regression_verdict(
        store,
        tonight_run.model_copy(update={"board_key": board.key}),
        GuardConfig(confirm_rounds=rounds, max_regression_pct=max_regression_pct),
        host_target,
        (board.host, board.port),
        key or board.key,
        fetched,
    )


def test_a_regression_is_confirmed_by_timing_both_builds_in_turn_on_the_board(tmp_path, two_builds, board, host_target):
    """tinynet's build is the slower one: the history says so, and so does the board in turn."""
    verdict = _guarded(tmp_path, two_builds, board, host_target, "tinynet", "micronet", 1.0, 3.0)
    assert verdict.regressed and verdict.worse_pct == pytest.approx(200.0)
    t = verdict.in_turn
    assert t["rounds"] == 5 and len(t["tonight_ms"]) == len(t["best_ms"]) == 5
    assert t["ratio"] > 1.5 and t["tonight_median_ms"] > t["best_median_ms"] > 0
    assert verdict.message.startswith("REGRESSION: timed in turn on the board (5 rounds)")


def test_a_night_the_evaluations_call_regressed_but_that_times_even_in_turn_is_not_a_regression(
    tmp_path, two_builds, board, host_target
):
    """The history recorded the best night at half tonight's time (a fast minute); the same
    build timed in turn with itself is even, so tonight's build becomes current. Even within
    25%: the same build timed against itself on a loaded 2-core machine has read 1.15."""
    verdict = _guarded(
        tmp_path, two_builds, board, host_target, "micronet", "micronet", 1.0, 2.0, max_regression_pct=25.0
    )
    assert not verdict.regressed and verdict.worse_pct == pytest.approx(100.0)
    assert 0.8 < verdict.in_turn["ratio"] < 1.25
    assert "not a regression, tonight's build becomes current" in verdict.message


def test_without_the_best_build_or_a_board_the_evaluations_verdict_stands_and_says_why(
    tmp_path, two_builds, board, host_target
):
    no_board = _guarded(
        tmp_path / "a", two_builds, board, host_target, "micronet", "tinynet", 1.0, 2.0, key="nosuchboard"
    )
    assert no_board.regressed and no_board.in_turn is None
    assert "'nosuchboard'" in no_board.in_turn_error and "not confirmed in turn" in no_board.message
    off = _guarded(tmp_path / "b", two_builds, board, host_target, "micronet", "tinynet", 1.0, 2.0, rounds=0)
    assert off.regressed and off.in_turn is None and off.in_turn_error is None
    gone = _guarded(
        tmp_path / "c", two_builds, board, host_target, "micronet", "tinynet", 1.0, 2.0, collected=["tinynet"]
    )
    assert gone.regressed and gone.in_turn is None
    assert "the build of 2026-11-19" in gone.in_turn_error and "no longer in the store" in gone.in_turn_error


INT8_X86 = PipelineConfig(quantize={"enabled": True}, pack={"enabled": True, "layout": "x86", "cfactor": 16})


def test_a_variant_is_what_changes_the_built_network_not_how_long_it_was_tuned():
    fp32 = PipelineConfig().model_dump(mode="json")
    int8 = INT8_X86.model_dump(mode="json")
    assert variant.of(fp32).startswith("fp32-blocked-winograd.") and variant.of(int8).startswith("int8-x86-c16.")
    longer = PipelineConfig(
        tune={"trials_per_task": 512},
        quantize={"enabled": True, "calibrate_mode": "max"},
        pack={"enabled": True, "layout": "x86", "cfactor": 16},
    )
    assert variant.of(longer.model_dump(mode="json")) == variant.of(int8)  # budget, calibration: same variant
    for other in (
        PipelineConfig(
            quantize={"enabled": True, "skip_conv_layers": ()}, pack={"enabled": True, "layout": "x86", "cfactor": 16}
        ),
        PipelineConfig(quantize={"enabled": True}, pack={"enabled": True, "layout": "x86", "cfactor": 8}),
        PipelineConfig(model={"input_shape": (1, 3, 112, 112)}),
    ):
        assert variant.of(other.model_dump(mode="json")) not in (variant.of(fp32), variant.of(int8))


def test_the_guard_compares_a_night_only_with_earlier_nights_of_its_variant(tmp_path, session_store, two_sessions):
    _, n1, _, _ = two_sessions
    root = tmp_path / "store"
    int8 = INT8_X86.model_dump(mode="json")
    history.record_run(root, _run("i8", "2026-11-19", session_store, n1, tuned_ms=1.0, config=int8), [])
    # the first fp32 night is a first run, not "200% slower" than the int8 build
    fp32 = guard.check(root, _run("f1", "2026-11-20", session_store, n1, tuned_ms=3.0), 10.0)
    assert not fp32.regressed and fp32.best_ms is None and "first recorded run" in fp32.message
    history.record_run(root, _run("f1", "2026-11-20", session_store, n1, tuned_ms=3.0), [])
    slower = guard.check(root, _run("f2", "2026-11-21", session_store, n1, tuned_ms=3.6), 10.0)
    assert slower.regressed and slower.best_ms == 3.0 and slower.best_night == "2026-11-20"
    int8_night = _run("i2", "2026-11-21", session_store, n1, tuned_ms=1.05, config=int8)
    assert not guard.check(root, int8_night, 10.0).regressed
    nights = history.best_per_night(root, "micronet")
    assert [(r["variant"].split(".")[0], r["best_ms"]) for r in nights] == [("fp32", 3.0), ("int8-x86-c16", 1.0)]
    assert {r["variant"] for r in history.trend(root, "micronet")} == {variant.of(int8), variant.of({})}
    paths = {guard.current_path(root, "micronet", "host", "test", variant.of(c)) for c in ({}, int8)}
    assert len(paths) == 2


def test_evaluations_recorded_before_the_variant_get_it_from_their_runs_result(tmp_path, session_store, two_sessions):
    """A store from before the variant column: its rows are still compared by variant."""
    _, n1, _, _ = two_sessions
    root = tmp_path / "store"
    int8 = INT8_X86.model_dump(mode="json")
    legacy = _run("old-int8", "2026-11-19", session_store, n1, tuned_ms=1.0, config=int8)
    rows = [{k: v for k, v in r.items() if k != "variant"} for r in history.evaluation_rows(legacy)]
    old_schema = pa.schema([f for f in history.EVALUATION_SCHEMA if f.name != "variant"])
    part = history.history_dir(root) / history.EVALUATIONS / "night=2026-11-19"
    part.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=old_schema).drop_columns(["night"]), part / "part-old.parquet")
    (root / "runs").mkdir()
    (root / "runs" / "old-int8.json").write_text(json.dumps(legacy.to_json()))
    assert {r["variant"] for r in history.evaluations(root)} == {variant.of(int8)}
    assert guard.check(root, _run("f", "2026-11-20", session_store, n1, tuned_ms=3.0), 10.0).best_ms is None
    assert guard.check(root, _run("i", "2026-11-20", session_store, n1, tuned_ms=2.0, config=int8), 10.0).regressed
    (root / "runs" / "old-int8.json").unlink()  # its result gone: the row has no variant, and is compared with none
    assert [r["variant"] for r in history.evaluations(root)] == [None, None]
    int8_night = _run("i", "2026-11-20", session_store, n1, tuned_ms=2.0, config=int8)
    assert guard.check(root, int8_night, 10.0).best_ms is None


def test_a_reader_never_sees_a_history_part_before_it_is_whole(tmp_path, monkeypatch):
    """Two runs share a store and read its history without a lock while the other appends:
    an append writes its parts beside the dataset and renames them in only once written."""
    row = {"run_id": "r1", "night": "2026-11-29"}
    rows = [{f.name: row.get(f.name) for f in history.EVALUATION_SCHEMA}]
    seen_while_writing = []
    real_write = ds.write_dataset

    def write_then_look(*args, **kwargs):
        real_write(*args, **kwargs)
        seen_while_writing.append(history.read(tmp_path, history.EVALUATIONS).num_rows)

    monkeypatch.setattr(history.ds, "write_dataset", write_then_look)
    assert history._append(tmp_path, history.EVALUATIONS, history.EVALUATION_SCHEMA, "run_id", rows) == 1
    assert seen_while_writing == [0]  # written, not yet published
    assert history.read(tmp_path, history.EVALUATIONS).column("run_id").to_pylist() == ["r1"]
    assert not list(history.history_dir(tmp_path).glob(".staging-*"))  # nothing left beside it


def test_a_zero_byte_or_torn_history_part_is_quarantined_with_a_warning_and_the_rest_is_read(tmp_path, caplog):
    """What a power cut leaves when a part's rename reached the disk before its data."""
    schema = history.EVALUATION_SCHEMA
    for run, night in (("r1", "2026-11-29"), ("r2", "2026-11-30")):
        row = {"run_id": run, "night": night, "evaluation_id": run}
        history._append(
            tmp_path, history.EVALUATIONS, schema, "evaluation_id", [{f.name: row.get(f.name) for f in schema}]
        )
    base = history.history_dir(tmp_path) / history.EVALUATIONS
    empty = base / "night=2026-11-30" / "part-0-empty-0.parquet"
    empty.write_bytes(b"")
    torn = base / "night=2026-11-29" / "part-0-torn-0.parquet"
    torn.write_bytes(next((base / "night=2026-11-29").glob("part-*")).read_bytes()[:40])
    with caplog.at_level("WARNING", logger="vta_pipeline.store.history"):
        got = history.read(tmp_path, history.EVALUATIONS)
    assert sorted(got.column("run_id").to_pylist()) == ["r1", "r2"]
    assert not empty.exists() and not torn.exists()
    quarantined = sorted(p.name for p in (history.history_dir(tmp_path) / "quarantine").rglob("*.parquet"))
    assert quarantined == [empty.name, torn.name]
    assert sum("does not open" in r.message for r in caplog.records) == 2
    assert history.read(tmp_path, history.EVALUATIONS).num_rows == 2  # and no second warning
    assert sum("does not open" in r.message for r in caplog.records) == 2


def test_a_torn_current_library_is_copied_again_and_a_torn_current_record_reads_as_absent(tmp_path, caplog):
    """What a power cut or a full disk leaves in current/: the guard notices, names the file, and
    the next promotion repairs it from the store's own verified build."""
    store = ArtifactStore(tmp_path / "store")
    art = store.produce("build", "k", lambda out: (out / "model.so").write_bytes(b"\x7fELF" + bytes(range(256)) * 64))
    night = _run("n1", "2026-11-20", None, None, build_id=art.id)
    keep = guard.Verdict(
        regressed=False,
        tonight_ms=1.0,
        best_ms=None,
        best_night=None,
        best_build_id=None,
        worse_pct=None,
        max_regression_pct=10.0,
    )
    cur = guard.promote(store, night, keep)
    lib = Path(cur["lib"])
    assert cur["lib_sha256"] == sha256_file(art.file("model.so"))
    assert guard.read_current(store.root, "micronet", "host", "test", cur["variant"])["lib_ok"]
    lib.write_bytes(lib.read_bytes()[:100])  # torn copy
    with caplog.at_level("WARNING"):
        torn = guard.read_current(store.root, "micronet", "host", "test", cur["variant"])
    assert torn["lib_ok"] is False and str(lib) in caplog.text and "SHA-256" in caplog.text
    again = guard.promote(
        store, night.model_copy(update={"run_id": "n2"}), keep
    )  # the same build: copied again all the same
    assert lib.read_bytes() == art.file("model.so").read_bytes() and again["lib_sha256"] == cur["lib_sha256"]
    record = guard.current_path(store.root, "micronet", "host", "test", cur["variant"])
    record.write_text(record.read_text()[:40])  # torn record
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert guard.read_current(store.root, "micronet", "host", "test", cur["variant"]) is None
    assert str(record) in caplog.text
    assert guard.promote(store, night.model_copy(update={"run_id": "n3"}), keep)["build_id"] == art.id
    assert guard.read_current(store.root, "micronet", "host", "test", cur["variant"])["lib_ok"]
