"""The runtimes we compare against, on the same model and threads: PyTorch eager, ONNX Runtime
fp32 and int8 (its own quantizer, in its pinned environment)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from benchmarks.lib.models import MODELS
from benchmarks.lib.timing import stats, timed


# ---- the frameworks -----------------------------------------------------------------------------
def torch_model(name: str, seed: int):
    import torch
    import torchvision

    torch.manual_seed(seed)
    return getattr(torchvision.models, name)(weights=None).eval()


def ort_quantize(src: Path, dst: Path, shape, seed: int, batches: int = 8) -> None:
    """ORT's static U8S8 QDQ quantizer (`baseline.quantize_qdq`, in its own pinned environment:
    it needs a newer onnx than the project's pin), calibrated on seeded random batches."""
    from vta_pipeline.baseline import quantize_qdq

    rng = np.random.default_rng(seed)
    quantize_qdq(src, dst, [rng.standard_normal(tuple(shape)).astype("float32") for _ in range(batches)])


class References:
    """One model in PyTorch eager and ONNX Runtime (fp32 and U8S8 QDQ int8), kept loaded.

    Timed once with the frameworks' rows, and again in turn with every tuned TVM build of
    the model (`side_by_side`): this shared 2-vCPU host moved the same ONNX Runtime session
    by 30% within an hour (results/r18_curve_4fc4372), so a goal is judged against the
    reference timed in the same minutes, not at the start of an hour-long run."""

    FP32, INT8 = "ONNX Runtime fp32", "ONNX Runtime int8 (U8S8 QDQ)"

    def __init__(self, name: str, shape, threads: int, work: Path, seed: int):
        import onnxruntime as ort
        import torch

        torch.set_num_threads(threads)
        self.model = torch_model(name, seed)
        self.x = torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype("float32"))
        fp32 = work / f"{name}.onnx"
        torch.onnx.export(
            self.model, (self.x,), str(fp32), input_names=["data"], output_names=["out"], opset_version=17, dynamo=False
        )
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.feed = {"data": self.x.numpy()}
        self.sess = ort.InferenceSession(str(fp32), opts, providers=["CPUExecutionProvider"])
        int8 = work / f"{name}.u8s8.onnx"
        ort_quantize(fp32, int8, shape, seed + 1)
        self.sess8 = ort.InferenceSession(str(int8), opts, providers=["CPUExecutionProvider"])

    def session(self, engine: str):
        """One ONNX Runtime engine's session (FP32 or INT8)."""
        return {self.FP32: self.sess, self.INT8: self.sess8}[engine]

    def runs(self, engine: str, runs: int) -> list[float]:
        """`runs` timed runs (ms) of one ONNX Runtime engine."""
        sess = self.session(engine)
        return timed(lambda: sess.run(None, self.feed), runs)

    def time(self, runs: int, only: tuple[str, ...] | None = None) -> dict[str, dict[str, float]]:
        import torch

        res: dict[str, dict[str, float]] = {}
        if only is None:
            with torch.inference_mode():
                res["PyTorch eager fp32"] = stats(timed(lambda: self.model(self.x), runs))
        for engine, sess in ((self.FP32, self.sess), (self.INT8, self.sess8)):
            if only is None or engine in only:
                res[engine] = stats(self.runs(engine, runs))
        return res


_REFERENCES: dict[str, References] = {}


def references(name: str, threads: int, seed: int) -> References:
    """The model's loaded References (made on first use: a resumed run has none yet)."""
    if name not in _REFERENCES:
        _REFERENCES[name] = References(name, MODELS[name]["shape"], threads, Path(tempfile.mkdtemp()), seed)
    return _REFERENCES[name]


def frameworks(name: str, shape, threads: int, runs: int, work: Path, seed: int) -> dict[str, dict[str, float]]:
    _REFERENCES[name] = References(name, shape, threads, work, seed)
    return _REFERENCES[name].time(runs)
