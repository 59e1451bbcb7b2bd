"""The artifact store: computed once, reused after, never trusted when tampered with."""

import threading

import pytest

from vta_pipeline.store.artifacts import ArtifactStore, CachePolicy


def _writer(calls, text="hello"):
    def compute(out):
        calls.append(1)
        (out / "a.txt").write_text(text)
        return {"n": len(calls)}

    return compute


def test_second_produce_reuses_without_computing(store):
    calls = []
    a = store.produce("s", "k1", _writer(calls))
    b = store.produce("s", "k1", _writer(calls))
    assert len(calls) == 1 and a.id == b.id and b.file("a.txt").read_text() == "hello"
    assert [e["event"] for e in store.events()] == ["started", "computed", "reused"]


def test_edited_artifact_is_quarantined_and_recomputed(store):
    calls = []
    a = store.produce("s", "k1", _writer(calls))
    a.file("a.txt").write_text("tampered")
    b = store.produce("s", "k1", _writer(calls))
    assert len(calls) == 2 and b.file("a.txt").read_text() == "hello"
    assert any(e["event"] == "quarantined" for e in store.events())
    assert list((store.root / "quarantine").iterdir())


def test_deleted_artifact_file_is_recomputed(store):
    calls = []
    a = store.produce("s", "k1", _writer(calls))
    a.file("a.txt").unlink()
    assert store.lookup("s", "k1") is None
    store.produce("s", "k1", _writer(calls))
    assert len(calls) == 2


def test_a_failing_step_leaves_nothing_that_looks_finished(store):
    def boom(out):
        (out / "half.txt").write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        store.produce("s", "k1", boom)
    assert store.lookup("s", "k1") is None
    assert not list((store.root / "steps" / "s" / ".tmp").iterdir())


def test_artifact_id_depends_on_content_only(store):
    a = store.produce("s", "k1", _writer([], "same"))
    b = store.produce("s", "k2", _writer([], "same"))
    c = store.produce("s", "k3", _writer([], "other"))
    assert a.id == b.id != c.id


def test_an_artifact_is_found_by_its_content_id_and_verified(store):
    """find_id: what `find` + a match on the id gave (the newest of equal contents), without
    hashing the step's other artifacts; a tampered match is quarantined, not returned."""
    store.produce("s", "k1", _writer([], "same"))
    newer = store.produce("s", "k2", _writer([], "same"))
    other = store.produce("s", "k3", _writer([], "other"))
    assert store.find_id("s", other.id).key == "k3"
    assert store.find_id("s", newer.id).key == newer.key == "k2"  # the newer of two equal contents, as find's order
    assert store.find_id("s", "no-such-id") is None and store.find_id("no-such-step", other.id) is None
    other.file("a.txt").write_text("tampered")
    assert store.find_id("s", other.id) is None
    assert any(e["event"] == "quarantined" and e.get("key") == "k3" for e in store.events())


def test_two_concurrent_producers_compute_once(store):
    calls = []

    def slow(out):
        import time

        calls.append(1)
        time.sleep(0.5)
        (out / "a.txt").write_text("x")

    threads = [threading.Thread(target=store.produce, args=("s", "k", slow)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1


def test_cache_policies(tmp_path):
    calls = []
    ArtifactStore(tmp_path).produce("s", "k", _writer(calls))
    ArtifactStore(tmp_path, CachePolicy.REDO).produce("s", "k", _writer(calls))
    assert len(calls) == 2
    with pytest.raises(FileNotFoundError, match="readonly"):
        ArtifactStore(tmp_path, CachePolicy.READONLY).produce("s", "other", _writer(calls))


def test_a_cached_result_record_that_would_run_code_when_read_is_removed_unread(prefect_harness, tmp_path, caplog):
    """Prefect honours the serializer a record names: a record edited to say "pickle" ran its
    payload when the next run read it. The cache key function vets the record first."""
    import base64
    import json
    import pickle
    from pathlib import Path

    from prefect import flow

    from vta_pipeline.tasks.common import results_dir
    from vta_pipeline.tasks.model import fetch_model

    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    @flow
    def fetch_twice(root: str):
        fetch = fetch_model.with_options(result_storage=results_dir(root))  # as the flows do
        return fetch(root, {"source": "builtin", "name": "micronet", "input_shape": [1, 3, 16, 16]})

    root = str(tmp_path / "store")
    first = fetch_twice(root)
    (record,) = [p for p in results_dir(root).iterdir() if p.name.startswith("fetch-")]
    rec = json.loads(record.read_text())
    assert rec["metadata"]["serializer"]["type"] == "json"  # what the tasks write: JSON refs
    rec["metadata"]["serializer"] = {"type": "pickle", "picklelib": "pickle", "picklelib_version": None}
    rec["result"] = base64.encodebytes(pickle.dumps(Payload())).decode()
    record.write_text(json.dumps(rec))
    import logging

    logging.getLogger("vta_pipeline").addHandler(caplog.handler)  # it may not propagate under Prefect
    try:
        again = fetch_twice(root)
    finally:
        logging.getLogger("vta_pipeline").removeHandler(caplog.handler)
    assert not marker.exists()
    assert again == first  # the step's verified artifact, from the store
    assert "removed unread" in caplog.text and str(record) in caplog.text
    assert json.loads(record.read_text())["metadata"]["serializer"]["type"] == "json"  # written anew


@pytest.mark.parametrize(
    "name", ["state.json", "default.json", "retimed.json", "warm_start.json", "library_seeds.json"]
)
def test_a_torn_work_dir_note_is_set_aside_with_a_warning_and_derived_again(tmp_path, caplog, name):
    """What a power cut or a full disk can leave of a tuning work dir's notes: each reader takes it
    for absent (the trial log and the board give it again), names it, and keeps it for a look."""
    from vta_pipeline.search import retime, trial_log
    from vta_pipeline.store.artifacts import read_json

    work = tmp_path / "work"
    work.mkdir()
    (work / name).write_text('{"status": "tuni')  # torn mid-write
    with caplog.at_level("WARNING"):
        if name == "state.json":
            assert trial_log.read_state(work) == {}
        elif name == "default.json":
            assert trial_log.read_default_ms(work) is None
        elif name == "retimed.json":
            assert retime.current(work) is None
        else:  # what tuning's and the task database's readers of these two call
            assert read_json(work / name, {}) == {}
    assert not (work / name).exists() and (work / f"{name}.corrupt").read_text() == '{"status": "tuni'
    assert name in caplog.text and "does not parse" in caplog.text


def test_an_event_after_a_torn_events_log_lands_on_a_line_of_its_own(tmp_path):
    """The run_started after a power cut used to be glued onto the torn line and lost with it:
    the next run then never marked that run Crashed, and its computed steps went uncounted."""
    store = ArtifactStore(tmp_path / "store")
    store.log_event("computed", step="fetch")
    with open(store.root / "events.jsonl", "a") as f:
        f.write('{"t": 1.0, "event": "comp')  # torn mid-write
    store.log_event("run_started", flow_run_id="r1")
    store.log_event("computed", step="extract")
    assert [e["event"] for e in store.events()] == ["computed", "run_started", "computed"]


def test_a_torn_workload_file_is_repaired_keeping_every_record_it_can_still_name(tmp_path):
    """A torn last line of database_workload.json: it is set aside, the whole workloads kept,
    and so are the records of those workloads; records naming the lost one go aside too."""
    from vta_pipeline.search.database import repair_database

    work = tmp_path / "work"
    work.mkdir()
    (work / "database_workload.json").write_text('["111", "AAAA"]\n["222", "BB')
    (work / "database_tuning_record.json").write_text('[0, [["trace"], [1e-3]]]\n[1, [["trace"], [2e-3]]]\n')
    msgs = repair_database(work)
    assert len(msgs) == 2 and "database_workload.json" in msgs[0] and "kept 1" in msgs[0]
    assert (work / "database_workload.json").read_text() == '["111", "AAAA"]\n'
    assert (work / "database_tuning_record.json").read_text() == '[0, [["trace"], [1e-3]]]\n'
    assert (work / "database_workload.json.corrupt").read_text() == '["222", "BB\n'
    assert (work / "database_tuning_record.json.corrupt").read_text() == '[1, [["trace"], [2e-3]]]\n'


def test_report_names_a_torn_run_result_and_lists_the_others(tmp_path, caplog):
    from vta_pipeline.report import RunResult, load_results

    store = ArtifactStore(tmp_path / "store")
    RunResult(run_id="good", finished=1.0).save(store)
    (store.root / "runs" / "torn.json").write_text('{"run_id": "to')
    with caplog.at_level("WARNING"):
        assert [r.run_id for r in load_results(store)] == ["good"]
    assert "torn.json" in caplog.text
