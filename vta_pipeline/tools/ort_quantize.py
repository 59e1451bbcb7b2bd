"""ONNX Runtime's static QDQ quantization of an fp32 ONNX model.

Runs in its own environment, not the project's (ORT's quantizer needs onnx>=1.16; the project
pins 1.15 for MXNet's exporter), so it imports nothing of vta_pipeline:

    uv run --no-project --with-requirements ort_quantize_requirements.txt \
        python ort_quantize.py in.onnx out.onnx [--calibration batches.npy | --shape 1,3,224,224]

Activations uint8, weights int8 per channel (U8S8, what ORT runs fastest on x86), after the
pre-processing step (shape inference, fusions) ORT's documentation asks for. Calibrated on
the batches given (the int8 run's own calibration inputs), else on seeded random data.
"""

from __future__ import annotations

import argparse

import numpy as np
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process


class Batches(CalibrationDataReader):
    def __init__(self, name: str, batches: list[np.ndarray]):
        self.batches = iter([{name: b.astype("float32")} for b in batches])

    def get_next(self):
        return next(self.batches, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--input", default=None, help="the input's name (default: the model's first input)")
    ap.add_argument("--calibration", default=None, help=".npy of stacked input batches (N, *input shape)")
    ap.add_argument("--shape", default="1,3,224,224", help="random calibration batches of this shape")
    ap.add_argument("--activations", choices=["uint8", "int8"], default="uint8")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    pre = args.dst + ".pre.onnx"
    quant_pre_process(args.src, pre)
    if args.calibration:
        batches = list(np.load(args.calibration))
    else:
        rng = np.random.default_rng(args.seed)
        shape = tuple(int(d) for d in args.shape.split(","))
        batches = [rng.standard_normal(shape).astype("float32") for _ in range(args.batches)]
    name = args.input
    if name is None:
        import onnx

        model = onnx.load(pre)
        inits = {i.name for i in model.graph.initializer}
        name = next(i.name for i in model.graph.input if i.name not in inits)
    quantize_static(
        pre,
        args.dst,
        Batches(name, batches),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8 if args.activations == "uint8" else QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )


if __name__ == "__main__":
    main()
