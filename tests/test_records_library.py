"""The records library: exported from a store's history, the warm start of a store that
never measured a workload, and never trusted for a latency measured elsewhere."""

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from vta_pipeline import steps
from vta_pipeline.boards import BoardSpec
from vta_pipeline.cli.main import app
from vta_pipeline.config import MeasureConfig, TuneConfig
from vta_pipeline.extract import load_tasks
from vta_pipeline.search import records_library
from vta_pipeline.search.trial_log import read_trials
from vta_pipeline.store import history
from vta_pipeline.store.artifacts import ArtifactStore
from vta_pipeline.targets import resolve_target
from vta_pipeline.tune import library_candidates

MEASURE = MeasureConfig(number=2, repeat=1, timeout_s=60)
CPU = {"cpu": "Test CPU 9000", "isa": ["avx2"]}


def _summary(art):
    return json.loads((art.path / "summary.json").read_text())


def _trace(record) -> str:
    """A TuningRecord JSON's trace: what a schedule is, whatever it was timed at."""
    return json.dumps(record[0], sort_keys=True)


@pytest.fixture(scope="module")
def library(micronet, board, host_target, tmp_path_factory):
    """A store that tuned micronet's conv (5 trials, recorded in its history), its library
    (the best 3), and a fresh store that tunes the same conv with that library (4 trials)."""
    _, extracted = micronet
    task = [t for t in load_tasks(extracted.path) if t.op == "conv2d"][0]
    spec = BoardSpec(board.host, board.port, board.key, 2)
    origin = ArtifactStore(tmp_path_factory.mktemp("origin"))
    art = steps.tune_step(
        origin,
        extracted,
        task,
        host_target,
        spec,
        TuneConfig(trials_per_task=5, trials_per_batch=5, records_library="off"),
        MEASURE,
    )
    run = {
        "run_id": "r1",
        "night": "2026-11-20",
        "model": "micronet",
        "target": "host",
        "target_id": host_target.id,
        "board_key": board.key,
    }
    history.record_measurements(origin.root, run, [art.path])
    lib = tmp_path_factory.mktemp("library")
    exported = records_library.export(origin.root, host_target, lib, k=3, cpu_info=CPU, source_commit="abc1234")
    fresh = ArtifactStore(tmp_path_factory.mktemp("fresh"))
    warm = steps.tune_step(
        fresh,
        extracted,
        task,
        host_target,
        spec,
        TuneConfig(trials_per_task=4, trials_per_batch=4, records_library=str(lib)),
        MEASURE,
    )
    return task, origin, art, lib, exported, warm


def test_export_keeps_the_best_distinct_records_of_each_workload_with_their_provenance(library, host_target):
    task, _, art, lib, exported, _ = library
    assert exported["workloads"] == 1 and exported["records"] == 3 and exported["measurements"] == 5
    rows = pq.read_table(lib / records_library.class_file(host_target)).to_pylist()
    assert [r["rank"] for r in rows] == [1, 2, 3]
    assert {r["workload_key"] for r in rows} == {task.workload_hash}
    measured = sorted(t["latency_ms"] for t in read_trials(art.path) if t.get("latency_ms"))
    assert [r["latency_ms"] for r in rows] == pytest.approx(measured[:3])
    assert {(r["cpu"], r["isa"], r["commit"], r["night"], r["measured"]) for r in rows} == {
        ("Test CPU 9000", "avx2", "abc1234", "2026-11-20", 5)
    }
    # the CPU class is the target without its core count
    cls = json.loads(rows[0]["cpu_class"])
    assert "num-cores" not in cls["target"] and cls["target"]["mcpu"] == host_target.target_json["mcpu"]


def test_exporting_the_same_store_again_adds_nothing(library, host_target, tmp_path):
    _, origin, _, lib, _, _ = library
    copy = tmp_path / "lib"
    shutil.copytree(lib, copy)
    again = records_library.export(origin.root, host_target, copy, k=3, cpu_info=CPU, source_commit="def5678")
    assert again["records"] == 3
    before = pq.read_table(lib / records_library.class_file(host_target)).column("record").to_pylist()
    after = pq.read_table(copy / records_library.class_file(host_target)).column("record").to_pylist()
    assert after == before


def test_one_schedule_measured_twice_is_one_library_row(library, host_target, tmp_path):
    """A record holds its run times too: the same trace timed again elsewhere is not a new schedule."""
    _, origin, _, lib, _, _ = library
    path = lib / records_library.class_file(host_target)
    rows = pq.read_table(path).to_pylist()
    faster = json.loads(rows[0]["record"])
    faster[1] = [x / 2 for x in faster[1]]  # the same trace, timed at half the time on another board
    rows[0].update(record=json.dumps(faster), latency_ms=rows[0]["latency_ms"] / 2, commit="fff0000")
    copy = tmp_path / "lib"
    copy.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=records_library.SCHEMA), copy / path.name)
    again = records_library.export(origin.root, host_target, copy, k=3, cpu_info=CPU, source_commit="def5678")
    merged = pq.read_table(copy / path.name).to_pylist()
    assert again["records"] == 3 and len({_trace(json.loads(r["record"])) for r in merged}) == 3
    assert merged[0]["commit"] == "fff0000"  # the faster timing of that schedule is the one kept


def test_a_fresh_store_measures_the_librarys_records_first_on_this_board(library):
    _, _, _, lib, _, warm = library
    s = _summary(warm)
    assert s["warm_start"] == 0 and s["previous_best_ms"] is None  # nothing from this store's history
    assert s["library"]["records"] == 3
    assert (s["library"]["cpu"], s["library"]["commit"]) == ("Test CPU 9000", "abc1234")
    trials = read_trials(warm.path)
    assert len(trials) == 4 and s["trials_this_run"] == 4
    shipped = [json.loads(r) for r in pq.read_table(next(lib.glob("*.parquet"))).column("record").to_pylist()]
    # trials 0-2 are the library's schedules, in its order; 3 is the search's own, a new one
    assert [_trace(t["record"]) for t in trials[:3]] == [_trace(r) for r in shipped]
    assert len({t["schedule_hash"] for t in trials}) == 4


def test_pick_best_holds_only_this_boards_timings(library):
    """A library latency was measured on another machine: the task's best is one of its own."""
    _, _, _, _, _, warm = library
    s = _summary(warm)
    own = [t["latency_ms"] for t in read_trials(warm.path) if t.get("latency_ms")]
    assert s["best_latency_ms"] == pytest.approx(min(own))
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=str(warm.path), allow_missing=False)
    secs = sorted(sum(float(x) for x in r.run_secs) / len(r.run_secs) * 1e3 for r in db.get_all_tuning_records())
    assert secs == pytest.approx(sorted(own))


def test_the_stores_own_history_wins_over_the_library(library, micronet, board, host_target):
    task, origin, _, lib, _, _ = library
    _, extracted = micronet
    spec = BoardSpec(board.host, board.port, board.key, 2)
    art = steps.tune_step(
        origin,
        extracted,
        task,
        host_target,
        spec,
        TuneConfig(trials_per_task=1, trials_per_batch=1, session="n2", records_library=str(lib)),
        MEASURE,
    )
    s = _summary(art)
    # every distinct record the first session measured (up to its 5 trials: one whose build
    # failed, or a schedule measured twice, is not a seed), each seeded as it was measured (one
    # whose parallel extent the search had mutated was once taken for another space's and
    # measured again: test_space_upgrade), and nothing from the library
    own, best, _ = history.best_records(
        origin.root, task.workload_hash, host_target.id, board.key, 32, exclude_session="n2"
    )
    assert 1 <= s["warm_start"] == len(own) <= 5 and s["library"] is None, (s["warm_start"], len(own))
    assert s["previous_best_ms"] == pytest.approx(best)


def test_a_library_answers_only_its_cpu_class(library, host_target):
    task, _, _, lib, _, _ = library
    more_cores = resolve_target(json.dumps(dict(host_target.target_json, **{"num-cores": 64})))
    assert len(records_library.seeds(lib, task.workload_hash, more_cores, 4)[0]) == 3
    other = "skylake" if host_target.target_json["mcpu"] != "skylake" else "znver3"
    elsewhere = resolve_target(json.dumps(dict(host_target.target_json, mcpu=other)))
    assert records_library.seeds(lib, task.workload_hash, elsewhere, 4) == ([], {})
    assert records_library.seeds(lib, "no-such-workload", host_target, 4) == ([], {})
    assert records_library.seeds(None, task.workload_hash, host_target, 4) == ([], {})


def test_a_library_record_that_does_not_replay_is_skipped(library, micronet, tmp_path):
    import tvm

    task, _, _, lib, _, _ = library
    records, note = records_library.seeds(lib, task.workload_hash, resolve_target("host"), 4)
    broken = json.loads(json.dumps(records[0]))
    broken[0][0][0][0] = "NoSuchScheduleInstruction"  # the first instruction's kind
    (tmp_path / "library_seeds.json").write_text(json.dumps({"records": [broken] + records[1:], "provenance": note}))
    _, extracted = micronet
    mod = tvm.ir.load_json((extracted.path / task.file).read_text())
    assert len(library_candidates(tmp_path, mod)) == 2


def test_a_records_library_that_is_not_a_directory_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValidationError, match="library export"):
        TuneConfig(records_library=str(tmp_path / "nope"))
    assert TuneConfig().records_library == "builtin" and records_library.resolve("off") is None


def test_a_torn_library_file_names_itself(tmp_path, host_target):
    (tmp_path / records_library.class_file(host_target)).write_bytes(b"PAR1 torn")
    with pytest.raises(records_library.LibraryError, match=records_library.class_file(host_target)):
        records_library.seeds(tmp_path, "w", host_target, 4)


def test_the_cli_exports_and_shows_a_library(library, tmp_path):
    _, origin, _, _, _, _ = library
    out = tmp_path / "lib"
    r = CliRunner().invoke(app, ["library", "export", "--store", str(origin.root), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["records"] == 4  # the CLI keeps 4 per workload
    r = CliRunner().invoke(app, ["library", "show", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert [(x["model"], x["workloads"], x["records"]) for x in rows] == [("micronet", 1, 4)]
    r = CliRunner().invoke(app, ["library", "export", "--store", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "no history" in r.output
    # compare.py's --store holds the pipeline's store one level down: the error names it
    (tmp_path / "bench" / "pipeline" / "history").mkdir(parents=True)
    r = CliRunner().invoke(app, ["library", "export", "--store", str(tmp_path / "bench")])
    assert r.exit_code == 2 and f"--store {tmp_path / 'bench' / 'pipeline'}" in r.output.replace("\n", ""), r.output


def test_the_shipped_library_reads_and_names_its_provenance():
    """Every file shipped in the package: the schema, a CPU class, records that parse, and
    where they came from."""
    files = sorted(records_library.BUILTIN.glob("*.parquet"))
    t = records_library.read(records_library.BUILTIN)
    assert t.num_rows > 0 and files
    for r in t.to_pylist():
        assert json.loads(r["cpu_class"])["target"]["kind"] == "llvm"
        assert isinstance(json.loads(r["record"]), list) and r["latency_ms"] > 0
        assert r["cpu"] and r["commit"] and r["night"] and 1 <= r["rank"] <= records_library.PER_WORKLOAD


def test_a_cpu_class_the_library_lacks_borrows_records_from_a_class_whose_instruction_sets_it_has():
    """The shipped AMX Xeon's records (LLVM's rocketlake: AVX-512 with VNNI and VBMI) seed a Zen 4
    (those and more) where its own file has none; an AVX2-only Zen 3 gets none of them, and
    rocketlake keeps its own."""
    rows = records_library.read(records_library.BUILTIN).to_pylist()
    rocket = [r for r in rows if json.loads(r["cpu_class"])["target"].get("mcpu") == "rocketlake"]
    assert rocket, "the shipped library has no rocketlake file"
    zen4 = {r["workload_key"] for r in rows if json.loads(r["cpu_class"])["target"].get("mcpu") == "znver4"}
    wk = next(r["workload_key"] for r in rocket if r["workload_key"] not in zen4)  # Zen 4 has none of its own

    def target(mcpu):
        return resolve_target(json.dumps({"kind": "llvm", "mcpu": mcpu, "num-cores": 2}))

    records, note = records_library.seeds(records_library.BUILTIN, wk, target("znver4"), 4)
    assert records and note["borrowed_from"] == "rocketlake"
    assert records_library.seeds(records_library.BUILTIN, wk, target("znver3"), 4) == ([], {})
    own, note = records_library.seeds(records_library.BUILTIN, wk, target("rocketlake"), 4)
    assert own and "borrowed_from" not in note
    assert records_library.compatible_classes(records_library.BUILTIN, target("znver3")) == []
