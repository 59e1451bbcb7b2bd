"""Workload keys: one key per TIR workload whatever graph it came from, and stores written
under the old (JSON text) keys keep every record when they are migrated."""

import hashlib
import json
import shutil

import pytest

from vta_pipeline import steps
from vta_pipeline.boards import BoardSpec
from vta_pipeline.config import MeasureConfig, ModelConfig, PackConfig, PipelineConfig, QuantizeConfig, TuneConfig
from vta_pipeline.extract import load_tasks
from vta_pipeline.search.trial_log import read_trials
from vta_pipeline.store import history, workload_keys
from vta_pipeline.tune import TaskJob, tune_task

MEASURE = MeasureConfig(number=2, repeat=1, timeout_s=60)


def test_the_float_classifier_of_the_fp32_and_int8_graphs_is_one_workload(session_store, host_target):
    """The int8 graph keeps its classifier in float: the same TIR as in the fp32 graph, but its
    module's JSON text differs (the old key): it used to be tuned once per graph. (The float
    stem conv was the example until 050ae31 fused the int8 graph's quantize into it.)"""
    model = ModelConfig(source="builtin", name="tinynet")
    fp32 = steps.extract_step(
        session_store, steps.prepare_model(session_store, PipelineConfig(model=model)), host_target
    )
    int8_cfg = PipelineConfig(
        model=model,
        quantize=QuantizeConfig(enabled=True),
        pack=PackConfig(enabled=True, layout="x86", start_name="nn.conv2d", start_name_idx=1),
    )
    int8 = steps.extract_step(session_store, steps.prepare_model(session_store, int8_cfg), host_target)

    def classifier(art):
        (t,) = [t for t in load_tasks(art.path) if t.name.startswith("fused_matmul")]
        return t, (art.path / t.file).read_bytes()

    (a, a_json), (b, b_json) = classifier(fp32), classifier(int8)
    assert hashlib.sha256(a_json).digest() != hashlib.sha256(b_json).digest()  # what the old key hashed
    assert a.workload_hash == b.workload_hash
    keys = [t.workload_hash for t in load_tasks(int8.path)]
    assert len(set(keys)) == len(keys)  # distinct workloads of one graph keep distinct keys


@pytest.fixture(scope="module")
def legacy_store(micronet, board, host_target, tmp_path_factory):
    """A store as the old version left it: one conv tuned (4 trials) under an old key A and
    recorded in the history, and the same workload's dir again under key B (the other graph)."""
    _, extracted = micronet
    task = [t for t in load_tasks(extracted.path) if t.op == "conv2d"][0]
    root = tmp_path_factory.mktemp("legacy")
    scope = root / "work" / "tune" / f"{host_target.id}-{board.key}"
    old_a, old_b = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"
    out = tune_task(
        TaskJob(
            extracted.path / task.file,
            task.name,
            task.flops,
            old_a,
            host_target.target_json,
            BoardSpec(board.host, board.port, board.key, 2),
            TuneConfig(trials_per_task=4, trials_per_batch=4),
            MEASURE,
            scope / old_a,
        )
    )
    shutil.copytree(scope / old_a, scope / old_b)
    run = {
        "run_id": "r0",
        "night": "2026-11-20",
        "model": "micronet",
        "target": "host",
        "target_id": host_target.id,
        "board_key": board.key,
    }
    art = root / "tune-artifact"
    shutil.copytree(scope / old_a, art)
    (art / "summary.json").write_text(json.dumps(out.to_dict()))
    assert history.record_measurements(root, run, [art]) == 4
    workload_keys._migrated.clear()
    moves = workload_keys.migrate(root / "work")
    return task, root, scope, run, moves, (old_a, old_b)


def test_old_work_dirs_are_renamed_and_merged_under_the_structural_key(legacy_store):
    task, root, scope, _, moves, (old_a, old_b) = legacy_store
    key = task.workload_hash
    assert [(m["old"], m["new"], m["how"].split()[0]) for m in moves] == [
        (old_a, key, "renamed"),
        (old_b, key, "merged"),
    ]
    assert sorted(p.name for p in scope.iterdir()) == [key]
    assert (root / "work" / "tune" / workload_keys.MERGED / scope.name / old_b / "trials.jsonl").exists()
    rows = read_trials(scope / key)
    assert [r["trial"] for r in rows] == list(range(8))
    assert [(r["measured_key"], r["measured_trial"]) for r in rows] == [(old_a, i) for i in range(4)] + [
        (old_b, i) for i in range(4)
    ]
    records = (scope / key / "database_tuning_record.json").read_text().splitlines()
    assert len(records) == 8 and all(r.startswith("[0,") for r in records)
    assert workload_keys.aliases(root) == {old_a: key, old_b: key}
    workload_keys._migrated.clear()
    assert workload_keys.migrate(root / "work") == []  # done once


def test_the_migrated_dir_resumes_and_the_history_finds_what_the_old_key_recorded(
    legacy_store, micronet, board, host_target
):
    task, root, scope, run, _, _ = legacy_store
    _, extracted = micronet
    out = tune_task(
        TaskJob(
            extracted.path / task.file,
            task.name,
            task.flops,
            task.workload_hash,
            host_target.target_json,
            BoardSpec(board.host, board.port, board.key, 2),
            TuneConfig(trials_per_task=8, trials_per_batch=4),
            MEASURE,
            scope / task.workload_hash,
        )
    )
    assert out.trials_this_run == 0 and out.trials == 8  # nothing measured again
    seeds, best, _ = history.best_records(root, task.workload_hash, host_target.id, board.key, k=8)
    assert len(seeds) == 4 and best == min(r["latency_ms"] for r in read_trials(scope / task.workload_hash))
    # Recording the migrated dir adds only the rows the history did not have (B's), not A's again.
    art = root / "tune-artifact-2"
    shutil.copytree(scope / task.workload_hash, art)
    (art / "summary.json").write_text(json.dumps(out.to_dict()))
    assert history.record_measurements(root, dict(run, run_id="r1"), [art]) == 4
    (best_row,) = history.best_per_workload(root)
    assert best_row["workload_key"] == task.workload_hash and best_row["measurements"] == 8
