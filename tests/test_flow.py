"""The Prefect flow end to end on a real local tracker with two rpc servers."""

import os
import platform
import signal
import subprocess
import sys
import time

import pytest
import tvm

from vta_pipeline.boards import LocalBoard
from vta_pipeline.config import build_config
from vta_pipeline.store import history
from vta_pipeline.store.artifacts import ArtifactStore

pytestmark = pytest.mark.slow


def _cfg(store, tracker, key, trials=4, seed=0):
    return build_config(
        None,
        {
            "model.source": "builtin",
            "model.name": "micronet",
            "model.seed": seed,
            "board.tracker": tracker,
            "board.key": key,
            "tune.trials_per_task": trials,
            "tune.trials_per_batch": 4,
            "tune.task_filter": "conv2d",
            "measure.number": 2,
            "evaluate.repeat": 3,
            "store": str(store),
            "opt": "O0",  # what is under test is the DAG, not the layout: plain NCHW, every trial measured
        },
    ).model_dump(mode="json")


def _task_runs(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def _computed(store, since=0):
    return sorted({e["step"] for e in store.events() if e["event"] == "computed" and e["t"] >= since})


def test_flow_end_to_end_then_cached_then_partially_recomputed(prefect_harness, board, tmp_path):
    from vta_pipeline.flows.tune_network import tune_network

    store = ArtifactStore(tmp_path / "store")
    result = tune_network(_cfg(store.root, board.tracker, board.key))
    assert result["tuned"]["correct"] and result["untuned"]["correct"]
    assert result["speedup"] > 1.0  # tuning beats plain loops even at 4 trials
    assert [t["trials"] for t in result["tasks"]] == [4, 4]
    assert all(t["best_gflops"] > 0 and t["errors"] == 0 for t in result["tasks"])
    assert (store.root / "runs" / f"{result['run_id']}.json").exists()
    assert _computed(store) == ["build", "evaluate", "extract", "fetch", "pick_best", "tune"]
    # every measurement and evaluation in the history names the board that made it and its TVM
    for name in (history.MEASUREMENTS, history.EVALUATIONS):
        rows = history.read(store.root, name, columns=["board", "tvm_version"]).to_pylist()
        assert rows and all(r == {"board": platform.node(), "tvm_version": tvm.__version__} for r in rows), name

    # Same inputs, new flow run: nothing is computed again.
    t1 = time.time()
    state = tune_network(_cfg(store.root, board.tracker, board.key), return_state=True)
    again = state.result()
    assert _computed(store, t1) == []
    assert again["tuned"]["mean_ms"] == result["tuned"]["mean_ms"]
    # ...and Prefect shows every computing step of that run as Cached, each tuning task by
    # name. The guard, the history append and the timing against ONNX Runtime are never
    # cached: they must see this run (and its minutes).
    runs = _task_runs(state.state_details.flow_run_id)
    after_eval = {"compare-runtime", "regression-guard", "record-history"}
    assert {r.state_name for r in runs if r.name.rsplit("-", 1)[0] not in after_eval} == {"Cached"}
    assert {r.name.rsplit("-", 1)[0] for r in runs if r.state_name != "Cached"} == after_eval
    assert {r.name for r in runs if r.name.startswith("tune-")} == {f"tune-{t['task']}" for t in result["tasks"]}

    # An artifact deleted behind the store's back is recomputed, not taken from Prefect's cache.
    lib = next(a for a in store.find("build") if a.meta["tuned"])
    lib.file("model.so").unlink()
    t_del = time.time()
    tune_network(_cfg(store.root, board.tracker, board.key))
    assert _computed(store, t_del) == ["build"]  # same bytes again, so evaluate stays cached

    # A bigger budget: tuning continues from the records; fetch and extract are reused.
    t2 = time.time()
    more = tune_network(_cfg(store.root, board.tracker, board.key, trials=6))
    recomputed = set(_computed(store, t2))
    assert {"tune", "pick_best", "build"} <= recomputed and not recomputed & {"fetch", "extract"}
    # (evaluate reruns only if the best schedules changed: the library is content-addressed)
    assert [t["trials"] for t in more["tasks"]] == [6, 6]
    assert [t["trials_this_run"] for t in more["tasks"]] == [2, 2]


def test_latency_allocation_spends_the_networks_budget_where_its_time_goes(prefect_harness, board, tmp_path):
    """`tune.allocation = latency`: a first round of half the budget per task, then the rest
    of the network's budget by each task's share of its latency after that round."""
    from vta_pipeline.flows.tune_network import tune_network
    from vta_pipeline.search.allocation import TaskSpend, allocate, first_round, used_ms

    store = ArtifactStore(tmp_path / "store")
    cfg = {**_cfg(store.root, board.tracker, board.key, trials=4)}
    cfg["tune"] = {**cfg["tune"], "allocation": "latency"}
    result = tune_network(cfg)
    tasks = result["tasks"]
    assert sum(t["trials"] for t in tasks) == 4 * len(tasks)  # the network's budget, exactly
    assert [t["trials_this_run"] for t in tasks] == [t["trials"] for t in tasks]  # both rounds counted
    # The split is the one the first round's numbers ask for: each task's best after its
    # first-round trials (its curve) or its default lowering, times its weight.
    first = first_round(4)
    spends = [TaskSpend(t["task"], t["weight"], used_ms(t["curve"][first - 1][1], t["default_ms"])) for t in tasks]
    assert {t["task"]: t["trials"] for t in tasks} == allocate(spends, 4)
    costliest = max(spends, key=lambda s: s.cost).name
    assert next(t["trials"] for t in tasks if t["task"] == costliest) > first
    assert result["tuned"]["correct"]

    # A rerun makes the same split from the cached first round: nothing is tuned again.
    t1 = time.time()
    tune_network(cfg)
    assert "tune" not in _computed(store, t1)


def test_changed_model_recomputes_from_the_import(prefect_harness, board, tmp_path):
    from vta_pipeline.flows.tune_network import tune_network

    store = ArtifactStore(tmp_path / "store")
    tune_network(_cfg(store.root, board.tracker, board.key), stop_after="extract")
    t1 = time.time()
    tune_network(_cfg(store.root, board.tracker, board.key, seed=3), stop_after="extract")
    assert _computed(store, t1) == ["extract", "fetch"]


def test_board_lost_before_upload_then_rerun_resumes_at_evaluate(tmp_path):
    """Kill the boards while the tuned network builds; the run fails in its evaluation. After
    the boards come back, the rerun computes only that evaluation: the earlier steps' bodies
    (the untuned network's evaluation, before tuning, among them) never run again."""
    store = ArtifactStore(tmp_path / "store")
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"), VTA_PIPELINE_BOARD_RETRIES="0")
    with LocalBoard(key="flaky", num_servers=2) as b:
        cmd = [
            sys.executable,
            "-m",
            "vta_pipeline.cli",
            "run",
            "--model",
            "micronet",
            "--source",
            "builtin",
            "--tracker",
            b.tracker,
            "--key",
            "flaky",
            "--trials-per-task",
            "4",
            "--trials-per-batch",
            "4",
            "--task-filter",
            "conv2d",
            "--number",
            "2",
            "--eval-repeat",
            "3",
            "--store",
            str(store.root),
            "--opt",
            "O0",
        ]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 900
        while not any(e["event"] == "computed" and e["step"] == "pick_best" for e in store.events()):
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.time() < deadline
            time.sleep(0.05)
        for s in b.servers:  # the boards go away
            os.killpg(s.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode != 0
        assert "flaky" in out  # the failure names the key
        first = _computed(store)
        assert {"fetch", "extract", "build", "evaluate", "tune", "pick_best"} <= set(first)
        evaluated = [e for e in store.events() if e["event"] == "computed" and e["step"] == "evaluate"]
        tuned = [e for e in store.events() if e["event"] == "computed" and e["step"] == "tune"]
        assert len(evaluated) == 1 and evaluated[0]["t"] < min(e["t"] for e in tuned)  # the untuned, before tuning

        for _ in range(2):  # the boards come back
            b.add_server()
        time.sleep(3)
        t1 = time.time()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert _computed(store, t1) == ["evaluate"]
        started = {e["step"] for e in store.events() if e["event"] == "started" and e["t"] >= t1}
        assert not started & {"fetch", "extract", "tune", "pick_best"}
        assert "speed-up" in done.stdout


def test_a_run_with_no_layout_flag_blocks_every_conv_and_says_whether_it_beat_onnx_runtime(
    prefect_harness, board, tmp_path
):
    """The default preset (O2) on a CPU target: the cpu-layout step blocks micronet's convs
    (its 16-channel 3x3 as Winograd), every task is tuned, and the result holds ONNX Runtime
    fp32 timed in turn with the tuned build on the board's cores (a loopback tracker)."""
    from vta_pipeline.flows.tune_network import tune_network
    from vta_pipeline.report import RunResult, render

    store = ArtifactStore(tmp_path / "store")
    cfg = {k: v for k, v in _cfg(store.root, board.tracker, board.key).items() if k != "opt"}
    cfg["tune"] = {**cfg["tune"], "task_filter": "auto"}
    result = tune_network(cfg)  # no "opt": the default
    assert result["opt"] == "O2" and result["recipe"]["blocked"] and result["recipe"]["winograd"]
    layout = result["transforms"]["cpu_layout"]
    assert layout["convs"] == layout["blocked_convs"] == 2 and layout["winograd_convs"] == 1
    assert "cpu_layout" in _computed(store)
    assert any("winograd" in t["task"] for t in result["tasks"]) and result["tuned"]["correct"]
    b = result["baseline"]
    assert b["engine"] == "ONNX Runtime fp32" and b["ort_ms"] > 0 and b["ort_output_matches"]
    assert b["ratio"] == pytest.approx(b["ours_ms"] / b["ort_ms"]) and len(b["ort_rounds_ms"]) == b["rounds"]
    text = render(RunResult.model_validate(result))
    assert "ONNX Runtime fp32 (in turn)" in text and "in turn with ONNX Runtime fp32" in text
