"""Our pipeline as a benchmark runs it: `vta-pipeline run` in this process against one Prefect
server, the evaluations it stored, and builds timed in turn with each other or a reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lib.references import References
from benchmarks.lib.timing import stats

ROOT = Path(__file__).resolve().parents[2]  # the checkout: the CLI runs from there

# One Prefect server for every pipeline run, as a user's runs report to theirs: each run
# would otherwise start a temporary one (12-20 s here) and tear it down.
PREFECT_ENV: dict[str, str] = {}


# ---- our pipeline -------------------------------------------------------------------------------
def pipeline_run(
    model: str,
    source: str,
    store: Path,
    trials: int,
    threads: int,
    eval_repeat: int,
    extra: list[str],
    servers: int = 2,
    task_filter: str = "auto",
    board: Any = None,
    allocation: str = "flat",
    in_process: bool = False,
) -> dict[str, Any]:
    """`vta-pipeline run` as a user runs it; returns its result plus the tuning phase's timing.

    `board`: a LocalBoard already up, used through its tracker as a rack is (else the run
    starts a local board of `servers` of its own). The run reports to the benchmark's Prefect
    server when one is up (`PREFECT_ENV`), else to a temporary one of its own.
    `in_process`: the same command, run in this process (see `_cli_in_process`) instead of
    a fresh one, as the nightly flow tunes one network after the other: imports and worker
    pools are paid once per benchmark, not once per row."""
    where = ["--tracker", board.tracker, "--key", board.key] if board else ["--local-servers", str(servers)]
    # Rounds of at least 4 candidates: a latency-steered task may get 4x the average budget,
    # and every round pays a search, a cost-model update and a board session (~3 s here).
    batch = max(4, min(trials, 8))
    argv = [
        "run",
        "--source",
        source,
        "--model",
        model,
        "--trials-per-task",
        str(trials),
        "--trials-per-batch",
        str(batch),
        "--task-filter",
        task_filter,
        "--allocation",
        allocation,
        "--eval-repeat",
        str(eval_repeat),
        *where,
        "--store",
        str(store),
        *extra,
    ]
    t0 = time.time()
    if in_process:
        _cli_in_process(argv, store / "logs" / f"{model}-{int(t0)}.log")
    else:
        cmd = [sys.executable, "-m", "vta_pipeline.cli", *argv]
        env = dict(PREFECT_ENV or os.environ, TVM_NUM_THREADS=str(threads))
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    wall = time.time() - t0
    runs = sorted((store / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime)
    result = json.loads(runs[-1].read_text())
    events = [json.loads(line) for line in (store / "events.jsonl").read_text().splitlines()]
    tune = [e["t"] for e in events if e.get("step") == "tune" and e["t"] >= t0]
    trials_done = sum(t.get("trials_this_run", t.get("trials", 0)) for t in result["tasks"])
    return {
        "result": result,
        "wall_s": wall,
        "tune_s": (max(tune) - min(tune)) if tune else None,
        "trials": trials_done,
    }


def _cli_in_process(argv: list[str], log: Path) -> None:
    """`vta-pipeline ARGV` in this process, its output (progress bars, Prefect's console log,
    the result table) into `log`: file descriptors 1 and 2 are pointed there for the run, so
    what TVM and Prefect write reaches the file as well. A failed run raises with the log's
    tail. The environment must already hold PREFECT_ENV and TVM_NUM_THREADS (see main)."""
    from vta_pipeline.cli.main import app

    log.parent.mkdir(parents=True, exist_ok=True)
    code: Any = None
    with open(log, "w") as f:
        sys.stdout.flush(), sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(f.fileno(), 1), os.dup2(f.fileno(), 2)
        try:
            code = app(argv, prog_name="vta-pipeline", standalone_mode=False)
        except BaseException as e:  # noqa: BLE001 - reported below with the run's own output
            code = e
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
    if code not in (None, 0):
        if isinstance(code, (KeyboardInterrupt, SystemExit)):  # Ctrl-C, SIGTERM: stop, not a failed row
            raise code
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"vta-pipeline {' '.join(argv)} failed ({code!r}); its log {log} ends:\n{tail}")


def evaluation_stats(ev: dict[str, Any]) -> dict[str, float]:
    reps = ev.get("repeats") or [ev["mean_ms"]]
    return {**stats(reps), "correct": ev.get("correct"), "threads": ev.get("threads")}


SIDE_BY_SIDE_ROUNDS = 5


# Seconds each engine waits before its turn in `side_by_side`. Both engines' thread pools spin
# after a job (ONNX Runtime's workers about 2^20 pause loops, TVM's 300000 yields): an engine
# timed right after the other shares the 2 cores with those spinning threads. On the Intel Xeon
# (mnv2_c16_pad_54554f1) both lost in turn: our int8 build 3.86-4.64 ms vs 3.58 in its flow,
# ONNX Runtime int8 3.3-3.4 vs 2.56 alone. Neither pool is slowed by the wait: its own runs
# follow each other as before.
SETTLE_S = 0.5


def stored(store: Path, artifact_id: str):
    """The artifact of any step in the pipeline's `store` whose content id is `artifact_id`:
    found by its manifest, and only that one verified (`ArtifactStore.find` would hash every
    file of the store, a gigabyte after a few networks, three times per TVM row)."""
    from vta_pipeline.store.artifacts import MANIFEST, ArtifactStore

    for manifest in sorted((store / "steps").glob(f"*/*/{MANIFEST}")):
        if json.loads(manifest.read_text()).get("artifact_id") == artifact_id:
            a = ArtifactStore(store).lookup(manifest.parent.parent.name, manifest.parent.name)
            if a is not None:
                return a
    raise LookupError(f"no artifact {artifact_id} in the store {store}")


def side_by_side(
    store: Path,
    result: dict[str, Any],
    board: Any,
    ref: "References",
    engine: str,
    runs: int,
    rounds: int = SIDE_BY_SIDE_ROUNDS,
) -> dict[str, Any]:
    """The run's tuned build on the board and the reference engine in this process, timed in
    turn `rounds` times (each round: the build's evaluation with runs/rounds repeats, then
    runs/rounds runs of the reference): medians of all repeats and runs of each.

    The pipeline's own evaluation and the reference's timing are minutes apart, and the
    pipeline's runs inside its Prefect flow: its mobilenet_v2 int8 evaluation gave 7.46 ms
    (repeats from 5.7 to 8.4) and ONNX Runtime 5.67 right after, where the same build on a
    quiet board and ONNX Runtime timed in turn gave 5.3-5.5 vs 4.9-5.9 ms, round by round.
    In turn, both see the same host.

    Timed twice: each engine starting right after the other (as until 296fe1f), then each
    after SETTLE_S seconds, once the other's spinning threads have gone to sleep. The
    settled pair is the result; the other stays beside it as `unsettled`."""
    from vta_pipeline import fetch
    from vta_pipeline.build import LIB

    evaluation = stored(store, result["tuned"]["evaluation_id"])
    lib = stored(store, evaluation.manifest["inputs"]["lib"]).file(LIB)
    reference = fetch.load_reference(stored(store, evaluation.manifest["inputs"]["reference"]).path)
    per_round = max(3, runs // rounds)
    setup = (lib, reference, result["config"]["evaluate"], board, ref, engine, per_round, rounds)
    quick = in_turn(*setup, settle_s=0.0)
    return {
        **in_turn(*setup, settle_s=SETTLE_S),
        "unsettled": {k: v for k, v in quick.items() if k not in ("engine", "rounds")},
    }


def in_turn(
    lib: Path,
    reference: Any,
    cfg: dict[str, Any],
    board: Any,
    ref: "References",
    engine: str,
    per_round: int,
    rounds: int,
    settle_s: float,
) -> dict[str, Any]:
    """One `side_by_side` timing, each engine's turn starting `settle_s` seconds after the other's."""
    from vta_pipeline import evaluate as ev_mod

    ours: list[list[float]] = []
    theirs: list[list[float]] = []
    for _ in range(rounds):
        time.sleep(settle_s)
        e = ev_mod.evaluate_on_board(
            lib,
            reference,
            "llvm",
            (board.host, board.port),
            board.key,
            cfg["number"],
            per_round,
            cfg["rtol"],
            cfg["atol"],
            min_repeat_ms=cfg["min_repeat_ms"],
        )
        ours.append(list(e.repeats))
        time.sleep(settle_s)
        theirs.append(ref.runs(engine, per_round))
    return {
        "ours_ms": float(np.median(sum(ours, []))),
        "reference_ms": float(np.median(sum(theirs, []))),
        "rounds": rounds,
        "ours_repeats": sum(map(len, ours)),
        "reference_runs": sum(map(len, theirs)),
        "engine": engine,
        "settle_s": settle_s,  # each round's median: a drift within the run shows here
        "ours_rounds_ms": [round(float(np.median(r)), 3) for r in ours],
        "reference_rounds_ms": [round(float(np.median(r)), 3) for r in theirs],
    }


def unsettled(pair: dict[str, Any]) -> str:
    """The no-wait timing of a `side_by_side` pair as three table cells (blank before SETTLE_S)."""
    u = pair.get("unsettled")
    if not u:
        return " | | "
    return f"{u['ours_ms']:.2f} | {u['reference_ms']:.2f} | {u['ours_ms'] / u['reference_ms']:.3f}"


def model_gflop(store: Path, model: str, source: str) -> float:
    """The network's FLOPs as TVM counts them (every task's FLOPs x its weight)."""
    from vta_pipeline import steps
    from vta_pipeline.config import ModelConfig
    from vta_pipeline.extract import load_tasks
    from vta_pipeline.store.artifacts import ArtifactStore
    from vta_pipeline.targets import resolve_target

    st = ArtifactStore(store)
    extracted = steps.extract_step(
        st, steps.fetch_step(st, ModelConfig(source=source, name=model)), resolve_target("host")
    )
    return sum(t.flops * t.weight for t in load_tasks(extracted.path)) / 1e9
