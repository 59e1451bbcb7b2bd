"""This machine's peaks, measured in the run that reports against them: an fp32 GEMM, the
faster int8 GEMM of PyTorch and ONNX Runtime, and main-memory copy bandwidth."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks.lib.timing import stats, timed


def fp32_gemms(threads: int) -> dict[str, float]:
    """GFLOP/s of the fp32 GEMMs on offer, measured now: PyTorch at 2048^3, ONNX Runtime's
    MLAS at 512^3 and 1024^3 (on the AVX2 EPYC, torch's 2048 reached 106 GFLOP/s while ORT's
    convs ran at 148: a peak must be the best of them)."""
    import onnx
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper

    torch.set_num_threads(threads)
    a = torch.randn(2048, 2048)
    out = {"PyTorch matmul 2048": 2 * 2048**3 / stats(timed(lambda: torch.matmul(a, a), 10))["median_ms"] / 1e6}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    for n in (512, 1024):
        b = onnx.numpy_helper.from_array(np.random.default_rng(1).standard_normal((n, n)).astype(np.float32), "b")
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["a", "b"], ["y"])],
            "gemm",
            [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
            [b],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        feed = {"a": np.ones((n, n), np.float32)}
        out[f"ONNX Runtime MatMul {n}"] = 2 * n**3 / stats(timed(lambda: sess.run(None, feed), 10))["median_ms"] / 1e6
    return out


def peaks(threads: int) -> dict[str, Any]:
    """This machine's reachable peak, measured now: the best fp32 GEMM (`fp32_gemms`) and the
    best int8 GEMM on offer, torch._int_mm (s8 x s8; slow without VNNI/AMX) or ONNX Runtime's
    MatMulInteger (u8 x s8, the AVX2/VNNI kernels ORT's int8 convs use)."""
    import torch

    torch.set_num_threads(threads)
    n = 2048
    fp32 = fp32_gemms(threads)
    out: dict[str, Any] = {"fp32_gflops": max(fp32.values()), "fp32_sources": fp32, "int8_sources": {}}
    try:
        ai = torch.randint(-128, 127, (n, n), dtype=torch.int8)
        bi = torch.randint(-128, 127, (n, n), dtype=torch.int8)
        t0 = time.perf_counter()
        torch._int_mm(ai, bi)
        first_ms = (time.perf_counter() - t0) * 1e3
        # Without VNNI/AMX torch's kernel is scalar: ~12 s a call here, so 8 timed calls were
        # 1.5 min of the benchmark for a number that is never the peak. One call is enough then.
        i8 = stats(timed(lambda: torch._int_mm(ai, bi), 5)) if first_ms < 1000 else {"median_ms": first_ms}
        out["int8_sources"]["torch._int_mm s8s8"] = 2 * n**3 / i8["median_ms"] / 1e6
    except (RuntimeError, AttributeError) as e:  # no int8 GEMM kernel for this CPU in this build
        out["int8_sources"]["torch._int_mm s8s8"] = None
        out["int8_error"] = str(e).splitlines()[0]
    out["int8_sources"]["ONNX Runtime MatMulInteger u8s8"] = ort_int8_gemm(n, threads)
    out["int8_gops"] = max(v for v in out["int8_sources"].values() if v)
    return out


def ort_int8_gemm(n: int, threads: int) -> float:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    w = rng.integers(-127, 127, (n, n), dtype=np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
        "int8_gemm",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [n, n])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feed = {"a": rng.integers(0, 127, (n, n), dtype=np.uint8)}
    return 2 * n**3 / stats(timed(lambda: sess.run(None, feed), 10))["median_ms"] / 1e6


HOST_PROBE_BYTES = 256 << 20


def copy_gbps() -> float:
    """The host's copy bandwidth now, on torch's threads (the run's): the best of 3 copies."""
    import torch

    a = torch.ones(HOST_PROBE_BYTES // 4)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return 2 * HOST_PROBE_BYTES / best / 1e9
