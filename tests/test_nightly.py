"""The nightly flow: every pair runs, failures are reported, retries come from the cache;
a regressed night says so and keeps the best night's build current."""

import json
from collections import Counter
from pathlib import Path

import pytest

from vta_pipeline import guard
from vta_pipeline.errors import ConfigError
from vta_pipeline.report import RunResult
from vta_pipeline.store import history
from vta_pipeline.store.artifacts import ArtifactStore

pytestmark = pytest.mark.slow

SMALL = {"tune": {"task_filter": "conv2d"}, "measure": {"number": 2}, "evaluate": {"repeat": 3}}


def _flow_runs(name_prefix):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=name_prefix)))


@pytest.fixture(scope="module")
def night_a(prefect_harness, board, tmp_path_factory):
    """The night 2026-11-20 of micronet and of a corrupt ONNX file, with one flow retry."""
    from vta_pipeline.flows.nightly import nightly

    tmp = tmp_path_factory.mktemp("nightly")
    bad = tmp / "broken.onnx"
    bad.write_bytes(b"this is not an ONNX model")
    store = tmp / "store"
    state = nightly.with_options(retries=1, retry_delay_seconds=0)(
        models=["builtin:micronet", f"onnx:{bad}"],
        targets=["host"],
        night="2026-11-20",
        config={
            **SMALL,
            "tune": {**SMALL["tune"], "trials_per_task": 3, "trials_per_batch": 3},
            "board": {"tracker": board.tracker, "key": board.key},
            "store": str(store),
        },
        return_state=True,
    )
    return state, ArtifactStore(store)


def test_a_failed_pair_is_reported_the_others_finish_and_the_retry_redoes_only_what_failed(night_a):
    state, store = night_a
    assert state.is_failed()
    assert "1 of 2 pair(s) failed" in state.message and "broken-host-2026-11-20" in state.message
    # micronet finished, in both attempts of the nightly run...
    ok = _flow_runs("micronet-host-2026-11-20")
    assert len(ok) == 2 and all(r.state.is_completed() for r in ok)
    bad = _flow_runs("broken-host-2026-11-20")
    assert len(bad) == 2 and all(r.state.is_failed() for r in bad)
    # ...but its steps were computed once: the retry took them from the store's cache
    computed = Counter(e["step"] for e in store.events() if e["event"] == "computed")
    # (the nightly's defaults take the fast path: the cpu-layout step blocks micronet's convs);
    # a tuned build whose every task kept its default lowering is the untuned library, byte for
    # byte, and its evaluation is the untuned one's (the same content-keyed artifact)
    result = json.loads(next((store.root / "runs").glob("*.json")).read_text())
    libraries = len({result["untuned"]["build_id"], result["tuned"]["build_id"]})
    expected = {"fetch": 1, "cpu_layout": 1, "extract": 1, "tune": 2, "pick_best": 1, "build": 2, "evaluate": libraries}
    assert computed == expected
    # tonight's measurements and evaluations are in the history, once: the retry's evaluation
    # is the same (cached) evaluate artifact as the first attempt's
    (night,) = history.best_per_night(store.root, "micronet")
    assert night["night"] == "2026-11-20" and night["runs"] == 1
    assert len(history.read(store.root, history.EVALUATIONS)) == libraries  # one row per evaluation artifact
    assert len(history.read(store.root, history.MEASUREMENTS)) == 6  # 2 tasks x 3 trials, not doubled by the retry


def test_a_regressed_night_says_so_and_keeps_the_best_nights_build(night_a, board):
    from vta_pipeline.flows.nightly import pair_configs
    from vta_pipeline.flows.tune_network import tune_network

    _, store = night_a
    first = json.loads(sorted((store.root / "runs").glob("*.json"))[0].read_text())
    # The history remembers a (much) faster night whose build is night A's tuned build.
    legend = dict(
        first,
        run_id="legend",
        night="2026-11-19",
        tuned=dict(first["tuned"], mean_ms=first["tuned"]["mean_ms"] / 100, evaluation_id="legend-t"),
        untuned=dict(first["untuned"], evaluation_id="legend-u"),
    )
    history.record_run(store.root, RunResult.model_validate(legend), [])
    (cfg,) = pair_configs(
        ["micronet"],
        ["host"],
        {
            "tune.trials_per_task": 3,
            "tune.trials_per_batch": 3,
            "tune.session": "2026-11-21",
            "board.tracker": board.tracker,
            "board.key": board.key,
            "store": str(store.root),
            # the evaluations alone decide: the legend's build is night A's, timed in turn it would be
            # even with tonight's (that confirmation: test_history's in-turn tests)
            "guard.confirm_rounds": 0,
        },
        SMALL,
    )
    state = tune_network(cfg.model_dump(mode="json"), return_state=True)
    assert state.is_completed() and state.name == "Regressed"
    assert "REGRESSION" in state.message and "2026-11-19" in state.message
    result = state.result()
    cur = guard.read_current(store.root, "micronet", "host", board.key, result["variant"])
    assert cur["build_id"] == first["tuned"]["build_id"] and cur["night"] == "2026-11-19"
    assert Path(cur["lib"]).read_bytes() == (Path(cur["artifact"]) / "model.so").read_bytes()
    # tonight started from every distinct record night A measured (up to its 3 trials: one whose
    # build failed, or a schedule measured twice, is not a seed) and reports against them
    for t in result["tasks"]:
        seeds, best, _ = history.best_records(
            store.root, t["workload_hash"], first["target_id"], board.key, 32, exclude_session="2026-11-21"
        )
        assert 1 <= t["warm_start"] == len(seeds) <= 3, (t["task"], t["warm_start"], len(seeds))
        assert t["previous_best_ms"] == pytest.approx(best), t["task"]
    # the report: the verdict, and both plots, embedded and in the store
    pngs = store.root / "runs" / result["run_id"]
    for name in ("tuning_curves.png", "latency_per_night.png"):
        assert (pngs / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id]))
        )
    by_key = {a.key: a for a in arts}
    assert {"tuning-progress", "tuning-tasks", "latency", "evaluation"} <= set(by_key)
    report = by_key["evaluation"].data
    assert "REGRESSION" in report and report.count("data:image/png;base64,") == 2
    assert by_key["tuning-progress"].data == 100.0


def test_bad_pairs_fail_before_any_work_naming_the_pair():
    from vta_pipeline.flows.nightly import pair_configs

    with pytest.raises(ConfigError, match=r"pair \(builtin:nosuchnet, host\).*nosuchnet"):
        pair_configs(["builtin:micronet", "builtin:nosuchnet"], ["host"], {}, None)
    with pytest.raises(ConfigError, match=r"pair \(micronet, nosuchtarget\)"):
        pair_configs(["micronet"], ["nosuchtarget"], {}, None)
    with pytest.raises(ConfigError, match=r"tune.trials_per_task"):
        pair_configs(["micronet"], ["host"], {"tune.trials_per_task": 0}, None)
