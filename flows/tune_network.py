"""Flow `tune_network`: fetch -> extract -> build + upload + evaluate untuned -> tune (one
task run per task) -> pick best -> build + upload + evaluate tuned, then the result table.
The untuned network runs on the board before any tuning, so a network that cannot build or
run fails in minutes, not after the budget.

The int8 steps (quantize, graph pack) slot in between fetch and extract: each takes the
previous network artifact's ref and returns a new one, which extract consumes.

After the evaluation the run goes through the regression guard (tonight vs the model's best
night; the better build stays current) and appends its measurements and evaluations to the
store's Parquet history. What a person sees in the Prefect UI: one task run per tuning task
named after the task, a progress artifact for the run's trials, the per-task table, and a
markdown report with the tuning curves and the latency per night as pictures.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from prefect import flow
from prefect.futures import wait
from prefect.logging import get_run_logger
from prefect.runtime import flow_run
from prefect.states import Completed

from vta_pipeline import cpu_layout, report, steps
from vta_pipeline.boards.session import open_session
from vta_pipeline.config import PipelineConfig
from vta_pipeline.extract import load_tasks, select_tasks
from vta_pipeline.fetch import check_model
from vta_pipeline.search.rounds import TuningRounds
from vta_pipeline.store import gc as store_gc
from vta_pipeline.store.artifacts import ArtifactStore, CachePolicy
from vta_pipeline.targets import resolve_target
from vta_pipeline.tasks import crashed_runs
from vta_pipeline.tasks.artifacts import TrialProgress, publish
from vta_pipeline.tasks.common import results_dir, retry_settings
from vta_pipeline.tasks.deploy import build, compare_runtime, evaluate
from vta_pipeline.tasks.history import record_history, regression_guard
from vta_pipeline.tasks.model import extract_tasks, fetch_model, layout_model, pack_model, quantize_model
from vta_pipeline.tasks.tune import pick_best, tune_task, tune_vta_task
from vta_pipeline.vta import tasks as vta_tasks_mod

# Prefect forwards the loggers named in PREFECT_LOGGING_EXTRA_LOGGERS to the run's logs (the
# deployment names "vta_pipeline,tvm", the CLI "vta_pipeline"), but only records at or above
# each logger's own level, which defaults to WARNING: make those loggers INFO.
for _name in filter(None, (n.strip() for n in os.environ.get("PREFECT_LOGGING_EXTRA_LOGGERS", "").split(","))):
    if logging.getLogger(_name).level in (logging.NOTSET, logging.WARNING):
        logging.getLogger(_name).setLevel(logging.INFO)


@flow(name="tune_network", log_prints=True)
def tune_network(config: dict[str, Any], cache: str = "on", stop_after: str | None = None) -> dict[str, Any]:
    """Tune a network on the boards behind a tracker; returns the run's result as JSON
    (`report.RunResult`, as the store keeps it), so a deployment's caller needs no import.

    `config` is a PipelineConfig as JSON. Without a tracker in it, a local board (tracker +
    rpc servers on 127.0.0.1) is started for the run. `stop_after` ("extract", "tune",
    "build") ends the run early, for inspection.
    """
    logger = get_run_logger()
    t0 = time.time()
    target = resolve_target(PipelineConfig.model_validate(config).target)  # a bad target fails here, before any work
    cfg = steps.with_defaults(PipelineConfig.model_validate(config), target)
    steps.check_target(cfg, target)
    steps.check_local_board(cfg, target)
    check_model(cfg.model)
    store_gc.check_free_space(cfg.store, cfg.min_free_gib)
    store = ArtifactStore(cfg.store, CachePolicy(cache))
    run_id = str(flow_run.get_id() or f"local-{int(t0)}")
    try:  # runs of this store that a killed process left "Running" in the UI
        crashed_runs.mark_dead_runs_crashed(store, f"flow run {run_id} on the same store", logger)
    except Exception as e:  # never worth failing tonight's run over
        logger.warning("could not check the store's earlier flow runs for dead ones: %s", e)
    crashed_runs.record_start(store, run_id)
    ended = "Failed"
    try:
        result = _tune_network(cfg, target, store, cache, stop_after, logger, t0, run_id)
        ended = "Completed"
        return result
    finally:
        try:
            crashed_runs.record_end(store, run_id, ended)
        except OSError as e:  # a full disk: the run's own error (raised on) says what to do
            logger.warning(
                "could not record the end of run %s in the store's events (%s): the next run marks it Crashed",
                run_id,
                e,
            )


def _tune_network(
    cfg: PipelineConfig,
    target,
    store: ArtifactStore,
    cache: str,
    stop_after: str | None,
    logger,
    t0: float,
    run_id: str,
):
    """The flow's body, between the run's start and end records in the store."""
    root = str(store.root)
    res = {"result_storage": results_dir(root)}
    retry = retry_settings()  # read per run, so a deployment can change it without a redeploy
    fetch_model_, quantize_, pack_, layout_, extract_tasks_, pick_best_, build_ = (
        t.with_options(**res)
        for t in (fetch_model, quantize_model, pack_model, layout_model, extract_tasks, pick_best, build)
    )
    tune_task_, tune_vta_, evaluate_ = (t.with_options(**res, **retry) for t in (tune_task, tune_vta_task, evaluate))
    key = cfg.board.key

    with open_session(cfg, target, store.root / "logs", logger) as session:
        target, tracker = session.target, session.tracker
        tspec = target.spec  # what every task resolves: the preset plus what was read off the board

        # the network: fetched, then (int8) quantized, graph packed or laid out for the CPU
        fetched = fetch_model_(root, cfg.model.model_dump(mode="json"), cache)
        model, transforms = fetched, []
        if cfg.quantize.enabled:
            model = quantize_(root, model, cfg.quantize.model_dump(mode="json"), cfg.model.seed, cache)
            transforms.append(model)
        if cfg.pack.enabled:
            model = pack_(root, model, cfg.pack.model_dump(mode="json"), cfg.vta.model_dump(mode="json"), cache)
            transforms.append(model)
        recipe = cpu_layout.recipe(cfg, target)
        logger.info("optimization %s on %s: %s", cfg.opt, target.name, recipe.describe(cfg.pack.enabled))
        if recipe.blocked:
            model = layout_(root, model, cpu_layout.layout_config(recipe, target.target_json), cache)
            transforms.append(model)

        # its tuning tasks: TIR tasks for MetaSchedule, knob tasks for the convs VTA runs
        offload = steps.offload_config(cfg, target)
        vta = offload.model_dump(mode="json") if offload is not None else None
        extracted = extract_tasks_(root, model, tspec, cache, vta)
        vta_tasks = vta_tasks_mod.load_tasks(extracted["path"]) if vta else []
        if vta:
            logger.info(vta_tasks_mod.describe(vta_tasks, store.meta_of(extracted).get("cpu_packed_convs", 0)))
        tasks = select_tasks(
            load_tasks(extracted["path"]), cfg.tune.task_filter, packed_float=steps.wholly_on_cpu(cfg, target)
        )
        logger.info("%d tuning task(s): %s", len(tasks), ", ".join(t.name for t in tasks))
        if stop_after == "extract":
            return {"tasks": [t.to_dict() for t in tasks]}

        # The untuned network is built and run on the board before any tuning: a network that
        # cannot build, or a board that cannot run it or computes it wrong, fails the run in
        # minutes instead of after the whole tuning budget.
        ev_cfg = cfg.evaluate.model_dump(mode="json")
        untuned_lib = build_(root, extracted, None, tspec, "untuned", cache)
        ev_untuned = evaluate_(root, untuned_lib, model, tspec, tracker, key, ev_cfg, "untuned", cache)

        # One task run per tuning task, at most one per board in flight; a task alone measures
        # on several boards at once when there are more boards than tasks.
        rounds = TuningRounds(tasks, cfg.tune.trials_per_task, cfg.tune.allocation, in_flight=session.boards)
        board = session.board_spec(rounds.in_flight)
        work_dirs = {t.name: steps.tune_work_dir(store, t, target, key, cfg.tune.session) for t in tasks}
        total = cfg.tune.trials_per_task * len(tasks)
        trials = TrialProgress(work_dirs, rounds.budgets, total, f"tuning trials of {cfg.model.display_name}")
        measure_cfg = cfg.measure.model_dump(mode="json")

        def submit(t, budget: int):
            tune_cfg = cfg.tune.model_copy(update={"trials_per_task": budget}).model_dump(mode="json")
            return tune_task_.submit(root, extracted, t.to_dict(), tspec, board, tune_cfg, measure_cfg, cache)

        refs = rounds.run(
            submit,
            lambda running, timeout: wait(running, timeout=timeout).not_done,
            lambda ref: report.tune_summary(store, ref),
            on_poll=trials.update,
        )
        if rounds.steered:
            logger.info(rounds.describe_second_round())
        trials.update(final=True)
        tune_cfg = cfg.tune.model_dump(mode="json")  # the VTA tasks' knobs, on the same boards
        vta_refs = [
            f.result()
            for f in [tune_vta_.submit(root, t.to_dict(), vta, tracker, key, tune_cfg, cache) for t in vta_tasks]
        ]
        best = pick_best_(root, [refs[t.name] for t in tasks], tspec, cache)
        if stop_after == "tune":
            return {"best": best}

        tuned_lib = build_(root, extracted, best, tspec, "tuned", cache, vta_refs or None)
        if stop_after == "build":
            return {"untuned": untuned_lib, "tuned": tuned_lib}
        ev_tuned = evaluate_(root, tuned_lib, model, tspec, tracker, key, ev_cfg, "tuned", cache)
        baseline = compare_runtime.with_options(**retry)(
            root, cfg.model_dump(mode="json"), tspec, tuned_lib, fetched, tracker, key, session.threads, cache
        )

        # the result, and its guard, while the local board is up: the guard may time builds on it
        result = report.from_steps(
            store,
            cfg,
            target,
            run_id=run_id,
            started=t0,
            fetched=fetched,
            tasks=tasks,
            rounds=rounds,
            untuned=(ev_untuned, untuned_lib),
            tuned=(ev_tuned, tuned_lib),
            baseline=baseline,
            transforms=transforms,
            vta_refs=vta_refs,
        )
        for line in report.vta_lines(result.vta) if result.vta else []:
            logger.info(line)
        if result.tuned.correct:
            guard_cfg = cfg.guard.model_dump(mode="json")
            result.guard = regression_guard(
                root, result, guard_cfg, tspec, tracker, key, model, cfg.evaluate.min_repeat_ms
            )
    tune_dirs = [str(store.step_dir("tune", refs[t.name]["key"])) for t in tasks]
    result.history = record_history(root, result, tune_dirs)
    result.save(store)
    publish(result, store.root)
    logger.info(result.headline())
    if not result.tuned.correct:
        raise RuntimeError(
            f"the tuned build's output differs from the reference (max abs error "
            f"{result.tuned.max_abs_err:.3e}); the build is kept in the store for inspection"
        )
    if result.guard["regressed"]:
        logger.warning(result.guard["message"])
        return Completed(name="Regressed", message=result.guard["message"], data=result.to_json())
    return result.to_json()
