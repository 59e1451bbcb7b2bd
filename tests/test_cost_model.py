"""The cost model is shared by a target's tasks and learns from every record in the store.

Before it, each task (and each resumed round of a task) started a fresh XGBoost model that
scored candidates at random until 100 measurements: at a night's budgets it never learned.
"""

import shutil

import numpy as np
import pytest

from vta_pipeline.boards import BoardSpec
from vta_pipeline.config import MeasureConfig, TuneConfig
from vta_pipeline.extract import load_tasks
from vta_pipeline.search import cost_model
from vta_pipeline.search.trial_log import read_trials, task_work_dir
from vta_pipeline.tune import TaskJob, tune_task

MEASURE = MeasureConfig(number=2, repeat=1, timeout_s=60)


@pytest.fixture(scope="module")
def _tuned(micronet, board, host_target, tmp_path_factory):
    """Two conv tasks of micronet tuned (8 trials each) into one scope, once for this module:
    tuning is what costs here (each test gets its own copy: `tuned_scope`)."""
    _, extracted = micronet
    convs = [t for t in load_tasks(extracted.path) if t.op == "conv2d"][:2]
    root = tmp_path_factory.mktemp("scope")
    works = []
    for t in convs:
        work = task_work_dir(root, host_target.id, t.workload_hash)
        tune_task(
            TaskJob(
                extracted.path / t.file,
                t.name,
                t.flops,
                t.workload_hash,
                host_target.target_json,
                BoardSpec(board.host, board.port, board.key, 2),
                TuneConfig(trials_per_task=8, trials_per_batch=4),
                MEASURE,
                work,
            )
        )
        works.append(work)
    return root, extracted, convs, works


@pytest.fixture
def tuned_scope(_tuned, tmp_path):
    """A copy of the tuned scope (a test may tune on into it), read by a process whose models
    are forgotten, as if the next night's process started."""
    root, extracted, convs, works = _tuned
    shutil.copytree(root, tmp_path / "scope")
    cost_model.reset()
    yield extracted, convs, [tmp_path / "scope" / w.relative_to(root) for w in works]
    cost_model.reset()


def _target(host_target):
    import tvm

    return tvm.target.Target(host_target.target_json)


def _candidates(extracted, task, host_target, n=16):
    import tvm
    from tvm.s_tir import meta_schedule as ms

    ctx = ms.TuneContext(
        mod=tvm.ir.load_json((extracted.path / task.file).read_text()),
        target=_target(host_target),
        space_generator="post-order-apply",
        search_strategy="replay-trace",
        task_name=task.name,
        rand_state=7,
        num_threads=1,
    )
    ctx.pre_tuning(max_trials=n, num_trials_per_iter=n, design_spaces=ctx.generate_design_space())
    return ctx, list(ctx.search_strategy.generate_measure_candidates())


def test_a_new_process_learns_from_the_records_of_every_task_in_the_store(tuned_scope, host_target, monkeypatch):
    extracted, convs, works = tuned_scope
    target = _target(host_target)
    on_disk = sum(1 for w in works for r in read_trials(w) if r["latency_ms"] is not None)
    assert on_disk == 16
    monkeypatch.setattr(cost_model, "WARMUP_SAMPLES", on_disk)  # the store's records are just enough

    third = works[0].parent / "not-tuned-yet"  # a task this store has never tuned
    third.mkdir()
    with cost_model.lease(third, target) as model:
        assert cost_model.samples(third, target) == on_disk
        ctx, cands = _candidates(extracted, convs[0], host_target)
        a, b = model.predict(ctx, cands), model.predict(ctx, cands)
    # A trained model scores, a warming-up one draws random numbers: the same candidates
    # get the same scores, and not all the same score.
    np.testing.assert_array_equal(a, b)
    assert len(set(np.round(a, 6))) > 1


def test_leasing_again_and_resumed_rounds_do_not_count_records_twice(tuned_scope, micronet, board, host_target):
    extracted, convs, works = tuned_scope
    target = _target(host_target)
    with cost_model.lease(works[0], target):
        first = cost_model.samples(works[0], target)
    with cost_model.lease(works[1], target):
        assert cost_model.samples(works[1], target) == first == 16  # nothing new on disk

    # Tuning on: the round's 4 measurements reach the model once (through MetaSchedule's
    # update), not again from the records the round wrote.
    t = convs[0]
    out = tune_task(
        TaskJob(
            extracted.path / t.file,
            t.name,
            t.flops,
            t.workload_hash,
            host_target.target_json,
            BoardSpec(board.host, board.port, board.key, 2),
            TuneConfig(trials_per_task=12, trials_per_batch=4),
            MEASURE,
            works[0],
        )
    )
    assert out.trials_this_run == 4
    with cost_model.lease(works[0], target):
        assert cost_model.samples(works[0], target) == 16 + 4
