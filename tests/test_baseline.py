"""An int8 run is judged against the int8 runtime the user would otherwise take: ONNX Runtime's
own static quantizer (U8S8 QDQ, in its own environment), timed in turn with the tuned build
and ORT fp32 on the same cores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vta_pipeline import baseline
from vta_pipeline.report import RunResult, baseline_line, latency_rows


def _two_conv_onnx(path: Path) -> Path:
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 1), torch.nn.ReLU()
    ).eval()
    with torch.no_grad():
        torch.onnx.export(
            net,
            (torch.randn(1, 8, 16, 16),),
            str(path),
            input_names=["data"],
            output_names=["out"],
            opset_version=17,
            dynamo=False,
        )
    return path


def _ort(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


@pytest.fixture(scope="module")
def qdq(tmp_path_factory):
    """The two-conv model, fp32 and quantized by ORT's quantizer on seeded calibration batches."""
    d = tmp_path_factory.mktemp("qdq")
    fp32 = _two_conv_onnx(d / "m.onnx")
    rng = np.random.default_rng(0)
    calibration = [rng.standard_normal((1, 8, 16, 16)).astype("float32") for _ in range(4)]
    return fp32, baseline.quantize_qdq(fp32, d / "m.qdq.onnx", calibration), calibration


def test_onnx_runtimes_own_quantizer_makes_an_int8_model_that_keeps_the_float_models_output(qdq):
    import onnx

    fp32, int8, calibration = qdq
    model = onnx.load(str(int8))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == 2 and "QuantizeLinear" in ops and "DequantizeLinear" in ops
    weights = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT8 and len(i.dims) == 4]
    assert len(weights) == 2  # both convs' weights stored int8 (with per-channel int8 zero points)
    y, y8 = _ort(fp32, calibration[0]), _ort(int8, calibration[0])
    cos = float(np.dot(y.ravel(), y8.ravel()) / (np.linalg.norm(y) * np.linalg.norm(y8)))
    assert cos > 0.99 and not np.array_equal(y, y8)


def test_without_uv_the_int8_quantizer_says_what_to_install(qdq, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no uv on it
    with pytest.raises(baseline.QuantizerUnavailable, match="pip install uv"):
        baseline.quantize_qdq(qdq[0], tmp_path / "x.onnx", qdq[2])


def test_an_int8_run_is_timed_against_ort_int8_with_ort_fp32_in_the_same_rounds(qdq, board, tmp_path):
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    fp32, int8, calibration = qdq
    x = calibration[0]
    mod = from_onnx(onnx.load(str(fp32)), shape_dict={"data": list(x.shape)})
    lib = tmp_path / "model.so"
    relax.build(mod, tvm.target.Target({"kind": "llvm"})).export_library(str(lib))
    reference = _ort(fp32, x)
    b = baseline.compare(
        lib,
        fp32,
        x,
        reference,
        (board.host, board.port),
        board.key,
        threads=1,
        rounds=3,
        min_repeat_ms=5.0,
        int8_onnx=int8,
        float_reference=reference,
    )
    assert b["engine"] == baseline.INT8_ENGINE and b["fp32"]["engine"] == baseline.ENGINE
    assert len(b["ours_rounds_ms"]) == len(b["ort_rounds_ms"]) == len(b["fp32"]["ort_rounds_ms"]) == 3
    assert b["ratio"] == pytest.approx(b["ours_ms"] / b["ort_ms"])
    assert b["fp32"]["ratio"] == pytest.approx(b["ours_ms"] / b["fp32"]["ort_ms"])
    assert b["fp32"]["ort_output_matches"] and b["ort_vs_float"]["cosine"] > 0.99
    result = RunResult(
        run_id="r",
        untuned={"mean_ms": 1.0, "std_ms": 0.0, "median_ms": 1.0, "correct": True},
        tuned={"mean_ms": 1.0, "std_ms": 0.0, "median_ms": 1.0, "correct": True},
        baseline=b,
    )
    engines = [r[0] for r in latency_rows(result)]
    assert engines[2:] == ["ONNX Runtime fp32 (in turn)", "ONNX Runtime int8 (U8S8 QDQ) (in turn)"]
    assert "in turn with ONNX Runtime int8 (U8S8 QDQ)" in baseline_line(result)
