"""Records tuned in version 1 of the packed-conv space (each thread a share of the output
channels) carried into the current one (each thread a band of output rows): their decisions
kept, their structure the current space's, their latencies never trusted
(`vta_pipeline/space_upgrade.py`).

The version-1 records are `data/packed_conv_v1_records.json`: the test network's 1x1 conv (a
record of each of its two design spaces) and its depthwise conv, drawn from the space as it
was at commit c52461d, with their workloads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tvm
from loop_nests import rows_by_thread
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

from vta_pipeline.boards import BoardSpec
from vta_pipeline.config import MeasureConfig, TuneConfig
from vta_pipeline.search.trial_log import read_state, read_trials, write_state
from vta_pipeline.spaces import design_space
from vta_pipeline.spaces import label as space_label
from vta_pipeline.spaces import packed_conv as packed_conv_space
from vta_pipeline.spaces import upgrade as space_upgrade
from vta_pipeline.tir import intrin_registry
from vta_pipeline.tune import LIBRARY_SEEDS, TaskJob, library_candidates, tune_task

FIXTURE = Path(__file__).resolve().parent / "data" / "packed_conv_v1_records.json"
HERE = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}


@pytest.fixture(scope="module")
def v1():
    """{kind: (workload, [record JSON])} of the version-1 records."""
    intrin_registry.load()
    return {
        item["kind"]: (tvm.ir.load_json(item["workload"]), item["records"])
        for item in json.loads(FIXTURE.read_text())["records"]
    }


def _schedule(workload, record_json) -> Schedule:
    rec = ms.database.TuningRecord.from_json(record_json, ms.database.Workload(workload))
    sch = Schedule(workload)
    rec.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch


def _unroll(sch) -> set[str]:
    """The unroll depths the postprocessor put on the kernel's loops (from the sampled one)."""
    return set(re.findall(r'"pragma_auto_unroll_max_step": (\d+)', sch.mod.script()))


def test_a_version_1_record_is_carried_into_row_bands_with_its_decisions(v1):
    target = tvm.target.Target(HERE)
    for kind, (workload, records) in v1.items():
        current, upgraded = space_upgrade.upgrade_records(records, workload, target, design_space(target, workload))
        assert current == [] and len(upgraded) == len(records), kind
        for old_json, new_json in zip(records, upgraded):
            old, new = _schedule(workload, old_json), _schedule(workload, new_json)
            # version 1: both threads wrote every row (each its share of the channels)
            assert rows_by_thread(old.mod) == [(0, 7), (0, 7)], kind
            assert rows_by_thread(new.mod) == [(0, 3), (4, 7)], kind
            # what the search had found stays: the register tile and the unroll depth
            assert packed_conv_space.tile_shape(new) == packed_conv_space.tile_shape(old), kind
            assert _unroll(new) == _unroll(old), kind
            # and the latency it was measured at is carried as provenance, not as a measurement of this nest
            assert new_json[1] == old_json[1]


def test_a_record_of_the_current_space_is_left_as_it_is(v1):
    target = tvm.target.Target(HERE)
    workload, records = v1["float"]
    _, upgraded = space_upgrade.upgrade_records(records, workload, target, design_space(target, workload))
    assert space_upgrade.upgrade_records(upgraded, workload, target, design_space(target, workload)) == (upgraded, [])


def test_a_record_of_another_workloads_space_carries_nothing(v1):
    target = tvm.target.Target(HERE)
    depthwise, _ = v1["depthwise"]
    _, conv_records = v1["float"]
    assert space_upgrade.upgrade_records(conv_records, depthwise, target, design_space(target, depthwise)) == ([], [])


def test_a_depthwise_record_of_version_2_is_carried_into_version_3_with_its_decisions(v1, monkeypatch):
    # version 2's depthwise nest padded the whole input in a parallel pass of its own before the conv
    from loop_nests import parallel_loops

    target = tvm.target.Target(HERE)
    workload, _ = v1["depthwise"]
    monkeypatch.setattr(
        packed_conv_space, "_pad_inside", lambda sch, conv, outer: packed_conv_space._schedule_producers(sch, conv)
    )
    for seed in range(1, 40):  # a draw whose tile the register-limit postprocessor accepts
        ctx = ms.TuneContext(
            mod=workload, target=target, space_generator=design_space(target, workload), task_name="v2", rand_state=seed
        )
        (old,) = ctx.generate_design_space()
        if all(p.apply(old) for p in ctx.space_generator.postprocs):
            break
    monkeypatch.undo()
    assert space_upgrade.upgrades("packed-conv:depthwise:2", space_label(target, workload))

    (trace,) = space_upgrade.upgrade_traces([old.trace], workload, target, design_space(target, workload))
    assert trace is not None and trace is not old.trace
    new = Schedule(workload)
    trace.apply_to_schedule(new, remove_postproc=False)
    assert (parallel_loops(old.mod), parallel_loops(new.mod)) == (2, 1)
    assert packed_conv_space.tile_shape(new) == packed_conv_space.tile_shape(old) and _unroll(new) == _unroll(old)


def _parallel_extents(trace) -> list[int]:
    return [
        inputs[1]
        for kind, inputs, attrs, _ in trace.as_json(remove_postproc=True)[0]
        if kind == "Annotate" and attrs[0] == "meta_schedule.parallel"
    ]


def test_a_record_whose_parallel_extent_the_search_mutated_is_seeded_as_it_was(micronet, tmp_path):
    """The evolutionary search rewrites a generic space's parallel extent in place (MutateParallel):
    such a record is still of its space. Taken for another space's, it was forced onto the first
    space trace, lost its compute location and extent, and was measured again as a new schedule."""
    from tvm.s_tir.meta_schedule import _ffi_api

    from vta_pipeline.extract import load_tasks
    from vta_pipeline.search.database import open_database, plain_json, seed_database

    _, extracted = micronet
    task = next(t for t in load_tasks(extracted.path) if t.op == "conv2d")
    workload = tvm.ir.load_json((extracted.path / task.file).read_text())
    target = tvm.target.Target(HERE)
    assert space_label(target, workload) == "metaschedule" and not space_upgrade.versioned("metaschedule")
    ctx = ms.TuneContext(
        mod=workload, target=target, space_generator=design_space(target, workload), task_name="mutated", rand_state=7
    )
    mutate = ms.mutator.MutateParallel(max_jobs_per_core=16)
    mutate._initialize_with_tune_context(ctx)
    records = []
    for space in ctx.generate_design_space():
        mutated = mutate.apply(space.trace)
        assert _parallel_extents(mutated) != _parallel_extents(space.trace)
        sch = Schedule(workload)
        mutated.apply_to_schedule(sch, remove_postproc=True)
        sch.enter_postproc()
        assert all(p.apply(sch) for p in ctx.space_generator.postprocs)
        rec = ms.database.TuningRecord(
            sch.trace,
            ms.database.Workload(workload),
            [1e-4],
            target,
            ms.arg_info.ArgInfo.from_prim_func(workload["main"]),
        )
        records.append(plain_json(_ffi_api.TuningRecordAsJSON(rec)))
    assert len(records) >= 2
    space = design_space(target, workload)
    assert space_upgrade.upgrade_records(records, workload, target, space) == (records, [])
    # a warm start seeds every one of them, each with its own decisions
    db = open_database(tmp_path)
    assert seed_database(db, workload, records) == len(records)
    seeded = [plain_json(_ffi_api.TuningRecordAsJSON(r))[0] for r in db.get_all_tuning_records()]
    assert sorted(map(json.dumps, seeded)) == sorted(json.dumps(r[0]) for r in records)


def _searched_in_v1(work_dir: Path, workload, records: list, label: str) -> dict[str, bytes]:
    """A work dir as version 1 left it: the records in its database (the second the faster),
    a trial log, a re-time, a finished state labelled with the old space. Returns its files."""
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    wl = db.commit_workload(workload)
    for i, js in enumerate(records):
        rec = ms.database.TuningRecord.from_json(js, wl)
        db.commit_tuning_record(ms.database.TuningRecord(rec.trace, wl, [2e-4 - i * 1e-4], rec.target, rec.args_info))
    (work_dir / "trials.jsonl").write_text('{"trial": 0}\n{"trial": 1}\n')
    (work_dir / "retimed.json").write_text('{"records": 2}')
    (work_dir / "default.json").write_text('{"ms": 1.0}')
    write_state(work_dir, status="finished", task="t", budget=2, done=2, stopped="budget", space=label)
    return {p.name: p.read_bytes() for p in work_dir.iterdir() if p.is_file()}


def test_a_work_dir_searched_in_version_1_is_kept_and_its_best_records_are_measured_first(v1, tmp_path):
    target = tvm.target.Target(HERE)
    workload, records = v1["float"]
    before = _searched_in_v1(tmp_path, workload, records, "packed-conv:float")
    assert space_upgrade.upgrades("packed-conv:float", space_label(target, workload))
    space = design_space(target, workload)
    note = space_upgrade.upgrade_work_dir(tmp_path, workload, target, "packed-conv:float", space, LIBRARY_SEEDS)
    assert note == {"from": "packed-conv:float", "archive": "space-packed-conv_float", "records": 2, "upgraded": 2}
    # every file of the old search is kept, byte for byte; the default lowering's latency stays
    archive = tmp_path / note["archive"]
    assert {n: (archive / n).read_bytes() for n in before if n != "default.json"} == {
        n: b for n, b in before.items() if n != "default.json"
    }
    assert (tmp_path / "default.json").read_bytes() == before["default.json"]
    # the work dir starts the current space: no records, no trials, no state; its best records staged
    assert not (tmp_path / "database_tuning_record.json").exists() and not (tmp_path / "trials.jsonl").exists()
    assert read_state(tmp_path) == {}
    staged = json.loads((tmp_path / LIBRARY_SEEDS).read_text())
    assert staged["provenance"] == {"space_upgrade": note}
    assert [r[1] for r in staged["records"]] == [[1e-4], [2e-4]]  # the fastest first
    candidates = library_candidates(tmp_path, workload)
    assert len(candidates) == 2 and all(rows_by_thread(c.sch.mod) == [(0, 3), (4, 7)] for c in candidates)
    # a kill before the state was removed: the next run does it again, from the archive
    (tmp_path / LIBRARY_SEEDS).unlink()
    write_state(tmp_path, status="finished", space="packed-conv:float")
    again = space_upgrade.upgrade_work_dir(
        tmp_path, workload, target, "packed-conv:float", design_space(target, workload), LIBRARY_SEEDS
    )
    assert again == note
    assert json.loads((tmp_path / LIBRARY_SEEDS).read_text()) == staged


def test_a_task_tuned_in_version_1_searches_again_from_its_carried_records(v1, board, host_target, tmp_path):
    """The tuning step does the upgrade itself when a work dir's state names an older space: it
    measures the carried records first on the board, then searches its budget in the current space."""
    workload, records = v1["float"]
    task_file = tmp_path / "task.json"
    task_file.write_text(tvm.ir.save_json(workload))
    work = tmp_path / "work"
    work.mkdir()
    _searched_in_v1(work, workload, records, "packed-conv:float")
    spec = BoardSpec(board.host, board.port, board.key, 2)
    out = tune_task(
        TaskJob(
            task_file,
            "conv",
            1e6,
            "h",
            host_target.target_json,
            spec,
            TuneConfig(trials_per_task=3, trials_per_batch=3, retime_top=0),
            MeasureConfig(number=2, repeat=1),
            work,
        )
    )
    trials = read_trials(work)
    assert len(trials) == 3 and out.trials == 3
    staged = [json.dumps(r[0], sort_keys=True) for r in json.loads((work / LIBRARY_SEEDS).read_text())["records"]]
    assert [json.dumps(t["record"][0], sort_keys=True) for t in trials[:2]] == staged  # measured first
    target = tvm.target.Target(host_target.target_json)
    assert read_state(work)["space"] == space_label(target, workload) != "packed-conv:float"
    assert (work / "space-packed-conv_float" / "database_tuning_record.json").exists()


def test_a_search_killed_while_tuning_is_judged_by_its_best_record(v1, tmp_path):
    """Before c6da5e7 a state was labelled with its space only once the search finished: a work
    dir killed mid-search says nothing, so its best record tells which space it was in."""
    from vta_pipeline.tune import _searched_in

    target = tvm.target.Target(HERE)
    workload, records = v1["float"]
    label = space_label(target, workload)
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    _searched_in_v1(old, workload, records, "-")
    _, upgraded = space_upgrade.upgrade_records(records, workload, target, design_space(target, workload))
    _searched_in_v1(new, workload, upgraded, "-")
    for work in (old, new):
        write_state(work, status="tuning", task="t", budget=2, done=1, valid=1)  # no label
    assert _searched_in(old, workload, target, label) is None and space_upgrade.upgrades(None, label)
    assert _searched_in(new, workload, target, label) == label
    assert _searched_in(tmp_path / "fresh", workload, target, label) == label
