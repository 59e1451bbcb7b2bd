"""Step 3: tuning on a real board measures for real and resumes without re-measuring."""

import json

import pytest

from vta_pipeline import steps
from vta_pipeline.boards import BoardSpec
from vta_pipeline.config import MeasureConfig, TuneConfig
from vta_pipeline.extract import load_tasks
from vta_pipeline.search.trial_log import read_state, read_trials, task_work_dir
from vta_pipeline.tune import TaskJob, tune_task

MEASURE = MeasureConfig(number=2, repeat=1, timeout_s=60)


def _conv(extracted, i=0):
    return [t for t in load_tasks(extracted.path) if t.op == "conv2d"][i]


def _spec(board, n=2):
    return BoardSpec(board.host, board.port, board.key, n)


def test_trials_are_measured_and_resume_continues_without_repeats(micronet, board, host_target, tmp_path):
    _, extracted = micronet
    task = _conv(extracted)
    work = task_work_dir(tmp_path, host_target.id, task.workload_hash)
    args = (
        extracted.path / task.file,
        task.name,
        task.flops,
        task.workload_hash,
        host_target.target_json,
        _spec(board),
    )

    first = tune_task(TaskJob(*args, TuneConfig(trials_per_task=4, trials_per_batch=4), MEASURE, work))
    # Really measured on the board: latencies, not the old "0.00 GFLOPS" of failed builds.
    assert first.trials == 4 and first.valid == 4 and first.errors == 0
    assert first.best_latency_ms > 0 and first.best_gflops > 0
    # the task's default lowering is measured once, on the same board, for pick_best to compare
    assert first.default_ms > 0 and (work / "default.json").exists()

    # The budget goes up (as after an interrupted run): only the difference is tuned.
    second = tune_task(TaskJob(*args, TuneConfig(trials_per_task=8, trials_per_batch=4), MEASURE, work))
    assert second.trials == 8 and second.trials_this_run == 4
    rows = read_trials(work)
    assert [r["trial"] for r in rows] == list(range(8))
    assert len({r["schedule_hash"] for r in rows}) == 8  # no schedule measured twice
    assert second.best_latency_ms <= first.best_latency_ms

    # Finished at this budget: calling again measures nothing.
    third = tune_task(TaskJob(*args, TuneConfig(trials_per_task=8, trials_per_batch=4), MEASURE, work))
    assert third.trials_this_run == 0 and len(read_trials(work)) == 8
    assert third.default_ms == first.default_ms
    assert read_state(work)["status"] == "finished"
    # best-so-far curve is monotone
    bests = [b for _, b in third.curve]
    assert bests == sorted(bests, reverse=True)


def test_early_stopping_ends_a_task_before_its_budget(micronet, board, host_target, tmp_path):
    _, extracted = micronet
    task = _conv(extracted, 1)
    work = task_work_dir(tmp_path, host_target.id, task.workload_hash)
    out = tune_task(
        TaskJob(
            extracted.path / task.file,
            task.name,
            task.flops,
            task.workload_hash,
            host_target.target_json,
            _spec(board),
            TuneConfig(trials_per_task=64, trials_per_batch=2, early_stopping=1, search="replay-trace"),
            MEASURE,
            work,
        )
    )
    assert out.stopped == "early-stopping" and out.trials < 64


def test_tune_step_is_an_artifact_reused_for_the_same_budget(micronet, board, host_target, session_store):
    _, extracted = micronet
    task = _conv(extracted)
    cfg = TuneConfig(trials_per_task=4, trials_per_batch=4)
    a = steps.tune_step(session_store, extracted, task, host_target, _spec(board), cfg, MEASURE)
    summary = json.loads(a.file("summary.json").read_text())
    assert summary["valid"] == 4
    b = steps.tune_step(session_store, extracted, task, host_target, _spec(board), cfg, MEASURE)
    assert b.id == a.id
    events = [e for e in session_store.events() if e.get("step") == "tune" and e.get("key") == a.key]
    assert [e["event"] for e in events].count("computed") == 1


def test_pick_best_keeps_the_default_lowering_when_tuning_did_not_beat_it(
    micronet, board, host_target, session_store, tmp_path
):
    import shutil

    from vta_pipeline.pick_best import open_db, pick_best

    _, extracted = micronet
    a = steps.tune_step(
        session_store,
        extracted,
        _conv(extracted),
        host_target,
        _spec(board),
        TuneConfig(trials_per_task=4, trials_per_batch=4),
        MEASURE,
    )
    summary = json.loads(a.file("summary.json").read_text())
    for default_ms, records, uses in (
        (summary["best_latency_ms"] * 2, 1, "tuned"),
        (summary["best_latency_ms"] / 2, 0, "default"),
    ):
        task_dir = tmp_path / f"task-{uses}"
        shutil.copytree(a.path, task_dir)
        (task_dir / "summary.json").write_text(json.dumps(dict(summary, default_ms=default_ms)))
        out = tmp_path / f"best-{uses}"
        out.mkdir()
        meta = pick_best([task_dir], out)
        assert meta["records"] == records and len(open_db(out).get_all_tuning_records()) == records
        assert json.loads((out / "best.json").read_text())[0]["uses"] == uses


def test_the_best_records_are_retimed_in_turn_and_pick_best_builds_with_the_fastest(
    micronet, board, host_target, session_store, tmp_path
):
    """One measurement per candidate while tuning, minutes apart, ranks them by their minute
    too: after the search the task's best records are measured again in turn, and the
    network is built with the fastest of that."""
    import shutil

    from vta_pipeline.pick_best import open_db, pick_best
    from vta_pipeline.search import retime

    _, extracted = micronet
    task = _conv(extracted, 1)
    cfg = TuneConfig(trials_per_task=4, trials_per_batch=4, retime_top=3, retime_rounds=2, retime_within=100)
    a = steps.tune_step(session_store, extracted, task, host_target, _spec(board), cfg, MEASURE)
    retimed = json.loads(a.file(retime.RETIMED).read_text())
    cands = retimed["candidates"]
    assert [c["rank"] for c in cands] == [0, 1, 2] and all(len(c["retimed_ms"]) == 2 for c in cands)
    fastest = min(range(3), key=lambda i: min(cands[i]["retimed_ms"]))
    assert retimed["winner"] == fastest and retimed["winner_ms"] == min(cands[fastest]["retimed_ms"])
    summary = json.loads(a.file("summary.json").read_text())
    assert summary["retimed"]["winner_rank"] == fastest + 1

    # pick best commits the winner, whichever recorded rank it had (the task's default
    # lowering made slower, so that a tuned record is kept at all)
    from tvm.s_tir import meta_schedule as ms

    task_dir = tmp_path / "task"
    shutil.copytree(a.path, task_dir)
    (task_dir / "summary.json").write_text(json.dumps(dict(summary, default_ms=summary["best_latency_ms"] * 2)))
    db = open_db(task_dir)
    top = db.get_top_k(db.get_all_tuning_records()[0].workload, 3)
    out = tmp_path / "best"
    out.mkdir()
    pick_best([task_dir], out)
    (kept,) = open_db(out).get_all_tuning_records()
    assert str(kept.trace) == str(top[fastest].trace)

    # A re-time of other records than the database holds now (records added since) is not used.
    stale = tmp_path / "stale"
    shutil.copytree(a.path, stale)
    more = open_db(stale)
    rec = more.get_all_tuning_records()[0]
    more.commit_tuning_record(ms.database.TuningRecord(rec.trace, rec.workload, [1e-9], rec.target, rec.args_info))
    assert retime.current(stale) is None and retime.winner_record(stale, open_db(stale)) is None

    # A finished task with the same records is not re-timed again.
    work = steps.tune_work_dir(session_store, task, host_target, board.key, cfg.session)
    before = (work / retime.RETIMED).read_text()
    again = tune_task(
        TaskJob(
            extracted.path / task.file,
            task.name,
            task.flops,
            task.workload_hash,
            host_target.target_json,
            _spec(board),
            cfg,
            MEASURE,
            work,
        )
    )
    assert again.trials_this_run == 0 and (work / retime.RETIMED).read_text() == before

    # Asked to re-time with flushed caches (auto is flushed on this x86 host), the finished task
    # re-times again, each candidate once per repeat after the runner flushed its weights
    # (retime.retime_measure); the default re-time was warm, as the search measures.
    assert json.loads(before)["caches"] == "warm" and summary["retimed"]["caches"] == "warm"
    assert retime.retime_measure(MEASURE, "flushed").model_dump() == dict(
        MEASURE.model_dump(),
        number=1,
        min_repeat_ms=0,
        repeat=max(MEASURE.repeat, retime.FLUSHED_REPEATS),
        enable_cpu_cache_flush=True,
    )
    assert retime.retime_measure(MEASURE, "warm") == MEASURE
    auto_cfg = cfg.model_copy(update={"retime_caches": "auto"})
    tune_task(
        TaskJob(
            extracted.path / task.file,
            task.name,
            task.flops,
            task.workload_hash,
            host_target.target_json,
            _spec(board),
            auto_cfg,
            MEASURE,
            work,
        )
    )
    flushed = json.loads((work / retime.RETIMED).read_text())
    assert flushed["caches"] == "flushed" and all(len(c["retimed_ms"]) == 2 for c in flushed["candidates"])
    before = (work / retime.RETIMED).read_text()

    # Records recorded further than `within` x the best are not re-timed: with none but the
    # best that close, there is nothing to choose between (and the last re-time stays).
    import tvm

    assert (
        retime.retime_top(
            work,
            task.name,
            tvm.ir.load_json((extracted.path / task.file).read_text()),
            tvm.target.Target(host_target.target_json),
            _spec(board),
            MEASURE,
            TuneConfig(retime_top=3, retime_rounds=2, retime_within=1.0 + 1e-9, retime_caches="flushed"),
        )
        is None
    )
    assert (work / retime.RETIMED).read_text() == before


@pytest.mark.parametrize(
    "target, caches",
    [
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3"}, "flushed"),
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, "flushed"),
        ({"kind": "llvm", "mtriple": "armv7a-linux-gnueabihf", "mattr": ["+neon"]}, "warm"),  # TVM's flush: a no-op
        ("cuda", "warm"),
        ("opencl", "warm"),
    ],
)
def test_auto_retimes_with_flushed_caches_on_the_cpus_tvm_can_flush(target, caches):
    import tvm

    from vta_pipeline.search import retime

    assert retime.resolve_caches("auto", tvm.target.Target(target)) == caches
    assert retime.resolve_caches("warm", tvm.target.Target(target)) == "warm"


@pytest.mark.parametrize(
    "target, measured", [("llvm", True), ("c", True), ("cuda", True), ("opencl", True), ("hexagon", False)]
)
def test_a_tasks_default_lowering_is_measured_where_the_build_has_one(target, measured):
    """CPUs compile a task without a record as it is; GPUs through TVM's default GPU
    schedules. Both are measured, so that a task's few trials never make it slower."""
    import tvm

    from vta_pipeline.tune import measures_default

    assert measures_default(tvm.target.Target(target)) is measured


def test_a_gpu_tasks_default_lowering_is_the_builds_default_gpu_schedule():
    """Measured unscheduled, a GPU task is one unbound thread (it crashed an H200 board's
    session); its default is the network build's: every loop bound to blocks and threads."""
    import tvm
    from tvm import te, topi

    from vta_pipeline.build import default_gpu_schedules
    from vta_pipeline.tune import default_lowering

    data = te.placeholder((1, 14, 14, 32), name="data")
    weight = te.placeholder((3, 3, 32, 32), name="weight")
    out = topi.nn.relu(topi.nn.conv2d_nhwc(data, weight, 1, 1, 1))
    mod = tvm.IRModule({"main": te.create_prim_func([data, weight, out])})
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "max_num_threads": 1024})

    lowered = default_lowering(mod, cuda)
    assert "blockIdx.x" in lowered.script() and "threadIdx.x" in lowered.script()
    assert "threadIdx.x" not in mod.script()  # the search's module is left as it was
    tvm.ir.assert_structural_equal(lowered, default_gpu_schedules(mod, cuda))
    assert "threadIdx.x" not in mod.script()  # the build's own call schedules a copy too
    assert default_lowering(mod, tvm.target.Target("llvm")) is mod
