"""Graph pack: VTA's blocked layouts between start and stop, exact, with errors that name the op."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from int8_nets import Blocks, build_run, randomize, to_relax

from vta_pipeline.passes import emulate
from vta_pipeline.passes.graph import op_sequence
from vta_pipeline.passes.graph_pack import PackError, PackParams, graph_pack
from vta_pipeline.passes.quantize import QuantizeParams, quantize
from vta_pipeline.vta.config import VTAConfig


@pytest.fixture(scope="module")
def blocks():
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    mod = to_relax(randomize(Blocks(), 0), x)
    return mod, quantize(mod, QuantizeParams())[0], x


def test_vta_config_defaults_and_file(tmp_path):
    from vta_pipeline.errors import ConfigError

    c = VTAConfig()
    assert (c.BATCH, c.BLOCK_IN, c.BLOCK_OUT, c.INP_WIDTH, c.WGT_WIDTH, c.ACC_WIDTH) == (1, 16, 16, 8, 8, 32)
    assert (c.UOP_BUFF_SIZE, c.INP_BUFF_SIZE, c.WGT_BUFF_SIZE, c.ACC_BUFF_SIZE) == (2**15, 2**15, 2**18, 2**17)
    f = tmp_path / "vta_config.json"
    f.write_text(
        '{"TARGET": "sim", "HW_VER": "0.0.2", "LOG_INP_WIDTH": 3, "LOG_WGT_WIDTH": 3, "LOG_ACC_WIDTH": 5,'
        ' "LOG_BATCH": 0, "LOG_BLOCK": 5, "LOG_UOP_BUFF_SIZE": 15, "LOG_INP_BUFF_SIZE": 15,'
        ' "LOG_WGT_BUFF_SIZE": 18, "LOG_ACC_BUFF_SIZE": 17}'
    )
    assert VTAConfig.load(f).BLOCK_OUT == 32 and VTAConfig.load(f).TARGET == "sim"
    f.write_text('{"LOG_BLOK": 4}')
    with pytest.raises(ConfigError, match="LOG_BLOK"):
        VTAConfig.load(f)


def test_packed_int8_network_is_bit_identical_to_the_unpacked_one_and_the_emulation(blocks):
    _, q, x = blocks
    packed, rep = graph_pack(q, PackParams(stop_name="nn.relu", stop_name_idx=4))  # the last op
    y_emu, _ = emulate.run(q, [x])
    assert np.array_equal(build_run(packed, x), y_emu)
    assert "nn.max_pool2d[0]" in rep.start and "nn.relu[4]" in rep.stop
    packed_names = " ".join(rep.packed_ops)
    for op in ("nn.conv2d", "add", "right_shift", "minimum", "maximum", "astype", "nn.avg_pool2d", "concat"):
        assert op in packed_names, op


def test_packed_layouts_are_vtas(blocks):
    _, q, _ = blocks
    packed, _ = graph_pack(q, PackParams(stop_name="nn.relu", stop_name_idx=4))
    convs = [o for o in op_sequence(packed) if o.name == "nn.conv2d"]
    regular = [c for c in convs if int(c.call.attrs.groups) == 1 and str(c.call.attrs.data_layout) != "NCHW"]
    assert regular, "no packed conv"
    for c in regular:
        a = c.call.attrs
        assert (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) == ("NCHW1n16c", "OIHW16o16i", "NCHW1n16c")
        w = c.call.args[1].value.numpy()
        assert w.ndim == 6 and w.shape[4:] == (16, 16) and w.dtype == np.int8
        assert len(c.in_shapes[0]) == 6 and c.in_shapes[0][4:] == (1, 16)


def test_start_and_stop_indices_pick_the_kth_occurrence(blocks):
    mod, _, x = blocks
    first, r1 = graph_pack(
        mod, PackParams(start_name="nn.relu", start_name_idx=0, stop_name="nn.relu", stop_name_idx=3)
    )
    later, r2 = graph_pack(
        mod, PackParams(start_name="nn.relu", start_name_idx=1, stop_name="nn.relu", stop_name_idx=3)
    )
    assert "nn.relu[0]" in r1.start and "nn.relu[1]" in r2.start and "nn.relu[3]" in r1.stop
    assert len(r1.packed_ops) > len(r2.packed_ops) > 0
    np.testing.assert_allclose(build_run(later, x), build_run(mod, x), rtol=1e-4, atol=1e-4)


def test_bad_pack_points_fail_with_the_operator_and_its_index(blocks):
    mod, _, _ = blocks
    with pytest.raises(PackError, match=r"'nn.conv2d_transpose' is not in the network \(it has: .*nn.max_pool2d"):
        graph_pack(mod, PackParams(start_name="nn.conv2d_transpose"))
    with pytest.raises(PackError, match=r"start_name_idx 3: the network has only 1 occurrence"):
        graph_pack(mod, PackParams(start_name_idx=3))
    # cfactor 32 does not divide the 16-channel block: the first conv of the region is named
    with pytest.raises(PackError, match=r"cannot pack #\d+ nn.conv2d\[1\] \(1x16x8x8, 16x16x3x3\).*cfactor=32"):
        graph_pack(mod, PackParams(cfactor=32, stop_name="nn.relu", stop_name_idx=4))


def test_an_operator_without_a_packed_form_stops_packing_before_tuning():
    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x):
            y = torch.nn.functional.max_pool2d(x, 2)
            y = torch.relu(self.c(y))
            return torch.relu(y.transpose(2, 3)).mean(dim=(2, 3), keepdim=True)

    x = np.ones((1, 16, 8, 8), "float32")
    with pytest.raises(PackError, match=r"cannot pack #\d+ permute_dims\[0\] \(1x16x4x4\) -> 1x16x4x4: permute_dims"):
        graph_pack(to_relax(Flat(), x), PackParams())


@pytest.mark.parametrize("layout", ["vta", "x86"])
def test_the_start_operators_bias_activation_and_requantize_stay_unpacked_with_it(blocks, layout):
    # packed from c1 (an int8 conv): its bias, ReLU and requantize fuse into its kernel and the
    # pack moves the int8 result; before, a second kernel packed c1's int32 output and then
    # added, shifted and clamped it (mobilenet_v2 from its stem: 0.62 ms of 6.4)
    from vta_pipeline.passes.graph import dtype_of
    from vta_pipeline.passes.pipeline import lower_for_tuning

    _, q, x = blocks
    packed, rep = graph_pack(
        q, PackParams(start_name="nn.conv2d", start_name_idx=1, stop_name="nn.relu", stop_name_idx=4, layout=layout)
    )
    assert rep.start.startswith("#13 nn.conv2d[1]")
    first_pack = next(o for o in op_sequence(packed) if o.name == "permute_dims")
    assert dtype_of(first_pack.call.args[0]) == "int8"
    kernels = [gv.name_hint for gv in lower_for_tuning(packed).functions]
    assert any(k.startswith("fused_conv2d1_add1_relu1") and k.endswith("cast11") for k in kernels), kernels
    assert np.array_equal(build_run(packed, x), emulate.run(q, [x])[0])


def test_fp32_networks_pack_too(blocks):
    mod, _, x = blocks
    packed, rep = graph_pack(mod, PackParams(stop_name="nn.relu", stop_name_idx=4))
    assert rep.packed_ops
    np.testing.assert_allclose(build_run(packed, x), build_run(mod, x), rtol=1e-4, atol=1e-4)


class Narrow(torch.nn.Module):
    """mobilenet_v2's shapes that blocks of 16 do not divide: a 24-channel residual, a 40-channel
    expansion and its depthwise conv."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.project = nn.Conv2d(16, 24, 1)
        self.expand = nn.Conv2d(24, 40, 1)
        self.dw = nn.Conv2d(40, 40, 3, padding=1, groups=40)
        self.shrink = nn.Conv2d(40, 24, 1)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        y = torch.nn.functional.relu6(self.project(x))
        z = self.shrink(torch.nn.functional.relu6(self.dw(torch.nn.functional.relu6(self.expand(y)))))
        return torch.relu(z + y)


STOP_AT = {"stop_name": "nn.relu", "stop_name_idx": 1}  # the last op: packed to the network's end
STOP = PackParams(**STOP_AT)


@pytest.fixture(scope="module")
def narrow():
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32")
    mod = to_relax(randomize(Narrow(), 1), x)
    return mod, quantize(mod, QuantizeParams())[0], x


def test_channels_the_block_does_not_divide_are_refused_with_the_fix_named(narrow):
    mod, _, _ = narrow
    with pytest.raises(
        PackError,
        match=r"cannot pack #\d+ nn.conv2d\[1\] .*cfactor=16 \(cfactor=8 divides them: "
        r"--cfactor 8; or pad them to the block: --pad-channels",
    ):
        graph_pack(mod, STOP)


@pytest.mark.parametrize("layout", ["vta", "x86"])
def test_padded_channels_pack_in_blocks_of_16_and_change_no_value(narrow, layout):
    # 24 and 40 channels run as 32 and 48 (two and three blocks of 16), the padding zero
    _, q, x = narrow
    packed, rep = graph_pack(q, PackParams(layout=layout, pad_channels=True, **STOP_AT))
    assert np.array_equal(build_run(packed, x), emulate.run(q, [x])[0])
    convs = [o for o in op_sequence(packed) if o.name == "nn.conv2d" and str(o.call.attrs.data_layout) != "NCHW"]
    weights = {(int(c.call.attrs.groups), c.call.args[1].value.numpy().shape[:2]) for c in convs}
    assert weights == {
        (1, (2, 4 if layout == "x86" else 1)),
        (1, (3, 8 if layout == "x86" else 2)),
        (48, (3, 1)),
        (1, (2, 12 if layout == "x86" else 3)),
    }, weights
    assert all(
        o.out_shape[1] % 16 == 0
        for o in op_sequence(packed)
        if o.name == "nn.conv2d" and str(o.call.attrs.data_layout) == "NCHW"
    )  # no unpacked conv took a padded input
    assert [o.name for o in op_sequence(packed)].count("nn.pad") == 0  # the stem's 16 channels need none
    assert "strided_slice" in [o.name for o in op_sequence(packed)]  # the 24-channel output, unpadded


def test_padded_fp32_network_agrees_with_the_unpacked_one(narrow):
    mod, _, x = narrow
    packed, _ = graph_pack(mod, PackParams(pad_channels=True, **STOP_AT))
    np.testing.assert_allclose(build_run(packed, x), build_run(mod, x), rtol=1e-4, atol=1e-4)


class Pooled(torch.nn.Module):
    """A network and a classifier's global average pool after it, as resnet and mobilenet end."""

    def __init__(self, body: torch.nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(x).mean(dim=(2, 3), keepdim=True).flatten(1)


@pytest.mark.parametrize("batch, bfactor", [(1, 1), (2, 2)])
def test_a_global_mean_at_the_stop_reads_the_blocks_without_unpacking_them(batch, bfactor):
    # resnet18 fp32 on the AMX Xeon: the unpack before its pool was a kernel of its own that
    # transposed the last feature map (0.07 ms in the network); 24 channels padded to 32 too
    x = np.random.default_rng(2).standard_normal((batch, 3, 16, 16)).astype("float32")
    mod = to_relax(randomize(Pooled(Narrow()), 2), x)
    packed, rep = graph_pack(mod, PackParams(pad_channels=True, bfactor=bfactor))
    assert "mean" in rep.stop
    ops = op_sequence(packed)
    last_conv = max(o.index for o in ops if o.name == "nn.conv2d")
    after = [o for o in ops if o.index > last_conv]
    assert "permute_dims" not in [o.name for o in after if len(o.in_shapes[0] or ()) == 6]  # no unpack
    mean = next(o for o in after if o.name == "mean")
    assert mean.in_shapes[0] == (batch // bfactor, 2, 8, 8, bfactor, 16)  # the blocks, as they are
    assert "strided_slice" in [o.name for o in after]  # the 8 channels of padding, dropped
    np.testing.assert_allclose(build_run(packed, x), build_run(mod, x), rtol=1e-4, atol=1e-5)


def test_a_global_mean_of_an_int8_network_changes_no_value(narrow):
    _, _, x = narrow
    q = quantize(to_relax(randomize(Pooled(Narrow()), 1), x), QuantizeParams())[0]
    packed, _ = graph_pack(q, PackParams(layout="x86", pad_channels=True))
    mean = next(o for o in op_sequence(packed) if o.name == "mean")
    assert len(mean.in_shapes[0]) == 6
    # the integer convs are exact and the mean adds each channel's numbers in the same order
    assert np.array_equal(build_run(packed, x), build_run(q, x))


def test_a_concat_of_padded_tensors_is_refused(blocks):
    mod, _, _ = blocks
    with pytest.raises(PackError, match=r"concat.*16 channels, which the block cfactor=32 does not divide"):
        graph_pack(mod, PackParams(cfactor=32, pad_channels=True, stop_name="nn.relu", stop_name_idx=4))


# ---- a packed stem: the image's 3 channels as one block of 4 --------------------------------------
FROM_THE_STEM = {"start_name": "nn.conv2d", "stop_name": "nn.relu", "stop_name_idx": 4}


@pytest.fixture(scope="module")
def int8_stem(blocks):
    mod, _, x = blocks
    return quantize(mod, QuantizeParams(skip_conv_layers=()))[0], x  # the stem quantized too


def test_a_packed_int8_stem_reads_the_image_as_one_block_of_4_channels_and_changes_no_value(int8_stem):
    # resnet18's stem as int8 for the CPU's dot product: before it, a 3-channel int8 NCHW conv
    # got MetaSchedule's generic space (6.08 ms against 1.76 for ORT's int8 stem)
    q, x = int8_stem
    packed, rep = graph_pack(q, PackParams(layout="x86", stem=True, **FROM_THE_STEM))
    assert rep.stem and rep.packed_ops[0] == rep.start and "nn.conv2d[0]" in rep.start
    convs = [o for o in op_sequence(packed) if o.name == "nn.conv2d"]
    assert all(str(c.call.attrs.data_layout) != "NCHW" for c in convs)  # no conv left unpacked
    stem = convs[0].call
    assert (str(stem.attrs.data_layout), str(stem.attrs.kernel_layout), str(stem.attrs.out_layout)) == (
        "NCHW1n4c",
        "OIHW16o4i",
        "NCHW1n16c",
    )
    w = stem.args[1].value.numpy()
    assert w.shape == (1, 1, 3, 3, 16, 4) and w.dtype == np.int8 and not w[..., 3].any()  # the 4th channel: zeros
    assert convs[0].in_shapes[0] == (1, 1, 16, 16, 1, 4)
    assert np.array_equal(build_run(packed, x), emulate.run(q, [x])[0])


def test_a_packed_fp32_stem_agrees_with_the_unpacked_network(blocks):
    mod, _, x = blocks
    packed, rep = graph_pack(mod, PackParams(stem=True, **FROM_THE_STEM))
    stem = next(o for o in op_sequence(packed) if o.name == "nn.conv2d").call
    # no channel padding in float: the image's 3 channels are the block
    assert (str(stem.attrs.data_layout), str(stem.attrs.kernel_layout)) == ("NCHW1n3c", "OIHW16o3i")
    assert stem.args[1].value.numpy().dtype == np.float32
    np.testing.assert_allclose(build_run(packed, x), build_run(mod, x), rtol=1e-4, atol=1e-4)


def test_a_stem_that_cannot_pack_is_refused_with_the_reason(blocks, int8_stem):
    mod, _, _ = blocks
    q, _ = int8_stem
    with pytest.raises(PackError, match=r"stem #\d+ nn.max_pool2d\[0\].*not a conv2d.*--pack-start nn.conv2d"):
        graph_pack(mod, PackParams(stem=True, stop_name="nn.relu", stop_name_idx=4))
    with pytest.raises(PackError, match=r"stem #\d+ nn.conv2d\[1\].*16 channels, which pack in the block"):
        graph_pack(
            mod, PackParams(stem=True, start_name="nn.conv2d", start_name_idx=1, stop_name="nn.relu", stop_name_idx=4)
        )
    with pytest.raises(PackError, match=r"int8 stem packs for the CPU's dot product.*--pack-layout x86"):
        graph_pack(q, PackParams(stem=True, **FROM_THE_STEM))
