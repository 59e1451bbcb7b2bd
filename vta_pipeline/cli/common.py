"""Helpers the commands share: user errors as one line and exit status 2, and the flags that
several commands take turned into config overrides."""

from __future__ import annotations

from pathlib import Path

import typer

from vta_pipeline.errors import UserError


def _fail(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _history_store(store: Path | None) -> Path:
    """The store whose history a command reads (`history`, `library export`), or a clear error
    that names the store one level down where compare.py keeps it."""
    from vta_pipeline.history import history_dir

    root = store or Path("vta-store")
    if not history_dir(root).exists():
        nested = sorted(p.parent for p in root.glob("*/history"))
        hint = (
            f"; {nested[0]} has one (benchmarks/compare.py keeps its pipeline store there): pass --store {nested[0]}"
            if nested
            else " (run `vta-pipeline run` or the nightly flow first, or pass --store)"
        )
        _fail(f"no history in {root}: runs append to {history_dir(root)} when they finish{hint}")
    return root


def _shape(s: str | None):
    if s is None:
        return None
    try:
        return [int(x) for x in s.replace("x", ",").split(",")]
    except ValueError:
        _fail(f"--input-shape {s!r} is not N,C,H,W (e.g. 1,3,224,224)")


def _model_overrides(model, source, onnx_path, input_shape) -> dict:
    """The model options shared by `run` and `tasks`, as config overrides."""
    return {
        "model.name": model,
        "model.source": source,
        "model.path": onnx_path and str(onnx_path),
        "model.input_shape": _shape(input_shape),
    }


def _int8_overrides(
    vta,
    vta_config,
    quantize,
    global_scale,
    skip_conv_layers,
    calibrate_mode,
    calibration_data,
    pack,
    pack_start,
    pack_stop,
    pack_start_idx,
    pack_stop_idx,
    bfactor,
    cfactor,
    pack_layout=None,
    pad_channels=None,
    quantize_dense=None,
    pack_stem=None,
    int8_activations=None,
    depthwise_dot=None,
    winograd=None,
    winograd_small_below=None,
) -> dict:
    """The quantize / pack options shared by `run`, `tasks` and `pack-points`, as overrides.
    `--vta` turns both on (an explicit --no-quantize/--no-pack still wins)."""
    skip = None
    if skip_conv_layers is not None:
        try:
            skip = [int(i) for i in skip_conv_layers.split(",") if i.strip()]
        except ValueError:
            _fail(f"--skip-conv-layers {skip_conv_layers!r} is not a comma-separated list of conv indices")
    out = {
        "quantize.enabled": quantize if quantize is not None else (True if vta else None),
        "quantize.global_scale": global_scale,
        "quantize.skip_conv_layers": skip,
        "quantize.calibrate_mode": calibrate_mode,
        "quantize.calibration_data": calibration_data and str(calibration_data),
        "quantize.skip_dense_layer": None if quantize_dense is None else not quantize_dense,
        "quantize.dtype_activation": None if int8_activations is None else "int8" if int8_activations else "int32",
        "pack.enabled": pack if pack is not None else (True if vta else None),
        "pack.start_name": pack_start,
        "pack.stop_name": pack_stop,
        "pack.start_name_idx": pack_start_idx,
        "pack.stop_name_idx": pack_stop_idx,
        "pack.bfactor": bfactor,
        "pack.cfactor": cfactor,
        "pack.layout": pack_layout,
        "pack.pad_channels": pad_channels,
        "pack.stem": pack_stem,
        "pack.depthwise_dot": depthwise_dot,
        "pack.winograd": winograd,
        "pack.winograd_small_below": winograd_small_below,
        # the same flags for the blocked layout of CPU targets (graph pack's when --pack is on)
        "layout.winograd": winograd,
        "layout.winograd_small_below": winograd_small_below,
    }
    if vta_config is not None:
        from vta_pipeline.vta_config import VTAConfig

        out["vta"] = _guard(lambda: VTAConfig.load(vta_config)).model_dump()
    return out


def _opt_overrides(opt, blocked) -> dict:
    """The optimization preset and its layout switch, as overrides."""
    if opt is not None and opt.upper() not in ("O0", "O1", "O2"):
        _fail(
            f"--opt {opt!r}: use O0 (TVM's generic spaces, plain NCHW), O1 (every conv blocked, packed spaces) "
            "or O2 (O1 and Winograd; the default)"
        )
    return {"opt": opt and opt.upper(), "layout.enabled": blocked}


def _config(config, overrides):
    from vta_pipeline.config import build_config, load_config_file

    file_values = load_config_file(config) if config else None
    return build_config(file_values, overrides, source=str(config) if config else "")


def _guard(fn):
    """Run fn, turning user errors into one line and exit status 2."""
    try:
        return fn()
    except UserError as e:
        _fail(str(e))
