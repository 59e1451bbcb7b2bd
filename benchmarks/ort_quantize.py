"""ONNX Runtime's static QDQ quantization of an fp32 ONNX model, calibrated on random data.

Run by compare.py in its own environment (see ort_quantize_requirements.txt):

    python ort_quantize.py in.onnx out.onnx --input data --shape 1,3,224,224 [--weights int8|uint8]

Activations uint8, weights int8 per channel (U8S8, what ORT runs fastest on x86): the
pre-processing step (shape inference, fusions) first, as ORT's documentation recommends.
"""

from __future__ import annotations

import argparse

import numpy as np
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process


class RandomCalibration(CalibrationDataReader):
    def __init__(self, name: str, shape: tuple[int, ...], batches: int, seed: int):
        rng = np.random.default_rng(seed)
        self.batches = iter([{name: rng.standard_normal(shape).astype("float32")} for _ in range(batches)])

    def get_next(self):
        return next(self.batches, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--input", default="data")
    ap.add_argument("--shape", default="1,3,224,224")
    ap.add_argument("--activations", choices=["uint8", "int8"], default="uint8")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    pre = args.dst + ".pre.onnx"
    quant_pre_process(args.src, pre)
    shape = tuple(int(d) for d in args.shape.split(","))
    quantize_static(pre, args.dst, RandomCalibration(args.input, shape, args.batches, args.seed),
                    quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8 if args.activations == "uint8" else QuantType.QInt8,
                    weight_type=QuantType.QInt8)


if __name__ == "__main__":
    main()
