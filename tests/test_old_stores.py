"""A store written before a change is read after it with nothing recomputed.

`data/store_ea890f9.tgz` is a whole store (its steps, tuning work dirs, events and run results)
of `vta-pipeline run` on micronet, made at commit ea890f9 (before the house was redrawn, issue
55) on a fixed target (AVX2, 2 cores: it runs on every x86 machine CI has). Rerunning the same
command on it, from another directory and another Prefect database, must find every step in
the store: a moved module, a renamed step or a changed key would compute again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from vta_pipeline.search.trial_log import read_trials
from vta_pipeline.store.artifacts import ArtifactStore

FIXTURE = Path(__file__).resolve().parent / "data" / "store_ea890f9.tgz"
TARGET = '{"preset": "host", "target": {"mcpu": "znver3", "num-cores": 2}}'
COMMAND = [
    "run",
    "--model",
    "micronet",
    "--source",
    "builtin",
    "--target",
    TARGET,
    "--trials-per-task",
    "2",
    "--trials-per-batch",
    "2",
    "--eval-repeat",
    "3",
]


def _trials(store: Path) -> dict[str, int]:
    return {str(p.parent.relative_to(store)): len(read_trials(p.parent)) for p in store.glob("work/**/trials.jsonl")}


@pytest.mark.slow
def test_a_store_made_before_the_redraw_is_reused_step_for_step(tmp_path):
    root = tmp_path / "moved" / "store"
    root.mkdir(parents=True)
    with tarfile.open(FIXTURE) as t:
        t.extractall(root, filter="data")
    before, trials = len(ArtifactStore(root).events()), _trials(root)
    assert trials and all(trials.values())
    done = subprocess.run(
        [sys.executable, "-m", "vta_pipeline.cli", *COMMAND, "--store", str(root)],
        env=dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect")),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    steps = [e for e in ArtifactStore(root).events()[before:] if e.get("step")]
    assert {e["step"] for e in steps} >= {"fetch", "extract", "tune", "pick_best", "build", "evaluate"}
    assert [e for e in steps if e["event"] != "reused"] == [], json.dumps(steps, indent=1)
    assert _trials(root) == trials  # nothing measured again
