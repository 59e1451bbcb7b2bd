"""Step "quantize": the imported float network -> int8 (relay.quantize semantics, Relax).

Batch norm is folded into the conv weights first, activations' exponents come from the
global scale or from calibration (numpy interpreter over the float graph), then the
rewrite of `passes.quantize`. The integer emulation of the quantized graph on the stored
input becomes the reference the compiled network must reproduce exactly; agreement with
the float model is reported.

Artifact: module.json (the quantized Relax module, weights bound), quantized.py (its
Relax text, for reading), layers.json (per conv and dense layer: quantized or not, exponents),
reference.npz (input, output = the integer emulation, float_output = the framework's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .config import QuantizeConfig
from .errors import ConfigError, ModelError

STEP = "quantize"
VERSION = 2  # 2: a float max pool whose output is only quantized pools int8


def agreement(y: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    """How close an output is to a reference: cosine, max abs error, top-1 match."""
    y64, r64 = y.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    cos = float(np.dot(y64, r64) / (np.linalg.norm(y64) * np.linalg.norm(r64) + 1e-30))
    out = {"cosine": cos, "max_abs_error": float(np.abs(y64 - r64).max()), "exact": bool(np.array_equal(y, ref))}
    if y.ndim == 2:
        out["top1_agree"] = float(np.mean(y.argmax(axis=1) == ref.argmax(axis=1)))
    return out


def calibration_inputs(cfg: QuantizeConfig, input_shape: tuple[int, ...], seed: int) -> list[np.ndarray]:
    """Batches shaped like the model input: from cfg.calibration_data, or seeded random data."""
    n, *chw = input_shape
    if cfg.calibration_data is None:
        rng = np.random.default_rng(seed + 1)
        return [rng.standard_normal(input_shape).astype("float32") for _ in range(cfg.calibration_batches)]
    path = Path(cfg.calibration_data)
    if not path.is_file():
        raise ConfigError(f"calibration data file {path} does not exist (quantize.calibration_data)")
    try:
        if path.suffix == ".npz":
            with np.load(path) as z:
                data = z[z.files[0]]
        else:
            data = np.load(path)
    except Exception as e:
        raise ConfigError(f"calibration data file {path} is not a .npy/.npz array: {e}") from None
    if data.ndim != 4 or list(data.shape[1:]) != chw:
        raise ConfigError(
            f"calibration data {path} has shape {list(data.shape)}; the model takes (B, {', '.join(map(str, chw))})"
        )
    data = data.astype("float32")
    return [data[i : i + n] for i in range(0, len(data) - n + 1, n)]


def calibrate(mod, cfg: QuantizeConfig, batches: list[np.ndarray]) -> dict[Any, int]:
    """Per-activation exponents from the float graph's values on the calibration batches."""
    from .passes import emulate
    from .passes.quantize import QuantizeParams, quantization_points

    points = quantization_points(mod)
    bounds: dict[Any, list[np.ndarray]] = {p: [] for p in points}
    interp = emulate.Interpreter(mod)
    for x in batches:
        _, seen = interp.run([x], watch=points)
        for p, v in seen.items():
            bounds[p].append(np.abs(v).ravel())
    exps = {}
    for p, vals in bounds.items():
        if not vals:
            continue
        a = np.concatenate(vals)
        bound = float(a.max()) if cfg.calibrate_mode == "max" else float(np.percentile(a, cfg.percentile))
        exps[p] = QuantizeParams.exp_for_bound(bound, cfg.nbit_input)
    return exps


def quantize_model(model_dir: Path, cfg: QuantizeConfig, out_dir: Path, seed: int = 0) -> dict[str, Any]:
    import math

    import tvm

    from .fetch import load_module, load_reference
    from .passes import emulate
    from .passes.graph import op_sequence
    from .passes.quantize import QuantizeParams, fold_batch_norm, quantize

    mod = fold_batch_norm(load_module(model_dir))
    x, y_float = load_reference(model_dir)
    n_conv = sum(o.name == "nn.conv2d" for o in op_sequence(mod))
    skip = (0,) if cfg.skip_conv_layers is None else tuple(cfg.skip_conv_layers)  # unset: `steps.with_defaults`
    bad = [i for i in skip if not 0 <= i < n_conv]
    if bad:
        raise ConfigError(
            f"quantize.skip_conv_layers {bad}: the model has {n_conv} conv2d layers (indices 0..{n_conv - 1}); "
            "`vta-pipeline pack-points` lists them"
        )
    params = QuantizeParams(
        act_exp=(cfg.nbit_input - 1) - int(round(math.log2(cfg.global_scale))),
        skip_conv_layers=skip,
        nbit_input=cfg.nbit_input,
        nbit_weight=cfg.nbit_weight,
        quantize_dense=not cfg.skip_dense_layer,
        int8_activations=cfg.dtype_activation == "int8",
    )
    if cfg.calibrate_mode != "global_scale":
        params.var_act_exp = calibrate(mod, cfg, calibration_inputs(cfg, tuple(x.shape), seed))
    qmod, layers = quantize(mod, params)
    if not any(l.quantized for l in layers if l.kind == "conv2d"):
        skipped = [i for i in skip if 0 <= i < n_conv]
        if skipped and len(skipped) >= n_conv:
            raise ConfigError(
                f"quantize found no conv2d layer to quantize: the model has {n_conv} conv2d layer(s) and "
                f"quantize.skip_conv_layers {list(skip)} keeps all of them in float (for VTA and graph pack the "
                "default keeps the first, the stem, in float). Pass --skip-conv-layers '' to quantize every conv"
            )
        raise ModelError(
            "quantize found no conv2d layer to quantize: no conv2d has constant weights "
            "(weights that are inputs of the model cannot be quantized ahead of time)"
        )
    try:
        y_int, _ = emulate.run(qmod, [x])
    except ModelError as e:
        raise ModelError(f"the quantized graph cannot be emulated: {e}") from None
    (out_dir / "module.json").write_text(tvm.ir.save_json(qmod))
    (out_dir / "quantized.py").write_text(qmod.script(show_meta=False))
    (out_dir / "layers.json").write_text(json.dumps([l.to_dict() for l in layers], indent=1))
    np.savez(out_dir / "reference.npz", input=x, output=y_int, float_output=y_float)
    vs_float = agreement(y_int, y_float)
    return {
        "calibrate_mode": cfg.calibrate_mode,
        "conv_layers": sum(l.kind == "conv2d" for l in layers),
        "quantized_layers": sum(l.quantized for l in layers if l.kind == "conv2d"),
        "quantized_dense_layers": sum(l.quantized for l in layers if l.kind == "dense"),
        "float_layers": [l.index for l in layers if not l.quantized and l.kind == "conv2d"],
        "vs_float": vs_float,
    }
