"""Steps 4-7 through the store: pick best, build, upload + evaluate on a board; cache keys."""

import pytest

from vta_pipeline import steps
from vta_pipeline.config import EvalConfig, MeasureConfig, ModelConfig, TuneConfig
from vta_pipeline.errors import BoardError
from vta_pipeline.extract import load_tasks
from vta_pipeline.boards import BoardSpec


@pytest.fixture(scope="module")
def tuned(micronet, board, host_target, session_store):
    _, extracted = micronet
    spec = BoardSpec(board.host, board.port, board.key, 2)
    cfg = TuneConfig(trials_per_task=4, trials_per_batch=4)
    arts = [
        steps.tune_step(session_store, extracted, t, host_target, spec, cfg, MeasureConfig(number=2))
        for t in load_tasks(extracted.path) if t.op == "conv2d"
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
    ev = steps.evaluate_step(session_store, lib_tuned, fetched, host_target, (board.host, board.port), board.key, ev_cfg)
    assert ev.meta["correct"] and ev.meta["cosine"] > 0.9999 and len(ev.meta["repeats"]) == 3
    assert ev.meta["mean_ms"] > 0 and ev.meta["board"].startswith(board.key)


def test_a_slow_build_is_timed_within_the_evaluation_time_budget(micronet, tuned, board, host_target, session_store):
    """A build slower than max_seconds / repeat per run is timed fewer times, never fewer than 3."""
    fetched, extracted = micronet
    lib = steps.build_step(session_store, extracted, None, host_target)
    tight = steps.evaluate_step(session_store, lib, fetched, host_target, (board.host, board.port), board.key,
                                EvalConfig(repeat=50, max_seconds=1e-6))
    roomy = steps.evaluate_step(session_store, lib, fetched, host_target, (board.host, board.port), board.key,
                                EvalConfig(repeat=5, max_seconds=60))
    assert len(tight.meta["repeats"]) == 3 and len(roomy.meta["repeats"]) == 5
    assert tight.meta["correct"] and roomy.meta["correct"]


def test_evaluate_on_a_key_without_boards_fails_fast_and_names_the_key(micronet, tuned, board, host_target, session_store):
    fetched, extracted = micronet
    lib = steps.build_step(session_store, extracted, None, host_target)
    with pytest.raises(BoardError, match="no board is registered under key 'nobody'"):
        steps.evaluate_step(session_store, lib, fetched, host_target, (board.host, board.port), "nobody", EvalConfig())
    assert not session_store.find("evaluate") or all(a.meta["board"].startswith(board.key) for a in session_store.find("evaluate"))


def test_cache_keys_follow_content_and_config(session_store, micronet, host_target):
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
    # extraction depends on the imported model's content id, not on how it was named
    assert steps.extract_key(session_store, fetched.id, host_target) == extracted.key
