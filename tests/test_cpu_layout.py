"""The CPU layout: every conv2d of any network blocked NCHW[x]c, a layout transform only where a
blocked tensor meets an operator that needs NCHW, the output unchanged; and the presets that make
it the default of CPU targets.

The networks are small versions of the shapes users bring (the issue's two-conv ONNX network
with channel counts 16 does not divide, depthwise + squeeze-excitation + swish/hardswish,
channel split/concat/shuffle with odd channels, grouped convs and no pool at all, a fire module
with a ceil-mode max pool that ends in a conv). Each is imported through TVM's real PyTorch
frontend, rewritten, built with Relax's default lowering and compared with PyTorch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from int8_nets import Blocks, build_run, randomize, to_relax
from torch import nn
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from vta_pipeline import cpu_layout as layout_step
from vta_pipeline.config import build_config
from vta_pipeline.passes import emulate
from vta_pipeline.passes.cpu_layout import LayoutParams, block_for, cpu_layout, params_for
from vta_pipeline.passes.graph import op_sequence
from vta_pipeline.passes.quantize import QuantizeParams, quantize
from vta_pipeline.targets import resolve_target
from vta_pipeline.tir import intrin_registry


class TwoConv(nn.Module):  # the network: 72 -> 120 3x3, 120 -> 40 1x1
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(72, 120, 3, padding=1), nn.Conv2d(120, 40, 1)

    def forward(self, x):
        return torch.relu(self.b(torch.relu(self.a(x))))


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, r: int):
        super().__init__()
        self.f1, self.f2 = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.f2(nn.functional.silu(self.f1(x.mean((2, 3), keepdim=True)))))


class MBConv(nn.Module):  # efficientnet / mobilenet_v3 in small: 24, 72 and 18 channels
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 24, 3, 2, 1)
        self.expand, self.dw = nn.Conv2d(24, 72, 1), nn.Conv2d(72, 72, 3, 1, 1, groups=72)
        self.se, self.proj = SqueezeExcite(72, 18), nn.Conv2d(72, 24, 1)
        self.head, self.fc = nn.Conv2d(24, 40, 1), nn.Linear(40, 10)

    def forward(self, x):
        x = nn.functional.hardswish(self.stem(x))
        x = x + self.proj(self.se(nn.functional.silu(self.dw(nn.functional.relu6(self.expand(x))))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(nn.functional.silu(self.head(x)), 1), 1))


class Shuffle(nn.Module):  # shufflenet_v2's unit: split, branch, concat, channel shuffle; 116 = 2 x 58
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 116, 3, 2, 1)
        self.a, self.dw, self.b = nn.Conv2d(58, 58, 1), nn.Conv2d(58, 58, 3, 1, 1, groups=58), nn.Conv2d(58, 58, 1)

    def forward(self, x):
        x1, x2 = torch.relu(self.stem(x)).chunk(2, dim=1)
        out = torch.cat((x1, torch.relu(self.b(self.dw(torch.relu(self.a(x2)))))), 1)
        n, c, h, w = out.shape
        return out.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)


class Grouped(nn.Module):  # regnet's block: grouped 3x3 of 16-channel groups, a residual; no pool
    def __init__(self):
        super().__init__()
        self.stem, self.a = nn.Conv2d(3, 32, 3, 2, 1), nn.Conv2d(32, 64, 1)
        self.g, self.b = nn.Conv2d(64, 64, 3, 1, 1, groups=4), nn.Conv2d(64, 32, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        return torch.relu(x + self.b(torch.relu(self.g(torch.relu(self.a(x))))))


class Fire(nn.Module):  # squeezenet's fire module; ends in a conv of 10 channels (no classifier)
    def __init__(self):
        super().__init__()
        self.stem, self.squeeze = nn.Conv2d(3, 64, 3, 2), nn.Conv2d(64, 16, 1)
        self.e1, self.e3, self.out = nn.Conv2d(16, 64, 1), nn.Conv2d(16, 64, 3, padding=1), nn.Conv2d(128, 10, 1)

    def forward(self, x):
        x = torch.relu(self.squeeze(nn.functional.max_pool2d(torch.relu(self.stem(x)), 3, 2, ceil_mode=True)))
        return torch.relu(self.out(torch.cat([torch.relu(self.e1(x)), torch.relu(self.e3(x))], 1)))


# network, input shape, the layout transforms the pass adds (only at the network's edges, and
# around the shuffle, which runs in NCHW)
NETWORKS = {
    "two_conv": (TwoConv, (1, 72, 20, 20), {"pack": 1, "unpack": 1}),
    "mbconv": (MBConv, (1, 3, 32, 32), {"pack": 1, "unpack": 1}),
    "shuffle": (Shuffle, (1, 3, 32, 32), {"pack": 2, "unpack": 2}),
    "grouped": (Grouped, (1, 3, 32, 32), {"pack": 1, "unpack": 1}),
    "fire": (Fire, (1, 3, 33, 33), {"pack": 1, "unpack": 1}),
}


def _network(name: str):
    cls, shape, transforms = NETWORKS[name]
    model = randomize(cls(), 0)
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    return to_relax(model, x), x, ref, transforms


@pytest.mark.parametrize("name", list(NETWORKS))
def test_every_conv_of_each_kind_of_network_is_blocked_and_its_output_equals_pytorchs(name):
    mod, x, ref, transforms = _network(name)
    out, rep = cpu_layout(mod)
    assert rep.convs == rep.blocked_convs > 0 and rep.plain_convs == []
    convs = [o for o in op_sequence(out) if o.name == "nn.conv2d"]
    assert len(convs) == rep.convs
    assert all(str(c.call.attrs.data_layout).startswith("NCHW1n") for c in convs)
    assert dict(rep.transforms) == transforms
    np.testing.assert_allclose(build_run(out, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)


def test_no_layout_transform_stands_between_two_convs():
    """Every permute in the rewritten network is one of the pass's packs or unpacks, and the
    convs of the issue's network read one another's blocks directly."""
    mod, *_ = _network("two_conv")
    out, rep = cpu_layout(mod)
    permutes = [o for o in op_sequence(out) if o.name == "permute_dims"]
    assert len(permutes) == sum(rep.transforms.values()) == 2
    first, second = (o for o in op_sequence(out) if o.name == "nn.conv2d")
    # the second conv's input is the first's (its bias and ReLU applied blocked), no transform between
    between = [o.name for o in op_sequence(out) if first.index < o.index < second.index]
    assert set(between) <= {"add", "nn.relu"}


def test_squeeze_excitation_and_hardswish_run_blocked_and_clip_fuses_as_maximum_and_minimum():
    mod, *_ = _network("mbconv")
    out, rep = cpu_layout(mod)
    names = [o.name for o in op_sequence(out)]
    assert "clip" not in names and {"maximum", "minimum", "sigmoid", "multiply", "mean"} <= set(names)
    assert set(rep.nchw_ops) <= {"reshape"}  # only the classifier's flatten runs in NCHW


def test_blocked_sigmoid_and_swish_are_vector_polynomials_not_libm_calls_and_plain_ones_stay_exact():
    """A sigmoid's exp left to LLVM is a call to libm's expf per lane (x86 has no vector exp):
    inside a conv's write-back every call spills the register tile. Blocked tensors take TOPI's
    polynomial instead; a plain NCHW network (O0) keeps Relax's own lowering."""
    from vta_pipeline.passes.pipeline import lower_for_tuning

    mod, x, ref, _ = _network("mbconv")
    blocked = lower_for_tuning(cpu_layout(mod)[0])
    names = [gv.name_hint for gv in blocked.functions]
    assert any("fast_sigmoid" in n for n in names) and not any("tir_sigmoid" in n for n in names)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    asm = tvm.compile(blocked, target=target).mod.imports[0].inspect_source("asm")
    assert "expf" not in asm
    vm = relax.VirtualMachine(tvm.compile(blocked, target=target), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy().reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    plain = [gv.name_hint for gv in lower_for_tuning(mod).functions]
    assert any("sigmoid" in n for n in plain) and not any("fast_" in n for n in plain)


def test_a_channel_shuffle_runs_in_nchw_and_the_rest_stays_blocked():
    mod, *_ = _network("shuffle")
    _, rep = cpu_layout(mod)
    assert rep.nchw_ops["split"] == 1 and rep.nchw_ops["concat"] == 1  # 58 channels: padded blocks
    assert rep.padded_convs == 4


@pytest.mark.parametrize(
    "channels, block, padded",
    [
        (64, 16, 64),
        (512, 16, 512),
        (24, 8, 24),
        (72, 8, 72),
        (40, 8, 40),
        (58, 16, 64),
        (116, 8, 120),
        (3, 3, 3),
        (1, 1, 1),
    ],
)
def test_the_block_follows_the_channel_count(channels, block, padded):
    assert block_for(channels, LayoutParams()) == (block, padded)


def test_int8_tensors_of_an_image_pad_to_the_dot_products_four_channels_and_arm_takes_narrower_blocks():
    assert block_for(3, LayoutParams(), int8=True) == (4, 4)
    arm = params_for({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})
    assert (arm.lanes, arm.narrow) == (8, 4) and block_for(12, arm) == (4, 12)
    assert params_for({"kind": "llvm", "mcpu": "znver3"}) == LayoutParams()


def test_an_int8_network_blocked_is_bit_identical_to_the_unblocked_one_and_the_emulation():
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    q = quantize(to_relax(randomize(Blocks(), 0), x), QuantizeParams())[0]
    out, rep = cpu_layout(q)
    assert rep.convs == rep.blocked_convs and rep.uint8_convs > 0
    kernels = {str(o.call.attrs.kernel_layout) for o in op_sequence(out) if o.name == "nn.conv2d"}
    assert "OIHW16o4i" in kernels  # the dot product's weights
    y_emu, _ = emulate.run(q, [x])
    assert np.array_equal(build_run(out, x), y_emu)


def test_a_tuned_build_from_the_packed_spaces_equals_pytorch(tmp_path):
    """One sampled candidate of every task (grouped convs take the packed conv space too), built
    as the build step builds, equals PyTorch's output."""
    from vta_pipeline.build import LIB, build_network
    from vta_pipeline.passes.pipeline import lower_for_tuning
    from vta_pipeline.spaces import design_space
    from vta_pipeline.spaces import label as space_label

    intrin_registry.load()
    spec = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}
    target = tvm.target.Target(spec)
    mod, x, ref, _ = _network("grouped")
    lowered = lower_for_tuning(cpu_layout(mod)[0])
    for d in ("extract", "out", "db"):
        (tmp_path / d).mkdir()
    (tmp_path / "extract" / "lowered.json").write_text(tvm.ir.save_json(lowered))
    db = ms.database.JSONDatabase(work_dir=str(tmp_path / "db"))
    labels = []
    for task in ms.relax_integration.extract_tasks(lowered, target):
        wl = task.dispatched[0]
        labels.append(space_label(target, wl))
        for seed in range(1, 40):
            ctx = ms.TuneContext(
                mod=wl, target=target, space_generator=design_space(target, wl), task_name="t", rand_state=seed * 7919
            )
            spaces = ctx.generate_design_space()
            sch = spaces[seed % len(spaces)]
            if all(p.apply(sch) for p in ctx.space_generator.postprocs):
                db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(wl), [1e-3], target))
                break
    assert sum(lb.startswith("packed-conv:float") for lb in labels) == 4  # the grouped conv among them
    build_network(tmp_path / "extract", spec, tmp_path / "out", best_db_dir=tmp_path / "db")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "out" / LIB)), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), ref, rtol=1e-4, atol=1e-4)


# ---- the presets ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, target, blocked, winograd",
    [
        ({}, "host", True, True),  # a user who passes nothing
        ({"opt": "O1"}, "host", True, False),
        ({"opt": "O0"}, "host", False, False),
        ({"layout.winograd": False}, "host", True, False),
        ({"opt": "O0", "layout.enabled": True}, "host", True, False),
        ({"pack.enabled": True}, "host", False, False),  # graph pack's layout instead
        ({"quantize.enabled": True}, "rk3399-cpu", True, True),  # ARM too; Winograd only takes float convs
        ({}, "cuda", False, False),
        ({"quantize.enabled": True, "pack.enabled": True}, "vta-sim", False, False),
    ],
)
def test_the_fast_path_is_the_default_of_every_cpu_target_and_flags_override_it(overrides, target, blocked, winograd):
    cfg = build_config(None, {"target": target, **overrides})
    r = layout_step.recipe(cfg, resolve_target(target))
    assert (r.blocked, r.winograd) == (blocked, winograd)


def test_a_blocked_night_is_a_variant_of_its_own_and_a_night_from_before_the_presets_keeps_its_variant():
    from vta_pipeline.store import variant

    default = build_config(None, {}).model_dump(mode="json")
    plain = build_config(None, {"opt": "O0"}).model_dump(mode="json")
    before = {k: v for k, v in plain.items() if k not in ("opt", "layout")}  # a result recorded before `opt`
    assert variant.of(default).startswith("fp32-blocked-winograd.")
    assert variant.of(plain) == variant.of(before) != variant.of(default)
