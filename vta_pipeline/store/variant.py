"""Which builds of one model can be compared: the model's variant.

resnet18 in fp32 and resnet18 quantized to int8 are two builds of one model on one board
key, 3x apart in latency by design. The regression guard, `current/` and the history's
nights must compare a night with earlier nights of the same variant only; otherwise an
fp32 night reads as a regression against the int8 build and the wrong build stays current.

The variant is what changes the network that gets built:

* the input shape;
* quantize, when on: its structural options only (which layers stay float, bit widths, the
  activation type between layers). Calibration (scales, data, mode) changes the shift
  amounts, not the kernels, so a new calibration set does not start a new history;
* graph pack, when on, with the VTA config whose BATCH / BLOCK fill its unset factors;
* the CPU's blocked layout and Winograd, when the preset (`opt`) or the layout fields turn
  them on (`presets.recipe`). A config from before the presets has no `opt`: it ran
  plain NCHW, and keeps its variant.

Tuning budgets, measurement and evaluation settings are not part of it: a night with more
trials is the same variant, better tuned, which is what the guard is there to compare.
"""

from __future__ import annotations

from typing import Any

from .hashing import sha256_json, short

# QuantizeConfig fields that change which kernels are built (the others only change scales)
STRUCTURAL_QUANTIZE = ("skip_conv_layers", "skip_dense_layer", "nbit_input", "nbit_weight", "dtype_activation")


def _layout(config: dict[str, Any]) -> dict[str, Any] | None:
    """The blocked layout's recipe of a run's config, or None where it ran without it."""
    if "opt" not in config:
        return None
    from ..presets import recipe
    from ..targets import resolve_target

    try:
        r = recipe(config, resolve_target(config.get("target", "host")))
    except Exception:  # noqa: BLE001 - a target this code cannot resolve any more: as it was recorded
        return None
    return r.to_dict() if r.blocked else None


def label(config: dict[str, Any]) -> str:
    """A readable name: fp32 / int8, then the pack layout and channel block when packed, or
    "blocked" (and "winograd") for the CPU's blocked layout."""
    q, p = config.get("quantize") or {}, config.get("pack") or {}
    name = "int8" if q.get("enabled") else "fp32"
    if p.get("enabled"):
        name += f"-{p.get('layout', 'vta')}" + (f"-c{p['cfactor']}" if p.get("cfactor") else "")
    layout = _layout(config)
    if layout:
        name += "-blocked" + ("-winograd" if layout["winograd"] else "")
    return name


def of(config: dict[str, Any]) -> str:
    """The variant of a run's config (`PipelineConfig.model_dump(mode="json")`): its label
    and a short hash of everything above, e.g. `int8-x86-c16.3f9a12c0d1e2`."""
    q, p = config.get("quantize") or {}, config.get("pack") or {}
    identity = {
        "input_shape": (config.get("model") or {}).get("input_shape"),
        "quantize": {k: q.get(k) for k in STRUCTURAL_QUANTIZE} if q.get("enabled") else None,
        "pack": dict(p, vta=config.get("vta")) if p.get("enabled") else None,
    }
    layout = _layout(config)
    if layout:
        identity["layout"] = layout
    return f"{label(config)}.{short(sha256_json(identity), 12)}"


def of_result(result: dict[str, Any]) -> str:
    """A run result's variant: recorded in it since the variant existed, else from its config."""
    return result.get("variant") or of(result.get("config") or {})
