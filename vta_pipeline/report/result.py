"""A run's result, typed: what the run measured, written as one JSON file in the store.

`runs/<run-id>.json` is read back by `vta-pipeline report`, the history (rows recorded
before the variant column find their variant there) and the benchmarks, and results written
by older versions must still read: every field added after the first has a default, and
the parts that are other steps' own records (an evaluation's meta, a task's tuning summary,
the baseline, the guard's verdict) keep the keys their step writes (`extra="allow"`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from .. import cpu_layout
from ..config import PipelineConfig
from ..pick_best import keeps_default
from ..search.rounds import TuningRounds
from ..search.work_dir import WorkDir
from ..store import history, variant
from ..store.artifacts import ArtifactStore, atomic_write_text
from ..targets import ResolvedTarget
from .vta import vta_result

log = logging.getLogger(__name__)


class Evaluation(BaseModel):
    """One build run on the board: latency, and its output against the reference."""

    model_config = ConfigDict(extra="allow")

    mean_ms: float
    median_ms: float | None = None
    std_ms: float | None = None
    correct: bool = False
    cosine: float | None = None
    max_abs_err: float | None = None
    threads: int | None = None
    board_name: str | None = None
    tvm: str | None = None
    emulated: str | None = None  # the board was emulated (boards.emulator): what emulated it
    vs_float: dict[str, Any] | None = None
    vta_ms: float | None = None
    cpu_ms: float | None = None
    evaluation_id: str | None = None
    build_id: str | None = None


class TaskResult(BaseModel):
    """One tuning task of the run: its tune step's summary under this run's task name."""

    model_config = ConfigDict(extra="allow")

    task: str
    trials: int = 0
    trials_this_run: int = 0
    errors: int = 0
    best_latency_ms: float | None = None
    best_gflops: float | None = None
    default_ms: float | None = None
    flops: float | None = None
    curve: list[Any] | None = None  # [trials, best ms so far] pairs
    stopped: str | None = None
    weight: int = 1
    workload: list[Any] | None = None
    tuned_as: str | None = None
    warm_start: int | None = None
    reached_previous_best_at: int | None = None
    previous_best_ms: float | None = None
    library: dict[str, Any] | None = None

    @property
    def keeps_default(self) -> bool:
        return keeps_default(self.model_dump())


class RunResult(BaseModel):
    """The result of one run of the `tune_network` flow."""

    model_config = ConfigDict(extra="allow")

    run_id: str
    finished: float = 0.0
    seconds: float | None = None
    model: str | None = None
    source: str | None = None
    target: str | None = None
    board_key: str | None = None
    config: dict[str, Any] = {}
    variant: str | None = None
    untuned: Evaluation | None = None
    tuned: Evaluation | None = None
    speedup: float | None = None
    tasks: list[TaskResult] = []
    night: str | None = None
    session: str | None = None
    target_id: str | None = None
    baseline: dict[str, Any] | None = None
    opt: str | None = None
    recipe: dict[str, Any] | None = None
    vta: dict[str, Any] | None = None
    transforms: dict[str, Any] | None = None
    guard: dict[str, Any] | None = None
    history: dict[str, int] | None = None

    @property
    def emulated(self) -> str | None:
        """What emulated the board the network ran on (boards.emulator), None on a real board:
        an emulated run's timings are qemu's, shown as such and never guarded or exported."""
        return next((e.emulated for e in (self.tuned, self.untuned) if e is not None and e.emulated), None)

    @property
    def of_variant(self) -> str:
        """The run's variant: recorded in it since the variant existed, else from its config."""
        return self.variant or variant.of(self.config)

    @property
    def trials(self) -> int:
        return sum(t.trials for t in self.tasks)

    def headline(self) -> str:
        """The run in one line, for the log."""
        return (
            f"{self.model}: untuned {self.untuned.mean_ms:.3f} ms, tuned {self.tuned.mean_ms:.3f} ms "
            f"({self.speedup:.2f}x), output check {'passed' if self.tuned.correct else 'FAILED'}; "
            "tables in the run's artifacts"
            + (f"; EMULATED board ({self.emulated}): the times are qemu's" if self.emulated else "")
        )

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def save(self, store: ArtifactStore) -> Path:
        p = store.root / "runs" / f"{self.run_id}.json"
        atomic_write_text(p, json.dumps(self.to_json(), indent=1))
        return p


def task_results(
    tasks: list[Any], refs: dict[str, Any], first_refs: dict[str, Any], summary: Callable[[Any], dict[str, Any]]
) -> list[TaskResult]:
    """Each task's tuning summary for a run's result, under this run's task name and weight.

    `refs` / `first_refs`: each task's tuning outcome (by this run's task name) after all
    rounds / after the first; `summary` reads an outcome's summary. Tuning outcomes are
    stored by workload, so a cached one may come from another network, or another version
    of this one, that named the same workload differently (one store named a classifier
    `fused_matmul_add201` in its int8 run and `fused_matmul_add2` in its fp32 run): the run
    reports it under its own name, and keeps the other as `tuned_as`. A task tuned in both
    rounds counts both rounds' trials as this run's."""
    out = []
    for t in tasks:
        s = dict(summary(refs[t.name]))
        if s.get("task") != t.name:
            s["tuned_as"] = s.get("task")
        s["task"] = t.name
        if refs[t.name] != first_refs[t.name]:
            s["trials_this_run"] += summary(first_refs[t.name])["trials_this_run"]
        s.update(weight=t.weight, workload=t.workload)
        out.append(TaskResult.model_validate(s))
    return out


def new_result(
    run_id: str,
    config: dict[str, Any],
    fetched_meta: dict[str, Any],
    tasks: list[TaskResult],
    untuned: dict[str, Any],
    tuned: dict[str, Any],
    seconds: float,
    **more: Any,
) -> RunResult:
    """A finished run's result: the two evaluations (step metas) and the tasks' summaries,
    with `more` (night, baseline, recipe, ...) as given."""
    u, t = Evaluation.model_validate(untuned), Evaluation.model_validate(tuned)
    return RunResult(
        run_id=run_id,
        finished=time.time(),
        seconds=round(seconds, 1),
        model=fetched_meta.get("model"),
        source=fetched_meta.get("source"),
        target=config.get("target"),
        board_key=config.get("board", {}).get("key"),
        config=config,
        variant=variant.of(config),
        untuned=u,
        tuned=t,
        speedup=u.mean_ms / t.mean_ms if t.mean_ms else None,
        tasks=tasks,
        **more,
    )


def tune_summary(store: ArtifactStore, ref: dict[str, str]) -> dict[str, Any]:
    """The summary a tune step's artifact holds (`WorkDir.SUMMARY`)."""
    return json.loads((store.step_dir("tune", ref["key"]) / WorkDir.SUMMARY).read_text())


def from_steps(
    store: ArtifactStore,
    cfg: PipelineConfig,
    target: ResolvedTarget,
    *,
    run_id: str,
    started: float,
    fetched: dict[str, str],
    tasks: list[Any],
    rounds: TuningRounds,
    untuned: tuple[dict[str, str], dict[str, str]],
    tuned: tuple[dict[str, str], dict[str, str]],
    baseline: dict[str, Any] | None,
    transforms: list[dict[str, str]] = (),
    vta_refs: list[dict[str, str]] = (),
) -> RunResult:
    """The run's result from its steps' artifacts: the fetch, each tuning task's outcome
    (after all rounds and after the first), each (evaluation, build) pair, the transforms
    between fetch and extract, and the VTA tasks' knob tunings."""
    evals = {}
    for label, (ev, lib) in (("untuned", untuned), ("tuned", tuned)):
        evals[label] = dict(store.meta_of(ev), evaluation_id=ev["artifact_id"], build_id=lib["artifact_id"])
    result = new_result(
        run_id,
        cfg.model_dump(mode="json"),
        store.meta_of(fetched),
        task_results(tasks, rounds.refs, rounds.first_refs, lambda ref: tune_summary(store, ref)),
        evals["untuned"],
        evals["tuned"],
        time.time() - started,
        night=cfg.tune.session or history.night_of(started),
        session=cfg.tune.session,
        target_id=target.id,
        baseline=baseline,
        opt=cfg.opt,
        recipe=cpu_layout.recipe(cfg, target).to_dict(),
    )
    if vta_refs:
        result.vta = vta_result([store.meta_of(r) for r in vta_refs], evals["untuned"], evals["tuned"], cfg.vta)
    if transforms:  # int8 / packed: what the transform steps did
        result.transforms = {ref["step"]: store.meta_of(ref) for ref in transforms}
    return result


def save_result(store: ArtifactStore, result: RunResult) -> Path:
    return result.save(store)


def load_results(store: ArtifactStore) -> list[RunResult]:
    """Every run result in the store, oldest first; one that does not read is named and left out."""
    out = []
    for p in sorted((store.root / "runs").glob("*.json")):
        try:
            out.append(RunResult.model_validate_json(p.read_text()))
        except ValueError as e:  # torn or edited: named, the other runs listed
            log.warning("run result %s does not read (%s): left out of the report", p, str(e)[:160])
            continue
    return sorted(out, key=lambda r: r.finished)
