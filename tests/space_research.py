"""A task tuned in MetaSchedule's generic space, then again as `spaces` dispatches it now: how
the tests of our own spaces check that a store's older search is kept and searched again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tvm

from vta_pipeline import spaces
from vta_pipeline import tune as tuning
from vta_pipeline.boards import BoardSpec
from vta_pipeline.config import MeasureConfig, TuneConfig
from vta_pipeline.search.trial_log import read_state, task_work_dir


def generic_then_current(
    mod, task_name: str, flops: int, workload: str, host_target, board, tmp_path: Path, monkeypatch
) -> tuple[Any, Path]:
    """Tune `mod` 4 trials in the generic space, then with the same budget in its current
    space: (the second search's outcome, the task's work dir)."""
    task_file = tmp_path / f"{workload}.json"
    task_file.write_text(tvm.ir.save_json(mod))
    work = task_work_dir(tmp_path, host_target.id, workload)
    args = (
        task_file,
        task_name,
        flops,
        workload,
        host_target.target_json,
        BoardSpec(board.host, board.port, board.key, 1),
        TuneConfig(trials_per_task=4, trials_per_batch=4),
        MeasureConfig(number=2, repeat=1, timeout_s=60),
        work,
    )
    monkeypatch.setattr(spaces, "design_space", lambda target, wl, failures=None: "post-order-apply")
    monkeypatch.setattr(spaces, "label", lambda target, wl: "metaschedule")
    before = tuning.tune_task(tuning.TaskJob(*args))
    assert read_state(work)["space"] == "metaschedule" and before.trials >= 1
    monkeypatch.undo()
    return tuning.tune_task(tuning.TaskJob(*args)), work  # the same budget, another space: searched again from nothing
