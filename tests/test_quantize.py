"""Quantize: relay.quantize's rules as a Relax rewrite, bit-exact against the numpy emulation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from int8_nets import Blocks, SmallCNN, build_run, randomize, to_relax, train_small_cnn

from vta_pipeline.config import ModelConfig, QuantizeConfig
from vta_pipeline.errors import ConfigError
from vta_pipeline.passes import emulate
from vta_pipeline.passes.graph import dtype_of, main_bindings, op_name, op_sequence
from vta_pipeline.passes.quantize import QuantizeParams, Quantizer, quantize
from vta_pipeline.quantize import calibrate


@pytest.fixture(scope="module")
def blocks():
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    return to_relax(randomize(Blocks(), 0), x), x


def _ops(mod):
    return [o.name for o in op_sequence(mod)]


def test_tvm_int8_graph_is_bit_exact_against_the_numpy_integer_emulation(blocks):
    mod, x = blocks
    for skip in ((), (0,)):
        q, layers = quantize(mod, QuantizeParams(skip_conv_layers=skip))
        y_tvm = build_run(q, x)
        y_emu, _ = emulate.run(q, [x])
        assert np.array_equal(y_tvm, y_emu), f"skip={skip}: max diff {np.abs(y_tvm - y_emu).max()}"
        assert sum(l.quantized for l in layers) == 7 - len(skip)


def test_the_emulation_follows_the_recipe_arithmetic_written_out_by_hand():
    """conv -> relu -> conv at global_scale 8 (activations at 2^-4), no layer skipped:
    the rules computed independently of the graph interpreter."""
    import torch

    from vta_pipeline.passes.emulate import conv2d

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(16, 16, 3, padding=1)
            self.b = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(1)
    net = Two().eval()
    x = np.random.default_rng(1).standard_normal((1, 16, 8, 8)).astype("float32")
    q, _ = quantize(to_relax(net, x), QuantizeParams(skip_conv_layers=()))
    wa, ba = net.a.weight.detach().numpy(), net.a.bias.detach().numpy()
    wb = net.b.weight.detach().numpy()

    def wq(w):
        e = 7 - int(np.ceil(np.log2(np.abs(w).max())))
        return np.clip(np.round(w.astype(np.float64) * 2.0**e), -127, 127).astype(np.int64), e

    xq = np.clip(np.round(x * np.float32(16)), -127, 127).astype(np.int64)
    qa, ea = wq(wa)
    acc = conv2d(xq, qa, (1, 1), (1, 1, 1, 1), (1, 1), 1, True)
    acc = np.maximum(acc + np.round(ba * 2.0 ** (4 + ea)).astype(np.int64)[None, :, None, None], 0)
    k = 4 + ea - 4
    hq = np.clip((acc + (1 << (k - 1))) >> k, -127, 127)
    qb, eb = wq(wb)
    expected = conv2d(hq, qb, (1, 1), (1, 1, 1, 1), (1, 1), 1, True).astype(np.float32) * np.float32(2.0 ** -(4 + eb))
    assert np.array_equal(build_run(q, x), expected)


def test_skip_conv_layers_keeps_those_convs_float(blocks):
    mod, _ = blocks
    q, layers = quantize(mod, QuantizeParams(skip_conv_layers=(0, 3)))
    assert [l.index for l in layers if not l.quantized] == [0, 3]
    convs = [o for o in op_sequence(q) if o.name == "nn.conv2d"]
    dtypes = [str(o.var.ty.dtype) for o in convs]
    assert dtypes[0] == dtypes[3] == "float32" and dtypes.count("int32") == 5


def _pool_input_dtypes(mod):
    return [dtype_of(o.call.args[0]) for o in op_sequence(mod) if o.name == "nn.max_pool2d"]


def test_a_float_max_pool_whose_output_is_only_quantized_pools_the_int8_values(blocks):
    """resnet18's shape: a float stem conv (skipped), relu, max pool, then quantized convs and
    a residual add. Quantizing before the pool gives the same values (quantizing is
    monotonic), fuses the quantize into the stem conv's kernel and pools int8."""
    from vta_pipeline.passes.pipeline import lower_for_tuning

    mod, x = blocks
    params = QuantizeParams(skip_conv_layers=(0,))
    q, _ = quantize(mod, params)
    pool_after = Quantizer(params).run(mod)  # the rule off: the float pool, quantized after it
    assert _pool_input_dtypes(q) == ["int8"] and _pool_input_dtypes(pool_after) == ["float32"]
    y = build_run(q, x)
    assert np.array_equal(y, build_run(pool_after, x))
    assert np.array_equal(y, emulate.run(q, [x])[0])
    stem = [gv.name_hint for gv in lower_for_tuning(q).functions if gv.name_hint.startswith("fused_conv2d_")]
    assert any("round" in f and f.endswith("cast1") for f in stem), stem  # the stem's kernel quantizes


class _StemPoolConv(torch.nn.Module):
    """A stem conv, relu, max pool, then a conv: the pool's output only enters a conv."""

    def __init__(self):
        super().__init__()
        self.stem, self.c = torch.nn.Conv2d(3, 16, 7, 2, 3), torch.nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.c(torch.nn.functional.max_pool2d(torch.relu(self.stem(x)), 3, 2, 1)))


def test_an_int8_stems_max_pool_pools_the_requantized_int8_values():
    """The stem quantized too (`--skip-conv-layers ''`, for the int8 stem): the pool reads the
    requantized int8 value instead of the stem's int32 accumulator. Same values (requantizing
    is monotonic); the requantize fuses into the stem's kernel (resnet18's int32 pool: 0.18 ms)."""
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    mod = to_relax(randomize(_StemPoolConv(), 0), x)
    params = QuantizeParams(skip_conv_layers=())
    q, _ = quantize(mod, params)
    pool_after = Quantizer(params).run(mod)  # the rule off: the int32 pool, requantized after it
    assert _pool_input_dtypes(q) == ["int8"] and _pool_input_dtypes(pool_after) == ["int32"]
    y = build_run(q, x)
    assert np.abs(y).max() > 0 and np.array_equal(y, build_run(pool_after, x))
    assert np.array_equal(y, emulate.run(q, [x])[0])


class _PoolAlsoReadFloat(torch.nn.Module):
    """A pooled value that a quantized conv reads and a float mean reads too."""

    def __init__(self):
        super().__init__()
        self.stem, self.c = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        p = torch.nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        return torch.relu(self.c(p)), p.mean((2, 3))


def test_a_max_pool_that_a_float_op_also_reads_stays_float():
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    mod = to_relax(randomize(_PoolAlsoReadFloat(), 0), x)
    assert _pool_input_dtypes(quantize(mod, QuantizeParams(skip_conv_layers=(0,)))[0]) == ["float32"]
    # the stem quantized: the pool reads its int32 accumulator, as before
    assert _pool_input_dtypes(quantize(mod, QuantizeParams(skip_conv_layers=()))[0]) == ["int32"]


def test_weight_scales_are_powers_of_two_that_use_the_int8_range(blocks):
    mod, _ = blocks
    q, layers = quantize(mod, QuantizeParams())
    float_w = {o.index: o.call.args[1] for o in op_sequence(mod) if o.name == "nn.conv2d"}
    convs = [o for o in op_sequence(q) if o.name == "nn.conv2d"]
    for layer, conv in zip(layers, convs):
        if not layer.quantized:
            continue
        w = float_w[[o.index for o in op_sequence(mod) if o.name == "nn.conv2d"][layer.index]].value.numpy()
        wq = conv.call.args[1].value.numpy()
        assert wq.dtype == np.int8 and 64 <= np.abs(wq).max() <= 127
        np.testing.assert_array_equal(wq, np.clip(np.round(w.astype(np.float64) * 2.0**layer.weight_exp), -127, 127))
        assert layer.acc_exp == layer.act_exp + layer.weight_exp


def test_requantization_is_shift_and_min_max_and_fuses_into_the_conv(blocks):
    from vta_pipeline.passes.pipeline import lower_for_tuning

    mod, _ = blocks
    q, _ = quantize(mod, QuantizeParams())
    names = _ops(q)
    assert "right_shift" in names and "minimum" in names and "maximum" in names
    assert "clip" in _ops(mod) and "clip" not in names  # relu6 too becomes min/max on int32
    fused = [gv.name_hint for gv in lower_for_tuning(q).functions if "conv2d" in gv.name_hint]
    assert any("right_shift" in f and "cast" in f for f in fused), fused


def test_global_scale_must_be_a_power_of_two_and_skip_indices_must_exist(tmp_path, store):
    with pytest.raises(ValueError, match="power of two"):
        QuantizeConfig(global_scale=6.0)
    from vta_pipeline import steps

    fetched = steps.fetch_step(store, ModelConfig(source="builtin", name="micronet"))
    with pytest.raises(ConfigError, match=r"skip_conv_layers \[7\].*2 conv2d layers"):
        steps.quantize_step(store, fetched, QuantizeConfig(enabled=True, skip_conv_layers=(7,)))
    bad = tmp_path / "calib.npy"
    np.save(bad, np.zeros((4, 3, 8, 8), "float32"))
    with pytest.raises(ConfigError, match=r"calib.npy has shape \[4, 3, 8, 8\].*\(B, 3, 16, 16\)"):
        steps.quantize_step(store, fetched, QuantizeConfig(enabled=True, calibrate_mode="max", calibration_data=bad))


def test_calibrated_scales_follow_the_data(blocks):
    mod, x = blocks
    cfg = QuantizeConfig(calibrate_mode="max")
    small = calibrate(mod, cfg, [x * 0.01])
    large = calibrate(mod, cfg, [x * 10])
    assert small and set(small) == set(large)
    assert all(small[v] > large[v] for v in small)  # smaller activations -> finer scale
    q, layers = quantize(mod, QuantizeParams(var_act_exp=large))
    y_tvm, (y_emu, _) = build_run(q, x * 10), emulate.run(q, [x * 10])
    assert np.array_equal(y_tvm, y_emu)


def _matmuls(mod):
    """(input dtype, weight dtype, output dtype) of each matmul in main."""
    return [
        (dtype_of(b.value.args[0]), dtype_of(b.value.args[1]), dtype_of(b.var))
        for b in main_bindings(mod)
        if op_name(b.value) == "matmul"
    ]


def test_quantize_dense_makes_the_classifier_int8_x_int8_and_stays_bit_exact():
    """relay's skip_dense_layer=False: the classifier reads int8 activations and int8 weights
    (4x fewer weight bytes per run) into int32, its bias add stays int32 and only the
    network's output is dequantized. The default keeps it float, as relay.quantize did."""
    x = np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype("float32")
    mod = to_relax(randomize(SmallCNN(), 0), x)
    assert _matmuls(quantize(mod, QuantizeParams())[0]) == [("float32", "float32", "float32")]
    q, layers = quantize(mod, QuantizeParams(quantize_dense=True))
    assert _matmuls(q) == [("int8", "int8", "int32")]
    dense = [l for l in layers if l.kind == "dense"]
    assert len(dense) == 1 and dense[0].quantized and dense[0].weight_shape == [32, 4]
    assert dense[0].acc_exp == dense[0].act_exp + dense[0].weight_exp
    ops = _ops(q)
    assert ops.index("add", ops.index("matmul")) < ops.index("astype", ops.index("matmul"))  # int32 bias, then float
    y_tvm, (y_emu, _) = build_run(q, x), emulate.run(q, [x])
    assert np.array_equal(y_tvm, y_emu), f"max diff {np.abs(y_tvm - y_emu).max()}"


@pytest.mark.parametrize("mode, dense", [("global_scale", False), ("max", False), ("max", True)])
def test_int8_accuracy_of_a_trained_cnn_is_within_two_points_of_float(mode, dense):
    import torch

    model, train, test = train_small_cnn()
    x, labels = test
    with torch.no_grad():
        float_acc = float((model(torch.from_numpy(x)).numpy().argmax(1) == labels).mean())
    mod = to_relax(model, x)
    params = QuantizeParams(quantize_dense=dense)
    if mode == "max":
        params.var_act_exp = calibrate(
            mod, QuantizeConfig(calibrate_mode="max"), [train[0][i : i + 512] for i in range(0, 2048, 512)]
        )
    q, _ = quantize(mod, params)
    int8_acc = float((build_run(q, x).argmax(1) == labels).mean())
    print(f"{mode}, dense {'int8' if dense else 'float'}: float top-1 {float_acc:.3f}, int8 top-1 {int8_acc:.3f}")
    assert 0.8 < float_acc < 1.0  # the task is learnt but not trivial
    assert float_acc - int8_acc <= 0.02


class _TwoBlocks(torch.nn.Module):
    """A stem, a max pool, two residual blocks: the second block's skip is the first's sum."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c = torch.nn.ModuleList(torch.nn.Conv2d(16, 16, 3, padding=1) for _ in range(4))

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        y = torch.relu(self.c[1](torch.relu(self.c[0](x))) + x)
        return torch.relu(self.c[3](torch.relu(self.c[2](y))) + y)


def test_int8_activations_read_a_residual_adds_operands_as_int8_but_the_accumulator_its_conv_adds_them_to():
    """relay's dtype_activation="int8", what VTA's int8 stores between kernels need: the second
    block adds the first block's sum as int8 (the value its conv reads too) to its conv's
    shifted accumulator; with int32 activations it adds the sum's int32 value. Both are
    bit-exact with the emulation."""
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    mod = to_relax(randomize(_TwoBlocks(), 0), x)
    q8, _ = quantize(mod, QuantizeParams(skip_conv_layers=(0,), int8_activations=True))
    q32, _ = quantize(mod, QuantizeParams(skip_conv_layers=(0,)))

    def residual_operands(q):
        by_var = {b.var: b.value for b in main_bindings(q)}
        return [
            sorted(op_name(by_var[a]) for a in b.value.args)
            for b in main_bindings(q)
            if op_name(b.value) == "add"
            and all(a in by_var and op_name(by_var[a]) in ("astype", "right_shift", "nn.relu") for a in b.value.args)
        ]

    assert residual_operands(q8) == [["astype", "right_shift"]] * 2  # int8 widened + the shifted accumulator
    assert residual_operands(q32) == [["astype", "right_shift"], ["nn.relu", "right_shift"]]
    for q in (q8, q32):
        assert np.array_equal(build_run(q, x), emulate.run(q, [x])[0])
