"""Boards measure with the threads the network will run with, one candidate at a time, and
the numbers they report agree with a quiet re-time of the same code."""

from __future__ import annotations

import os
import statistics

import numpy as np
import pytest

from vta_pipeline import steps
from vta_pipeline.boards import BoardSpec, LocalBoard, board_threads
from vta_pipeline.boards.builder import fast_build
from vta_pipeline.config import EvalConfig, MeasureConfig, TuneConfig
from vta_pipeline.evaluate import MIN_REPEAT, evaluate_on_board, plan_timing
from vta_pipeline.extract import load_tasks
from vta_pipeline.search.trial_log import read_trials, task_work_dir
from vta_pipeline.tune import TaskJob, tune_task


def test_timing_plan_runs_a_fast_build_long_enough_and_a_slow_one_within_budget():
    assert plan_timing(1, 10, 200, 30, per_run_s=0.002) == (100, 10)  # 100 x 2 ms = one 200 ms repeat
    assert plan_timing(1, 10, 200, 30, per_run_s=2.0) == (1, 10)  # 10 x 2 s fits 30 s
    assert plan_timing(1, 50, 200, 30, per_run_s=2.0) == (1, 15)
    assert plan_timing(1, 50, 200, 1e-6, per_run_s=2.0) == (1, MIN_REPEAT)
    assert plan_timing(8, 10, 0, None, per_run_s=1e-5) == (8, 10)  # number is a floor


def test_a_default_local_board_runs_kernels_on_every_core_of_this_machine(tmp_path):
    """TVM's own default on x86 is half the logical CPUs (1 of 2 here): the board sets it."""
    with LocalBoard(key="threads", registry=tmp_path / "registry", log_dir=tmp_path / "logs") as b:
        assert len(b.servers) == 1  # one measurement at a time on this machine's cores
        assert board_threads(b.host, b.port, b.key) == os.cpu_count()
    with LocalBoard(key="threads1", threads=1, registry=tmp_path / "registry", log_dir=tmp_path / "logs") as b:
        assert board_threads(b.host, b.port, b.key) == 1


def _tuning_vs_quiet(extracted, task, host_target, measure, tmp_path, rounds: int = 2):
    """Tune `task` 16 trials on a fresh local board, then time its top 5 candidates there again,
    alternately the way tuning measures them (MetaSchedule's runner, the run's measure config,
    a batch at a time) and quietly (one by one, 5 repeats of 100 ms).

    Returns, per candidate, (latency recorded while tuning, fastest runner re-measurement,
    fastest quiet time) in seconds: the last two come from the same minute, so the host's drift
    between tuning and re-timing is not in their ratio."""
    import tvm
    from tvm import rpc
    from tvm.s_tir import meta_schedule as ms

    from vta_pipeline.boards import pools

    work = task_work_dir(tmp_path, host_target.id, task.workload_hash)
    with LocalBoard(key="quiet", registry=tmp_path / "registry", log_dir=tmp_path / "logs") as b:
        threads = board_threads(b.host, b.port, b.key)  # as the flow reads it before tuning
        spec = BoardSpec(b.host, b.port, b.key, 1, threads)
        out = tune_task(
            TaskJob(
                extracted.path / task.file,
                task.name,
                task.flops,
                task.workload_hash,
                host_target.target_json,
                spec,
                TuneConfig(trials_per_task=16, trials_per_batch=8),
                measure,
                work,
            )
        )
        assert out.threads == os.cpu_count() and {r["threads"] for r in read_trials(work)} == {os.cpu_count()}
        mod = tvm.ir.load_json((extracted.path / task.file).read_text())
        db = ms.database.JSONDatabase(work_dir=str(work))
        top = db.get_top_k(db.commit_workload(mod), 5)
        paths = []
        for i, rec in enumerate(top):
            sch = tvm.s_tir.Schedule(mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
            path = tmp_path / f"cand{i}.so"
            fast_build(sch.mod, host_target.tvm_target(), None).export_library(str(path))  # as tuning built it
            paths.append(path)
        runner_s = [float("inf")] * len(top)
        quiet_s = [float("inf")] * len(top)
        with pools.runner(spec, measure) as runner:
            for _ in range(rounds):
                inputs = [ms.runner.RunnerInput(str(p), "cpu", rec.args_info) for rec, p in zip(top, paths)]
                for i, fut in enumerate(runner.run(inputs)):
                    res = fut.result()
                    assert res.error_msg is None, res.error_msg
                    runner_s[i] = min(runner_s[i], *(float(s) for s in res.run_secs))
                # the board serves one session at a time: the runner's are over, this one is ours
                remote = rpc.connect_tracker(b.host, b.port).request(b.key, session_timeout=600)
                dev = remote.cpu(0)
                for i, (rec, path) in enumerate(zip(top, paths)):
                    remote.upload(str(path))
                    f = remote.load_module(path.name)
                    args = [
                        tvm.runtime.tensor(np.random.uniform(size=[int(x) for x in a.shape]).astype(a.dtype), dev)
                        for a in rec.args_info
                    ]  # weights already in the layout the schedule rewrote them to
                    timer = f.time_evaluator(
                        f.entry_name,
                        dev,
                        number=measure.number,
                        repeat=5,
                        min_repeat_ms=max(measure.min_repeat_ms, 100),
                    )
                    # the fastest repeat: a neighbour's burst slows some repeats, a bias of the
                    # measuring (contention while tuning) slows every one of them
                    quiet_s[i] = min(quiet_s[i], *timer(*args).results)
                del timer, f, args, dev, remote  # ends the session: the next round's runner needs the board
    return [(min(float(s) for s in rec.run_secs), r, q) for rec, r, q in zip(top, runner_s, quiet_s)]


@pytest.mark.slow
def test_top_candidates_retimed_quietly_agree_with_their_tuning_latency(session_store, host_target, tmp_path):
    """tinynet's 32->32 3x3 conv at 32x32 (a tenth of a millisecond tuned): big enough that a
    measurement is the kernel, not the placement of its buffers (micronet's 15 us convs moved
    by +-13% between two allocations of the same code)."""
    from vta_pipeline.config import ModelConfig

    fetched = steps.fetch_step(session_store, ModelConfig(source="builtin", name="tinynet"))
    extracted = steps.extract_step(session_store, fetched, host_target)
    task = max(
        (t for t in load_tasks(extracted.path) if t.op == "conv2d" and t.workload[3] == 32), key=lambda t: t.flops
    )
    measure = MeasureConfig()  # the defaults a run measures with

    # The way tuning measures agrees with a quiet re-time of the same builds in the same minute,
    # within 10% together: two servers timing against each other put candidates 1.1x-3.0x off,
    # all in the same direction, which moves the median. Comparing the latencies recorded while
    # tuning with a re-time a minute later instead failed landing CI runs on this shared host's
    # drift alone (medians 1.44, 1.19 twice in a row, 0.75), so those are held to 2x each: a
    # number that is not the candidate's (another candidate's, a failed run's) is further off.
    # A tuning whose numbers miss either band is measured again, from a fresh tuning, up to three
    # times in all (a CI run of 6b874fc saw the median at 1.12 twice in a row: the runner's rounds
    # 1.0-1.29x the quiet ones; one of 7ab9803 recorded a candidate at 2.06x while tuning, its
    # runner re-time 1.13x: the host was busy in that round, not the number someone else's).
    def agrees(timed):
        return 0.9 <= statistics.median(r / q for _, r, q in timed) <= 1.1 and all(
            1 / 2 <= t / q <= 2 for t, _, q in timed
        )

    for attempt in range(3):
        timed = _tuning_vs_quiet(extracted, task, host_target, measure, tmp_path / f"attempt{attempt}")
        if agrees(timed):
            break
    shown = [tuple(round(x * 1e6, 1) for x in t) for t in timed]  # microseconds: recorded, runner, quiet
    print("recorded, runner, quiet (us):", shown)
    assert 0.9 <= statistics.median(r / q for _, r, q in timed) <= 1.1, shown
    assert all(1 / 2 <= t / q <= 2 for t, _, q in timed), shown


@pytest.mark.slow
def test_the_flows_evaluation_agrees_with_a_quiet_retime(micronet, host_target, tmp_path):
    from vta_pipeline import fetch
    from vta_pipeline.store.artifacts import ArtifactStore, CachePolicy

    fetched, extracted = micronet
    # As above: the evaluation and the retime are seconds apart on a host whose speed moves
    # 1.4x within minutes, so a pair out of the band is measured again, up to three times, on
    # the same build and board (a real bias, which the band is for, fails every time). A CI
    # run of 2c36997 saw two fresh boards' pairs out of the band in a row: (0.83, 0.51) ms.
    store = ArtifactStore(tmp_path / "store")  # the session store's evaluations are other tests'
    lib = steps.build_step(store, extracted, None, host_target)
    again = ArtifactStore(store.root, policy=CachePolicy.REDO)  # the same build, evaluated anew
    pairs = []
    with LocalBoard(key="evalq", registry=tmp_path / "registry", log_dir=tmp_path / "logs") as b:
        for _ in range(3):
            ev = steps.evaluate_step(again, lib, fetched, host_target, (b.host, b.port), b.key, EvalConfig())
            quiet = evaluate_on_board(
                lib.file("model.so"),
                fetch.load_reference(fetched.path),
                "llvm",
                (b.host, b.port),
                b.key,
                number=1,
                repeat=10,
                rtol=1e-3,
                atol=1e-3,
                min_repeat_ms=1000,
            )
            pairs.append((ev.meta["min_ms"], quiet.min_ms))
            # the fastest repeats, as above: a CI run of 481b682 saw the flow's mean 0.51 ms
            # against a retime whose median was 0.68 and whose fastest repeat was 0.52. And
            # the fastest of the attempts on each side: the host's bursts only slow a
            # measurement, so a CI run of a1e05ab saw the pairs (0.68, 0.59), (0.53, 0.67),
            # (0.70, 0.55) ms, out of the band in both directions, while the fastest of each
            # side, 0.53 and 0.55, agree; a bias would keep the flow's fastest off. Either
            # test passes: a CI run of 0c2cc22 saw (0.69, 0.48), (0.73, 0.54), (0.55, 0.56) ms,
            # the host fast for one quiet retime (fastest of each side 1.14x apart) while the
            # third pair agreed; a bias keeps every pair and the fastest of each side off.
            fastest = min(f for f, _ in pairs) / min(q for _, q in pairs)
            agree = 0.9 <= fastest <= 1.1 or any(0.9 <= f / q <= 1.1 for f, q in pairs)
            if agree:
                break
    print("flow, quiet (ms) per attempt:", pairs)
    assert ev.meta["threads"] == os.cpu_count() and ev.meta["number"] > 1
    assert agree, pairs  # (flow, quiet) ms per attempt


def test_a_flushed_retime_finds_a_kernels_weights_cold(board, host_target):
    """`retime_caches="flushed"`: each run of a candidate finds its weights outside the caches,
    as a layer does inside a network whose weights do not fit them. A kernel that streams a
    1 MiB weight matrix (it fits this CPU's L2) once per run is then several times slower
    than back to back, where every run after the first finds it in the cache."""
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.script import tirx as T

    from vta_pipeline.boards import pools
    from vta_pipeline.search.retime import retime_measure

    @T.prim_func(s_tir=True)
    def weighted_sum(
        x: T.Buffer((1024,), "float32"), w: T.Buffer((1024, 256), "float32"), y: T.Buffer((256,), "float32")
    ):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        for i in range(256):
            with T.sblock("init"):
                vi = T.axis.remap("S", [i])
                y[vi] = T.float32(0)
        for k, i in T.grid(1024, 256):  # rows of w in order: a stream, vectorized over i
            with T.sblock("acc"):
                vk, vi = T.axis.remap("RS", [k, i])
                y[vi] = y[vi] + x[vk] * w[vk, vi]

    target = tvm.target.Target(host_target.target_json)
    spec = BoardSpec(board.host, board.port, board.key, 1, 1)
    measure = MeasureConfig(number=5, repeat=3, min_repeat_ms=40, timeout_s=60)
    mod = tvm.IRModule({"main": weighted_sum})
    with pools.builder(120.0) as builder:
        (built,) = builder.build([ms.builder.BuilderInput(mod, target)])
    assert built.error_msg is None, built.error_msg
    inputs = [ms.runner.RunnerInput(built.artifact_path, "cpu", ms.arg_info.ArgInfo.from_prim_func(weighted_sum))]
    fastest = {"warm": [], "flushed": []}
    for _ in range(3):  # in turn: the host's minute moves both alike
        for caches in fastest:
            with pools.runner(spec, retime_measure(measure, caches)) as runner:
                (res,) = [f.result() for f in runner.run(inputs)]
            assert res.error_msg is None, res.error_msg
            fastest[caches].append(min(float(s) for s in res.run_secs))
    warm, flushed = min(fastest["warm"]), min(fastest["flushed"])
    assert flushed > 1.5 * warm, (warm, flushed)


def test_engines_timed_in_turn_start_only_after_the_one_before_has_rested(board):
    """A runtime's worker threads spin after its last kernel; an engine started at once would
    share the cores with them (ONNX Runtime right after our build ran twice its latency)."""
    import time

    from vta_pipeline.evaluate import time_in_turn

    calls: list[tuple[str, float, float]] = []

    def engine(name):
        def run() -> float:
            t0 = time.monotonic()
            calls.append((name, t0, time.monotonic()))
            return 1.0

        return run

    ms = time_in_turn(
        [],
        np.zeros(1, "float32"),
        "llvm",
        (board.host, board.port),
        board.key,
        2,
        local=[engine("a"), engine("b")],
        settle_s=0.2,
    )
    assert ms == [[1.0, 1.0], [1.0, 1.0]]
    assert [c[0] for c in calls] == ["b", "a", "a", "b", "b", "a"]  # round -1 (not counted), then in turn
    assert all(later[1] - earlier[2] >= 0.19 for earlier, later in zip(calls, calls[1:]))


def test_each_engine_timed_in_turn_runs_once_untimed_before_its_timed_runs():
    """The engine before it has just evicted its weights and its threads slept through the rest:
    a first run that pays for that is not counted, on either side (here: ONNX Runtime's timer
    over a session whose first run after a pause takes 100 ms and every later one 1 ms)."""
    import time

    from vta_pipeline.baseline import _timer

    class Session:
        last = 0.0

        def get_inputs(self):
            return [type("I", (), {"name": "x"})()]

        def run(self, _out, _feed):
            cold = time.perf_counter() - self.last > 0.1
            time.sleep(0.1 if cold else 0.001)
            self.last = time.perf_counter()
            return [np.zeros(1)]

    _, ms = _timer(Session(), np.zeros(1, "float32"), min_repeat_ms=20)
    time.sleep(0.2)  # the other engine's turn
    assert ms() < 3.0  # ~1 ms per run: the cold run was not among the timed ones
