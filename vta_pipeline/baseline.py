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
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from .config import PipelineConfig

ENGINE = "ONNX Runtime fp32"


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

    from .importers import load_reference, torch_model

    x, _ = load_reference(fetched_dir)
    out = work / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(torch_model(m), (torch.from_numpy(x),), str(out), input_names=["data"],
                          output_names=["out"], opset_version=17, dynamo=False)
    return out


def compare(lib: Path, onnx_path: Path, x: np.ndarray, reference: np.ndarray, tracker: tuple[str, int], key: str,
            threads: int, rounds: int, min_repeat_ms: float = 50.0) -> dict[str, Any]:
    """The tuned build and ONNX Runtime fp32, `rounds` rounds in turn: each one's median ms,
    ours / theirs, and whether ORT's output is the reference's (the same model)."""
    import onnxruntime as ort

    from .evaluate import time_in_turn

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    y = sess.run(None, feed)[0]
    for _ in range(3):  # warm: its first runs plan memory
        sess.run(None, feed)

    def ort_ms() -> float:
        import time

        n, t0 = 0, time.perf_counter()
        while True:  # as many runs as fill min_repeat_ms, like the board's repeats
            sess.run(None, feed)
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed * 1e3 >= min_repeat_ms:
                return elapsed * 1e3 / n

    ours, theirs = time_in_turn([lib], x, "llvm", tracker, key, rounds, min_repeat_ms=min_repeat_ms, local=[ort_ms])
    ours_ms, ort_median = statistics.median(ours), statistics.median(theirs)
    return {"engine": ENGINE, "ours_ms": ours_ms, "ort_ms": ort_median, "ratio": ours_ms / ort_median,
            "rounds": rounds, "threads": threads, "ours_rounds_ms": [round(v, 4) for v in ours],
            "ort_rounds_ms": [round(v, 4) for v in theirs],
            "ort_output_matches": bool(np.allclose(y.reshape(reference.shape), reference, rtol=1e-3, atol=1e-3))}
