"""A tuning task's own record on disk: its append-only trial log and its explicit state.

Every task has a work dir in the store (`work/tune/<target-id>/<workload-hash>[@session]/`).
Beside MetaSchedule's JSON database it holds what is ours, in the spirit of lorien's job
log: `trials.jsonl`, one line per measurement in the order it was taken (latency or error,
the board's message, the schedule hash, the replayable record of every valid one), and
`state.json`, what the task is doing (tuning, finished, failed) and with which budget. A
restarted run reads both to know exactly what is done. A last line torn by a kill, a power
cut or a full disk is moved aside to `trials.jsonl.torn` before the next append (glued onto,
it would take the next measurement's row with it); a torn line inside is skipped on read.

This module knows files and numbers only (no TVM): the flow's progress bar, the history
and the workload-key migration read the same log without importing the tuner.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from ..store.artifacts import atomic_write_text, fsync_dir, read_json
from .work_dir import WorkDir

FAILED = 1e10  # what MetaSchedule stores as the latency (s) of a failed measurement
TRIALS = WorkDir.TRIALS
_log = logging.getLogger(__name__)


def task_work_dir(store_work: Path, target_id: str, workload_hash: str, session: str | None = None) -> Path:
    """The work dir of one workload on one target (and one session, when sessions are kept apart)."""
    d = Path(store_work) / "tune" / target_id / (workload_hash if session is None else f"{workload_hash}@{session}")
    d.mkdir(parents=True, exist_ok=True)
    return d


def read_trials(work_dir: Path) -> list[dict[str, Any]]:
    """Every measurement of the task, in measurement order."""
    p = Path(work_dir) / TRIALS
    out = []
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line torn by a kill
    return out


def repair_torn_tail(path: Path) -> bytes | None:
    """Make an append-only JSON-lines file end at a line's end before anything is appended.

    A last line without its newline is either whole (the newline was what the cut took: it
    gets its newline) or torn (it is moved to `<name>.torn` beside the file and cut off).
    Returns the torn bytes moved aside, or None."""
    path = Path(path)
    if not path.exists():
        return None
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        start = size
        while start > 0:  # back to the last newline, a block at a time
            step = min(start, 1 << 16)
            f.seek(start - step)
            block = f.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                start = start - step + nl + 1
                break
            start -= step
        f.seek(start)
        tail = f.read()
        try:
            json.loads(tail)
            whole = True
        except ValueError:
            whole = False
        if whole:
            f.seek(size)
            f.write(b"\n")
        else:
            with open(path.with_name(path.name + ".torn"), "ab") as t:
                t.write(tail + b"\n")
                t.flush()
                os.fsync(t.fileno())
            f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
    if whole:
        return None
    _log.warning(
        "%s ended in a torn line (%d bytes, a kill or a full disk mid-write): moved to %s.torn; "
        "every whole line is kept",
        path,
        len(tail),
        path.name,
    )
    return tail


def append_trials(work_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Append one measured batch, on disk when this returns (fsynced: a power cut after it
    loses nothing of it), after a torn last line left by an earlier cut is moved aside."""
    path = Path(work_dir) / TRIALS
    new = not path.exists()
    repair_torn_tail(path)
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())
    if new:
        fsync_dir(path.parent)


def write_state(work_dir: Path, **state: Any) -> None:
    atomic_write_text(Path(work_dir) / WorkDir.STATE, json.dumps(dict(state, updated=time.time()), indent=1))


def read_state(work_dir: Path) -> dict[str, Any]:
    """The task's state note; a torn one reads as none (the trial log says how far it got)."""
    return read_json(Path(work_dir) / WorkDir.STATE, {}) or {}


def _secs(run_secs) -> list[float]:
    return [float(getattr(s, "value", s)) for s in (run_secs or [])]  # TVM FloatImms or floats


def mean_secs(run_secs) -> float:
    """The mean of a measurement's repeats (TVM FloatImms or floats), FAILED when there are none."""
    vals = _secs(run_secs)
    return sum(vals) / len(vals) if vals else FAILED


# No board calls a kernel and returns in under 1 ns (the packed call alone takes more); a
# tiny injective kernel can take well under a microsecond, so the floor is not higher.
MIN_PLAUSIBLE_S = 1e-9


def implausible(run_secs) -> str | None:
    """Why a board's reported times cannot be true (zero, negative, not finite, or faster than
    any board runs a kernel), or None. A lying timer's 0 s would win every comparison, become
    the task's best record, and divide by zero in the report."""
    vals = _secs(run_secs)
    bad = [v for v in vals if not math.isfinite(v) or v < MIN_PLAUSIBLE_S]
    if not vals or not bad:
        return None
    return (
        f"the board reported {bad[0]!r} s for a run ({len(bad)} of {len(vals)} repeats), below "
        f"{MIN_PLAUSIBLE_S * 1e9:.0f} ns: its timer is broken or it did not run the code. Take that board "
        "off the tracker and check its TVM runtime (python -m tvm.exec.rpc_server on a known-good build)"
    )


def fastest_secs(run_secs) -> float:
    """The fastest of a measurement's repeats, FAILED when there are none: a burst on the host
    slows some repeats, a slower schedule every one."""
    return min(_secs(run_secs), default=FAILED)


def history(work_dir: Path) -> tuple[list[float], float, int]:
    """Latencies (s) in measurement order (FAILED for errors), the best, and trials since the best.

    Read from the trial log: MetaSchedule's database returns records sorted by latency, not
    in the order they were measured, and keeps no failures."""
    lats = [r["latency_ms"] / 1e3 if r.get("latency_ms") is not None else FAILED for r in read_trials(work_dir)]
    best, since = FAILED, 0
    for v in lats:
        if v < best:
            best, since = v, 0
        else:
            since += 1
    return lats, best, since


def last_threads(work_dir: Path) -> int | None:
    """The thread count of the task's latest measurement that recorded one."""
    for row in reversed(read_trials(work_dir)):
        if row.get("threads"):
            return int(row["threads"])
    return None


def read_default_ms(work_dir: Path) -> float | None:
    """The task's default (untuned) lowering as measured on the board, once per work dir."""
    secs = (read_json(Path(work_dir) / WorkDir.DEFAULT, {}) or {}).get("seconds")
    return secs * 1e3 if secs is not None else None
