"""Records tuned in an older version of a design space, carried into the current one.

MetaSchedule replays a record's trace instruction by instruction, and its evolutionary
search only mutates the decisions of the traces it starts from. So when a space's loop
structure changes (the packed-conv space's version 2: each thread a band of output rows,
where version 1 split the output channels between threads), every record tuned before the
change keeps building the old structure, and a search warm-started from such records keeps
searching it. The search cannot leave it on its own: what version 2 fixes is what the
*next* kernel pays to read this one's output from another core's cache, which a kernel
measured alone never shows.

What carries over is the decisions: the space still samples the same knobs in the same
order (output-channel tile, register rows, register width, unroll). `upgrade_traces`
replays a record's decisions through the current space, each mapped onto the knob's
current choices where its loop changed (a band holds half the rows: a register tile of 2
rows stays 2 where the band's rows allow it). A latency measured on the old structure says
little about the new one, so an upgraded record is never trusted with it: it is measured on
the board first, as the records library's records are (`tune.library_candidates`).

`upgrade_work_dir` does this for a task whose work dir was searched in an older version:
its files are copied into `space-<old label>/` (nothing is thrown away), its best records
upgraded and staged to be measured first, and the task searches the current space from
there with its whole budget.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
from pathlib import Path
from typing import Any

from ..search.work_dir import WorkDir
from ..store.artifacts import atomic_write_text

log = logging.getLogger(__name__)

KNOBS = ("SamplePerfectTile", "SampleCategorical")
# An annotation whose value the search mutates (MetaSchedule's MutateParallel rewrites the
# value operand, not a decision): a choice like a knob's, never the structure.
MUTATED_ANNOTATIONS = ("meta_schedule.parallel",)
KEEP = 8  # a work dir's best records carried into the current space (as many as a re-time compares)
# the files of a task's search in one space; `lock` and `default.json` (the default lowering's
# latency: no space's) stay
SEARCH_FILES = (
    WorkDir.RECORDS,
    WorkDir.WORKLOADS,
    "database_tuning_record.json.corrupt",
    "database_workload.json.corrupt",
    "database_tuning_record.json.unreplayable",
    WorkDir.TRIALS,
    WorkDir.RETIMED,
    WorkDir.WARM_START,
    WorkDir.LIBRARY_SEEDS,
    WorkDir.STATE,
)
ARCHIVED = "ARCHIVED"  # written into an archive once every file is in it


def upgrades(old_label: str | None, new_label: str) -> bool:
    """Whether a work dir searched in the space `old_label` (`spaces.label`; None: from
    before labels) is carried into `new_label`: another version of the packed-conv or Winograd
    space, or the dense or pool space where MetaSchedule's generic space (or an older one of it)
    searched before. Either way the old search is kept, and its records that line up are measured first."""
    if old_label == new_label:
        return False
    if new_label.startswith("packed-conv"):
        return old_label is None or old_label.startswith("packed-conv")
    if new_label.startswith("dense"):
        return old_label is None or old_label == "metaschedule" or old_label.startswith("dense")
    if new_label.startswith("pool"):
        return old_label is None or old_label == "metaschedule" or old_label.startswith("pool")
    if new_label.startswith("winograd"):
        return old_label is not None and old_label.startswith("winograd")
    return False


def versioned(label: str) -> bool:
    """Whether the space `label` (`spaces.label`) has versions to carry records between.
    MetaSchedule's generic space has none: a record of it that does not line up with a space
    trace is not of an older version, and forcing it onto one (all its spaces sample the same
    kinds of knobs) would only lose its other decisions."""
    return label != "metaschedule"


def structure(trace) -> str:
    """What a trace builds, whatever it sampled: its instructions before the postprocessors,
    dead ones dropped (a database keeps its records' traces simplified so), with their operands
    (the order of a reorder or a fuse is the structure) and attributes, but not the choices a
    sampling instruction offers, nor its decisions. Nor the value of an annotation the search
    mutates: the evolutionary search rewrites a generic space's parallel extent in place, and
    a record so mutated is still of its space (taken for another, it was "upgraded" onto the
    first space's trace, its compute location and parallel extent lost, and measured again)."""
    from ..search.database import plain_json

    insts, _ = plain_json(trace.simplified(remove_postproc=True).as_json(remove_postproc=True))
    return json.dumps(
        [
            [kind, _unmutated(kind, inputs, attrs), [] if kind in KNOBS else attrs, outputs]
            for kind, inputs, attrs, outputs in insts
        ]
    )


def _unmutated(kind: str, inputs: list, attrs: list) -> list:
    """An instruction's operands with a mutated annotation's value left out."""
    if kind == "Annotate" and attrs and attrs[0] in MUTATED_ANNOTATIONS:
        return inputs[:1]
    return inputs


def _knobs(trace) -> list[tuple[Any, Any]]:
    """(instruction, decision) of each sampling instruction before the postprocessors."""
    out = []
    for inst in trace.insts:
        if inst.kind.name == "EnterPostproc":
            break
        if inst.kind.name in KNOBS:
            out.append((inst, trace.decisions[inst]))
    return out


def _mapped(new_inst, new_decision, old_inst, old_decision) -> Any:
    """The old decision on the new knob: a perfect tile keeps its innermost factor where it
    divides the loop (else the largest that does), a categorical choice its value where it is
    still a choice (else the largest choice below it)."""
    if new_inst.kind.name == "SamplePerfectTile":
        extent = math.prod(int(f) for f in new_decision)
        old = [int(f) for f in old_decision]
        if len(old) != 2:
            if math.prod(old) != extent:
                raise ValueError(f"a {len(old)}-level tile of {math.prod(old)} on a loop of {extent}")
            return old
        inner = max(1, min(old[1], extent))
        while extent % inner:
            inner -= 1
        return [extent // inner, inner]
    old_choices = [int(c) for c in old_inst.attrs[0]]
    new_choices = [int(c) for c in new_inst.attrs[0]]
    value = old_choices[int(old_decision)]
    below = [i for i, c in enumerate(new_choices) if c <= value] or [0]
    return max(below, key=lambda i: new_choices[i])


def _replay(space_trace, knobs: list[tuple[Any, Any]]):
    """The current space's trace with `knobs`' decisions, or None when the two spaces do not
    sample the same knobs in the same order."""
    new_knobs = _knobs(space_trace)
    if [i.kind.name for i, _ in new_knobs] != [i.kind.name for i, _ in knobs]:
        return None
    trace = space_trace
    for (new_inst, new_decision), (old_inst, old_decision) in zip(new_knobs, knobs):
        trace = trace.with_decision(
            new_inst, _mapped(new_inst, new_decision, old_inst, old_decision), remove_postproc=True
        )
    return trace


def upgrade_traces(traces: list, workload_mod, target, space) -> list:
    """Each trace in the task's current space (`space`: its generator, `spaces.design_space`): the trace itself where
    its structure is one of the current space's, its decisions replayed through the current
    space where only the structure changed, None where its knobs do not line up with any of
    the current space's (another space: nothing to carry over)."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    ctx = ms.TuneContext(
        mod=workload_mod, target=target, space_generator=space, task_name="space-upgrade", rand_state=1
    )
    spaces = [s.trace for s in ctx.generate_design_space()]
    current = {structure(t) for t in spaces}
    out = []
    for trace in traces:
        if structure(trace) in current:
            out.append(trace)
            continue
        knobs = _knobs(trace)
        upgraded = None
        for space_trace in spaces:
            try:
                replayed = _replay(space_trace, knobs)
                if replayed is None:
                    continue
                sch = Schedule(workload_mod)
                replayed.apply_to_schedule(sch, remove_postproc=True)
                sch.enter_postproc()
                if all(p.apply(sch) for p in ctx.space_generator.postprocs):
                    upgraded = sch.trace
                    break
            except Exception as e:  # noqa: BLE001 - a decision the new loop cannot take: try the next space
                log.debug("space upgrade: a record does not replay in a space (%s)", str(e).splitlines()[0][:200])
        out.append(upgraded)
    return out


def upgrade_records(records_json: list[Any], workload_mod, target, space) -> tuple[list[Any], list[Any]]:
    """TuningRecord JSON (the records library's, earlier sessions', a work dir's) split by the
    task's current space (`space`: its generator): (the records already in it, as given; the records carried into it,
    `upgrade_traces`). Records of no version of it are dropped. An upgraded record keeps its
    latency as provenance only: a caller measures it again."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import _ffi_api

    from ..search.database import plain_json

    workload = ms.database.Workload(workload_mod)
    parsed = []
    for js in records_json:
        try:
            parsed.append((js, ms.database.TuningRecord.from_json(js, workload)))
        except Exception as e:  # noqa: BLE001 - one that no longer parses carries nothing over
            log.info("space upgrade: skipped a record that does not parse (%s)", str(e).splitlines()[0][:200])
    given = [rec.trace for _, rec in parsed]  # one wrapper each: `upgrade_traces` returns a current one as given
    current, upgraded = [], []
    for (js, rec), old, trace in zip(parsed, given, upgrade_traces(given, workload_mod, target, space)):
        if trace is old:
            current.append(js)
        elif trace is not None:  # its arguments as the new nest lays out the weights (RewriteLayout)
            sch = Schedule(workload_mod)
            trace.apply_to_schedule(sch, remove_postproc=False)
            args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
            rec = ms.database.TuningRecord(trace, workload, rec.run_secs, rec.target, args)
            upgraded.append(plain_json(_ffi_api.TuningRecordAsJSON(rec)))
    return current, upgraded


def best_records(path: Path, keep: int) -> list[Any]:
    """The `keep` fastest measured records of a task database's record file, as TuningRecord
    JSON, read without replaying the others (a database opened replays every trace)."""
    from ..search.trial_log import FAILED, mean_secs

    if not Path(path).exists():
        return []
    measured = []
    for line in Path(path).read_text().splitlines():
        try:
            _, record = json.loads(line)
            secs = mean_secs(record[1] or [])
        except (ValueError, TypeError, IndexError):
            continue  # a torn line: `search.database.repair_database` keeps it aside
        if secs < FAILED:
            measured.append((secs, record))
    return [record for _, record in sorted(measured, key=lambda m: m[0])[:keep]]


def archive_name(label: str | None) -> str:
    """The directory a work dir's search in the space `label` is kept in."""
    return "space-" + re.sub(r"[^A-Za-z0-9.-]+", "_", label or "unlabelled")


def upgrade_work_dir(
    work_dir: Path, workload_mod, target, old_label: str | None, space, seeds_file: str, keep: int = KEEP
) -> dict[str, Any]:
    """Carry a task's work dir searched in the space `old_label` into the current space:
    every file of that search copied into `space-<old label>/`, the `keep` best records
    upgraded into `space` (`upgrade_records`) and staged to be measured first (`seeds_file`:
    `tune.LIBRARY_SEEDS`),
    the search files removed, the state last. A kill at any point leaves the old search's
    files whole in the archive or in place, and the next run does it again from the archive.
    Returns the note kept in `warm_start.json`."""
    work_dir = Path(work_dir)
    archive = work_dir / archive_name(old_label)
    if not (archive / ARCHIVED).exists():
        archive.mkdir(exist_ok=True)
        for name in SEARCH_FILES:
            if (work_dir / name).exists():
                shutil.copy2(work_dir / name, archive / name)
        (archive / ARCHIVED).write_text(json.dumps({"space": old_label}))
    current, upgraded = upgrade_records(best_records(archive / WorkDir.RECORDS, keep), workload_mod, target, space)
    staged = current + upgraded
    note = {"from": old_label, "archive": archive.name, "records": len(staged), "upgraded": len(upgraded)}
    for name in SEARCH_FILES:
        if name != WorkDir.STATE:
            (work_dir / name).unlink(missing_ok=True)
    atomic_write_text(work_dir / seeds_file, json.dumps({"records": staged, "provenance": {"space_upgrade": note}}))
    atomic_write_text(work_dir / WorkDir.WARM_START, json.dumps({"seeded": 0, "space_upgrade": note}))
    (work_dir / WorkDir.STATE).unlink(missing_ok=True)
    return note
