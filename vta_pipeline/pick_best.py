"""Step 4, pick best: one database with the best record per workload.

Each tuning task keeps its own MetaSchedule JSON database; the build reads one merged,
pruned database. MetaSchedule's lookup ignores the target, so a merged database is only
ever built from tasks of one target (the step key includes it).

A task whose best tuned schedule is not faster than its default lowering (measured on the
same board while tuning) contributes no record: the build then keeps the default for it,
so tuning never makes a network slower than the untuned build. A task whose best records
were re-timed in turn after its search (`retime`) contributes the fastest of that re-time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .search import retime
from .search.database import open_database
from .search.work_dir import WorkDir

STEP = "pick_best"
VERSION = 3  # 3: a task's re-timed winner (retime.py) in place of its recorded best


def open_db(path: Path):
    """A database that must exist (a task's, or pick best's merged one), intrinsics registered."""
    return open_database(path, allow_missing=False)


def pick_best(tune_dirs: list[Path], out_dir: Path) -> dict[str, Any]:
    """Merge the per-task databases in `tune_dirs` into `out_dir`, best record per workload
    (the re-timed winner where the task has one)."""
    from tvm.s_tir import meta_schedule as ms

    merged = open_database(out_dir)
    summary = []
    for d in tune_dirs:
        s = json.loads((Path(d) / WorkDir.SUMMARY).read_text())
        s["uses"] = "default" if keeps_default(s) else "tuned"
        if s["uses"] == "tuned":
            db = open_db(d)
            winner = retime.winner_record(Path(d), db)
            if winner is None:
                db.dump_pruned(merged)  # keeps the best valid record of each workload
            else:  # the fastest of the task's best records re-timed in turn
                merged.commit_tuning_record(
                    ms.database.TuningRecord(
                        winner.trace,
                        merged.commit_workload(winner.workload.mod),
                        winner.run_secs,
                        winner.target,
                        winner.args_info,
                    )
                )
        summary.append(s)
    (out_dir / "best.json").write_text(json.dumps(summary, indent=1))
    return {
        "tasks": len(summary),
        "records": len(merged.get_all_tuning_records()),
        "trials": sum(s["trials"] for s in summary),
        "default_kept": [s["task"] for s in summary if s["uses"] == "default"],
    }


def keeps_default(summary: dict[str, Any]) -> bool:
    """True when the task's default lowering measured at least as fast as its best schedule."""
    best, default = summary.get("best_latency_ms"), summary.get("default_ms")
    return best is not None and default is not None and best >= default
