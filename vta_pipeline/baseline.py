"""The runtime the user already has: ONNX Runtime on the same model, the same input and the
same cores, timed in turn with the tuned build, so that a run says whether tuning beat it.

A user tunes to get something faster than what they run today; a speed-up over TVM's own
untuned build says nothing about that. ONNX Runtime's CPU provider is the usual baseline
(its NCHWc transformer blocks every conv of any graph). Timed in turn, round by round, with
the tuned build on the board (`evaluate.time_in_turn`): on a shared host two timings minutes
apart differ by more than the gap being judged.

Only where the board's cores are this machine's (a local board, or a tracker on loopback, of a
host CPU target): ORT
runs in this process, with as many threads as the board runs kernels with. Elsewhere the
result says why there is no such row. Not cached: a timing belongs to the minutes it was
taken in.

An int8 run is judged against ONNX Runtime int8 (ORT's own static U8S8 QDQ quantizer on the
run's calibration inputs, run in its own environment: `tools/ort_quantize.py`), with the fp32
row timed in the same rounds; where that quantizer cannot run, the fp32 row stands alone and
the result says why.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .config import PipelineConfig

ENGINE = "ONNX Runtime fp32"
INT8_ENGINE = "ONNX Runtime int8 (U8S8 QDQ)"
TOOLS = Path(__file__).resolve().parent / "tools"
QUANTIZE_TIMEOUT_S = 1800  # the first call builds the quantizer's environment (downloads)


class QuantizerUnavailable(RuntimeError):
    """ORT's int8 quantizer could not run here; the message says why and what to do."""


def _loopback(host: str) -> bool:
    return host == "localhost" or host == "::1" or host.startswith("127.")


def absent_reason(cfg: PipelineConfig, target: Any) -> str | None:
    """Why the run has no ONNX Runtime row, or None when it can have one."""
    if not cfg.evaluate.compare:
        return "--no-compare"
    if cfg.board.tracker is not None and not _loopback(cfg.board.address()[0]):
        return "the board is remote (ONNX Runtime would run on this machine's cores, not the board's)"
    if target.kind != "llvm" or target.cross_compiler:
        return f"target {target.name!r} does not run on this machine's CPU"
    if target.offload:
        return f"target {target.name!r} offloads to {target.offload}"
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return "onnxruntime is not installed"
    return None


def onnx_model(cfg: PipelineConfig, fetched_dir: Path, work: Path) -> Path:
    """The model as an ONNX file: the user's own for source onnx, the one Gluon's import
    wrote, else the seeded PyTorch model exported (the same weights fetch imported)."""
    m = cfg.model
    if m.source == "onnx":
        return Path(m.path)
    if (fetched_dir / "model.onnx").exists():
        return fetched_dir / "model.onnx"
    import torch

    from .fetch import load_reference, torch_model

    x, _ = load_reference(fetched_dir)
    out = work / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(
            torch_model(m),
            (torch.from_numpy(x),),
            str(out),
            input_names=["data"],
            output_names=["out"],
            opset_version=17,
            dynamo=False,
        )
    return out


def quantize_qdq(src: Path, dst: Path, calibration: list[np.ndarray]) -> Path:
    """`src` quantized by ONNX Runtime's own static quantizer (U8S8 QDQ, weights per channel),
    calibrated on `calibration`, written to `dst`. The quantizer runs in its own environment
    (`tools/ort_quantize_requirements.txt`), made by uv; raises QuantizerUnavailable."""
    uv = shutil.which("uv")
    if uv is None:
        raise QuantizerUnavailable(
            "ORT's int8 quantizer runs in its own environment, made by uv, and uv is not on "
            "PATH: `pip install uv` for the int8 row"
        )
    batches = Path(dst).with_suffix(".calibration.npy")
    np.save(batches, np.stack(calibration))
    cmd = [
        uv,
        "run",
        "--no-project",
        "--python",
        f"{sys.version_info.major}.{sys.version_info.minor}",
        "--with-requirements",
        str(TOOLS / "ort_quantize_requirements.txt"),
        "python",
        str(TOOLS / "ort_quantize.py"),
        str(src),
        str(dst),
        "--calibration",
        str(batches),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=QUANTIZE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise QuantizerUnavailable(
            f"ORT's int8 quantizer did not finish in {QUANTIZE_TIMEOUT_S} s ({' '.join(cmd)})"
        ) from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise QuantizerUnavailable(
            f"ORT's int8 quantizer failed: {tail[0]} (run `{' '.join(cmd)}` to see why; "
            "its environment needs the package registry once)"
        )
    return Path(dst)


def _session(onnx_path: Path, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])


def _timer(sess, x: np.ndarray, min_repeat_ms: float):
    """The session's output on x, and a function that times it (ms per run)."""
    import time

    feed = {sess.get_inputs()[0].name: x}
    y = sess.run(None, feed)[0]
    for _ in range(3):  # warm: its first runs plan memory
        sess.run(None, feed)

    def ms() -> float:
        sess.run(None, feed)  # untimed, as the board's engines (evaluate.time_in_turn)
        n, t0 = 0, time.perf_counter()
        while True:  # as many runs as fill min_repeat_ms, like the board's repeats
            sess.run(None, feed)
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed * 1e3 >= min_repeat_ms:
                return elapsed * 1e3 / n

    return y, ms


def compare(
    lib: Path,
    onnx_path: Path,
    x: np.ndarray,
    reference: np.ndarray,
    tracker: tuple[str, int],
    key: str,
    threads: int,
    rounds: int,
    min_repeat_ms: float = 50.0,
    int8_onnx: Path | None = None,
    float_reference: np.ndarray | None = None,
    board_timeout_s: float | None = None,
) -> dict[str, Any]:
    """The tuned build and ONNX Runtime fp32 (and int8, given `int8_onnx`), `rounds` rounds
    in turn: each one's median ms, ours / theirs, and whether ORT's output is the reference's.

    With `int8_onnx` the result's engine is ORT int8 (what an int8 build competes with) and
    the fp32 row is under "fp32". ORT's outputs are compared with the float model's
    (`float_reference`, given for an int8 run), fp32 exactly, int8 as our int8 build's is."""
    from .evaluate import time_in_turn
    from .quantize import agreement

    float_ref = reference if float_reference is None else float_reference
    y, fp32_ms = _timer(_session(onnx_path, threads), x, min_repeat_ms)
    fp32_ok = bool(np.allclose(y.reshape(float_ref.shape), float_ref, rtol=1e-3, atol=1e-3))
    local = [fp32_ms]
    if int8_onnx is not None:
        y8, int8_ms = _timer(_session(int8_onnx, threads), x, min_repeat_ms)
        local.append(int8_ms)
    ours, *theirs = time_in_turn(
        [lib],
        x,
        "llvm",
        tracker,
        key,
        rounds,
        min_repeat_ms=min_repeat_ms,
        local=local,
        **({"board_timeout_s": board_timeout_s} if board_timeout_s else {}),
    )
    ours_ms = statistics.median(ours)
    rows = [
        {
            "engine": ENGINE,
            "ort_ms": statistics.median(theirs[0]),
            "ort_rounds_ms": [round(v, 4) for v in theirs[0]],
            "ort_output_matches": fp32_ok,
        }
    ]
    if int8_onnx is not None:
        rows.append(
            {
                "engine": INT8_ENGINE,
                "ort_ms": statistics.median(theirs[1]),
                "ort_rounds_ms": [round(v, 4) for v in theirs[1]],
                "ort_vs_float": agreement(y8.reshape(float_ref.shape).astype("float32"), float_ref),
            }
        )
    for row in rows:
        row["ratio"] = ours_ms / row["ort_ms"]
    out = {
        **rows[-1],
        "ours_ms": ours_ms,
        "rounds": rounds,
        "threads": threads,
        "ours_rounds_ms": [round(v, 4) for v in ours],
    }
    if int8_onnx is not None:
        out["fp32"] = rows[0]
    return out
