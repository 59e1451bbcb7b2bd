"""The lowering that extraction and build share: what it must leave in the IR for speed.

Batch norm folded into the conv weights (no batch-norm op survives), every epilogue (bias,
ReLU, residual add, and on the int8 path the requantize shift/clamp/cast) fused into its
conv's kernel, constant weights marked layout-free so tuning may pre-pack them.
"""

from __future__ import annotations

import numpy as np
import torch
import tvm
from int8_nets import TARGET, Blocks, randomize, to_relax
from torch import nn
from tvm import relax

from vta_pipeline.passes.pipeline import lower_for_tuning
from vta_pipeline.passes.quantize import QuantizeParams, fold_batch_norm, quantize


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)

    def forward(self, x):
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + x)


def imported(model: nn.Module, x: np.ndarray) -> tvm.IRModule:
    """The network as the importer gives it: batch norm still in."""
    return to_relax(model, x, fold_bn=False)


def prim_funcs(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}


def run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    ex = tvm.compile(mod, target=TARGET)
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def test_batch_norm_is_folded_into_the_conv_weights():
    model = randomize(Residual(), 0)
    x = np.random.default_rng(0).standard_normal((1, 16, 8, 8)).astype("float32")
    mod = imported(model, x)
    assert "batch_norm" in mod.script(show_meta=False)
    lowered = lower_for_tuning(mod)
    assert "batch_norm" not in lowered.script(show_meta=False)
    assert not any("batch_norm" in n or "rsqrt" in n or "sqrt" in n for n in prim_funcs(lowered))
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(run(lowered, x), ref, rtol=1e-4, atol=1e-4)


def test_bias_relu_and_residual_add_fuse_into_the_conv_kernels():
    x = np.random.default_rng(0).standard_normal((1, 16, 8, 8)).astype("float32")
    funcs = prim_funcs(lower_for_tuning(imported(randomize(Residual(), 0), x)))
    # two kernels in all: conv + folded-BN bias + ReLU, and conv + bias + residual add + ReLU
    assert len(funcs) == 2 and all(n.startswith("fused_conv2d") and "relu" in n for n in funcs), sorted(funcs)
    assert sorted(n.count("_add") for n in funcs) == [1, 2], sorted(funcs)


def test_int8_requantize_fuses_into_the_conv_kernel():
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    q, _ = quantize(fold_batch_norm(imported(randomize(Blocks(), 0), x)), QuantizeParams())
    funcs = prim_funcs(lower_for_tuning(q))
    names = sorted(funcs)
    # c1: accumulate, bias, ReLU, requantize (round, shift, clamp, cast to int8): one kernel
    assert any(
        n.startswith("fused_conv2d")
        and all(op in n for op in ("add", "relu", "right_shift", "minimum", "maximum", "cast"))
        for n in names
    ), names
    # c2: accumulate, shift to the residual's scale, residual add, ReLU: one kernel
    assert any(
        n.startswith("fused_conv2d") and all(op in n for op in ("right_shift", "add", "relu")) and n.count("add") >= 2
        for n in names
    ), names
    assert not any(n.startswith(("add", "relu", "right_shift")) for n in names), names


def test_constant_weights_are_layout_free_on_cpu_layouts_only():
    x = np.random.default_rng(0).standard_normal((1, 16, 8, 8)).astype("float32")
    mod = imported(randomize(Residual(), 0), x)
    nchw = prim_funcs(lower_for_tuning(mod))
    assert all(list(f.attrs["layout_free_buffers"]) for f in nchw.values())  # each kernel's weight
    nhwc = prim_funcs(lower_for_tuning(mod, "NHWC"))
    assert not any(f.attrs and "layout_free_buffers" in f.attrs for f in nhwc.values())
