"""Steps 4-7 through the store: pick best, build, upload + evaluate on a board; cache keys."""

import pytest

from vta_pipeline import steps
from vta_pipeline.boards import BoardSpec
from vta_pipeline.config import EvalConfig, MeasureConfig, ModelConfig, TuneConfig
from vta_pipeline.errors import BoardError
from vta_pipeline.extract import load_tasks
from vta_pipeline.spaces import dense as dense_space


@pytest.fixture(scope="module")
def tuned(micronet, board, host_target, session_store):
    _, extracted = micronet
    spec = BoardSpec(board.host, board.port, board.key, 2)
    cfg = TuneConfig(trials_per_task=4, trials_per_batch=4)
    arts = [
        steps.tune_step(session_store, extracted, t, host_target, spec, cfg, MeasureConfig(number=2))
        for t in load_tasks(extracted.path)
        if t.op == "conv2d"
    ]
    return arts


def test_pick_best_build_and_evaluate_on_the_board(micronet, tuned, board, host_target, session_store):
    fetched, extracted = micronet
    best = steps.pick_best_step(session_store, tuned, host_target)
    # one record per task, except tasks whose default lowering measured faster than tuning
    assert best.meta["records"] + len(best.meta["default_kept"]) == len(tuned) == 2
    lib_tuned = steps.build_step(session_store, extracted, best, host_target)
    lib_untuned = steps.build_step(session_store, extracted, None, host_target)
    assert lib_tuned.meta["scheduled_functions"] >= best.meta["records"]
    assert lib_untuned.meta["scheduled_functions"] == 0
    assert (lib_tuned.id != lib_untuned.id) == (best.meta["records"] > 0)
    ev_cfg = EvalConfig(repeat=3)
    ev = steps.evaluate_step(
        session_store, lib_tuned, fetched, host_target, (board.host, board.port), board.key, ev_cfg
    )
    assert ev.meta["correct"] and ev.meta["cosine"] > 0.9999 and len(ev.meta["repeats"]) == 3
    assert ev.meta["mean_ms"] > 0 and ev.meta["board"].startswith(board.key)


def test_a_slow_build_is_timed_within_the_evaluation_time_budget(micronet, tuned, board, host_target, session_store):
    """A build slower than max_seconds / repeat per run is timed fewer times, never fewer than 3."""
    fetched, extracted = micronet
    lib = steps.build_step(session_store, extracted, None, host_target)
    tight = steps.evaluate_step(
        session_store,
        lib,
        fetched,
        host_target,
        (board.host, board.port),
        board.key,
        EvalConfig(repeat=50, max_seconds=1e-6),
    )
    roomy = steps.evaluate_step(
        session_store,
        lib,
        fetched,
        host_target,
        (board.host, board.port),
        board.key,
        EvalConfig(repeat=5, max_seconds=60),
    )
    assert len(tight.meta["repeats"]) == 3 and len(roomy.meta["repeats"]) == 5
    assert tight.meta["correct"] and roomy.meta["correct"]


def test_evaluate_on_a_key_without_boards_fails_fast_and_names_the_key(
    micronet, tuned, board, host_target, session_store
):
    fetched, extracted = micronet
    lib = steps.build_step(session_store, extracted, None, host_target)
    with pytest.raises(BoardError, match="no board is registered under key 'nobody'"):
        steps.evaluate_step(session_store, lib, fetched, host_target, (board.host, board.port), "nobody", EvalConfig())
    assert not session_store.find("evaluate") or all(
        a.meta["board"].startswith(board.key) for a in session_store.find("evaluate")
    )


def test_cache_keys_follow_content_and_config(session_store, micronet, host_target, monkeypatch):
    fetched, extracted = micronet
    base = ModelConfig(source="builtin", name="micronet")
    assert steps.fetch_key(session_store, base) == fetched.key
    assert steps.fetch_key(session_store, base.model_copy(update={"seed": 1})) != fetched.key
    task = load_tasks(extracted.path)[0]
    m = MeasureConfig()
    k = steps.tune_key(session_store, task, host_target, TuneConfig(trials_per_task=4), m, "k")
    assert k != steps.tune_key(session_store, task, host_target, TuneConfig(trials_per_task=5), m, "k")
    assert k != steps.tune_key(session_store, task, host_target, TuneConfig(trials_per_task=4), m, "pynq")
    assert k == steps.tune_key(session_store, task, host_target, TuneConfig(trials_per_task=4), m, "k")
    # a new version of one of our design spaces: the cached result no longer stands (its task searches again)
    monkeypatch.setattr(dense_space, "VERSION", dense_space.VERSION + 1)
    assert k != steps.tune_key(session_store, task, host_target, TuneConfig(trials_per_task=4), m, "k")
    # extraction depends on the imported model's content id, not on how it was named
    assert steps.extract_key(session_store, fetched.id, host_target) == extracted.key


def test_a_cached_tuning_named_by_another_network_is_reported_under_this_runs_name(micronet, tuned, session_store):
    """Tuning outcomes are stored by workload: another network (or another version of this
    one) that has the same workload under another name finds them cached. Its run reports
    them under its own task names and weights; a task tuned in two rounds counts both."""
    import dataclasses
    import json

    from vta_pipeline.report import task_results

    _, extracted = micronet
    tasks = [t for t in load_tasks(extracted.path) if t.op == "conv2d"]
    elsewhere = [dataclasses.replace(t, name=f"fused_elsewhere{i}", weight=3) for i, t in enumerate(tasks)]
    refs = {t.name: a.ref() for t, a in zip(elsewhere, tuned)}

    def summary(ref):
        return json.loads((session_store.root / "steps" / "tune" / ref["key"] / "summary.json").read_text())

    rows = task_results(elsewhere, refs, dict(refs), summary)
    assert [r.task for r in rows] == ["fused_elsewhere0", "fused_elsewhere1"]
    assert [r.tuned_as for r in rows] == [t.name for t in tasks]
    own = [summary(a.ref())["trials_this_run"] for a in tuned]
    assert [r.weight for r in rows] == [3, 3] and [r.trials_this_run for r in rows] == own
    # the first task tuned again in a second round: its trials this run are both rounds'
    first = {**refs, "fused_elsewhere0": tuned[1].ref()}
    assert task_results(elsewhere, refs, first, summary)[0].trials_this_run == own[0] + own[1]
    own_refs = {t.name: a.ref() for t, a in zip(tasks, tuned)}
    assert task_results(tasks, own_refs, dict(own_refs), summary)[0].tuned_as is None
