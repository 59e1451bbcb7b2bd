"""Lowering of packed conv2d: VTA's `conv2d_packed` compute, for Relax's LegalizeOps.

Relax's conv2d infers shapes for packed layouts (`NCHW1n16c` data, `OIHW16o16i` kernel)
but its default lowering silently skips layouts longer than four letters, and the build
then fails. We lower them with VTA's compute, so the tuning tasks are VTA's tasks:

    res[b_o, c_o, i, j, b_i, c_i] = sum_{k_o, d_i, d_j, k_i}
        pad[b_o, k_o, i*hs + d_i, j*ws + d_j, b_i, k_i] * kernel[c_o, k_o, d_i, d_j, c_i, k_i]

A packed stem (graph pack's `stem`) reads its image as one block of channels (padded to 4
when int8) against `OIHW{c}o{4|3}i` weights: the same sum; int8, it is a dot-product conv.

The `x86` pack layout keeps the activations' blocks and splits the weights' input block
into groups of four, `OIHW{c}o4i` (O/c, I/4, kh, kw, c, 4): the operand shape of the CPU's
int8 dot-product instructions (see `int8_dot`). Its compute reads the same sums:

    res[b_o, c_o, i, j, b_i, c_i] = sum_{k_o, d_i, d_j, k_i}
        pad[b_o, k_o // (c/4), i*hs + d_i, j*ws + d_j, b_i, (k_o % (c/4))*4 + k_i]
        * kernel[c_o, k_o, d_i, d_j, c_i, k_i]

Depthwise convs (groups == channels, as in mobilenet) have no VTA compute; packed, their
kernel is `OIHW{c}o` and each output channel reads only its own input channel. The x86
layout's int8 depthwise convs on non-negative data may instead take `OIHW{c}o4w` (graph pack's
`depthwise_dot`): each kernel row zero-padded to 4 taps and the taps innermost, so a row of
one output pixel is one 16-lane x 4-tap dot product (`int8_dot`'s depthwise form); the data
gains one more column of right padding for the zero tap to read:

    res[b_o, c_o, i, j, b_i, c_i] = sum_{d_i, d_j < 4}
        pad[b_o, c_o, i*hs + d_i, j*ws + d_j, b_i, c_i] * kernel[c_o, 0, d_i, 0, c_i, d_j]
Everything else goes to Relax's default conv2d lowering. Integer avg pools are lowered
with a cast back to their inferred type (TOPI computes them in int64).

Activations of blocked tensors (`NCHW1n{c}c`, 6-D): sigmoid, SiLU and tanh are lowered to
TOPI's polynomial `fast_exp` / `fast_tanh`. Relax's default lowering leaves `exp` to
LLVM, which has no vector exp on x86 or ARM without a vector math library: each lane
becomes a call to libm's `expf`, and inside a conv's write-back every call spills the
register tile (measured in docs/performance.md). The polynomial vectorizes with the tile,
within float32 rounding of libm's result; plain 4-D tensors keep Relax's exact lowering.
"""

from __future__ import annotations

import re
from typing import Any

import tvm
from tvm import relax, te, topi

from .graph import shape_of

PACKED_CONV = "conv2d_packed"
PACKED_DEPTHWISE = "depthwise_conv2d_packed"
DOT_CONV = "conv2d_dot_packed"
DEPTHWISE_DOT = "depthwise_conv2d_dot_packed"
GROUP_CONV = "group_conv2d_packed"
DOT_REDUCE = 4


def packed_data_layout(bfactor: int, cfactor: int) -> str:
    return f"NCHW{bfactor}n{cfactor}c"


def packed_kernel_layout(cfactor: int) -> str:
    return f"OIHW{cfactor}o{cfactor}i"


def dot_kernel_layout(cfactor: int) -> str:
    return f"OIHW{cfactor}o{DOT_REDUCE}i"


def packed_depthwise_kernel_layout(cfactor: int) -> str:
    return f"OIHW{cfactor}o"


def depthwise_dot_kernel_layout(cfactor: int) -> str:
    return f"OIHW{cfactor}o{DOT_REDUCE}w"


def _is_packed(layout: str) -> bool:
    return bool(re.search(r"\d", layout))


def _pad(data: te.Tensor, kh: int, kw: int, strides, padding):
    """Zero-pad packed data on H and W; returns (padded, hs, ws, out_h, out_w)."""
    hs, ws = (int(s) for s in strides)
    pt, pl, pb, pr = (int(p) for p in padding)
    h, w = (int(d) for d in data.shape[2:4])
    pad = (
        topi.nn.pad(data, [0, 0, pt, pl, 0, 0], [0, 0, pb, pr, 0, 0], name="pad_data")
        if any((pt, pl, pb, pr))
        else data
    )
    return pad, hs, ws, (h + pt + pb - kh) // hs + 1, (w + pl + pr - kw) // ws + 1


def _packed_conv(data: te.Tensor, kernel: te.Tensor, strides, padding, out_dtype: str, channel, name: str):
    """The packed conv sum over (k_o, d_i, d_j, k_i); `channel(c_o, k_o, k_i, bc, bi)` gives the
    data block and lane the kernel's input-channel indices read for output block `c_o`."""
    nb, cb, h, w, bn, bc = (int(d) for d in data.shape)
    ob, icb, kh, kw, bo, bi = (int(d) for d in kernel.shape)
    pad, hs, ws, oh, ow = _pad(data, kh, kw, strides, padding)
    k_o = te.reduce_axis((0, icb), name="k_o")
    d_i = te.reduce_axis((0, kh), name="d_i")
    d_j = te.reduce_axis((0, kw), name="d_j")
    k_i = te.reduce_axis((0, bi), name="k_i")

    def body(b_o, c_o, i, j, b_i, c_i):
        block, lane = channel(c_o, k_o, k_i, bc, bi)
        return te.sum(
            pad[b_o, block, i * hs + d_i, j * ws + d_j, b_i, lane].astype(out_dtype)
            * kernel[c_o, k_o, d_i, d_j, c_i, k_i].astype(out_dtype),
            axis=[k_o, d_i, d_j, k_i],
        )

    return te.compute(
        (nb, ob, oh, ow, bn, bo),
        body,
        name=name,
        tag=name,
    )


def conv2d_packed(
    data: te.Tensor, kernel: te.Tensor, strides, padding, out_dtype: str, name: str = PACKED_CONV
) -> te.Tensor:
    """VTA's conv2d_packed: data (N/b, C/c, H, W, b, c), kernel (O/c, C/c, kh, kw, c, c); also
    a packed stem's, whose input block (4 channels) is narrower than its output block."""
    return _packed_conv(data, kernel, strides, padding, out_dtype, lambda c_o, k_o, k_i, bc, bi: (k_o, k_i), name)


def conv2d_dot_packed(data: te.Tensor, kernel: te.Tensor, strides, padding, out_dtype: str) -> te.Tensor:
    """Packed conv with dot-product weights: data (N/b, C/c, H, W, b, c), kernel
    (O/c, C/4, kh, kw, c, 4); or a packed stem's data (N/b, 1, H, W, b, 4), whose one block
    of four channels is what each kernel group reads."""
    if int(data.shape[5]) == int(kernel.shape[5]):
        return conv2d_packed(data, kernel, strides, padding, out_dtype, DOT_CONV)
    return _packed_conv(
        data,
        kernel,
        strides,
        padding,
        out_dtype,
        lambda c_o, k_o, k_i, bc, bi: (k_o // (bc // bi), (k_o % (bc // bi)) * bi + k_i),
        DOT_CONV,
    )


def group_conv2d_packed(data: te.Tensor, kernel: te.Tensor, strides, padding, out_dtype: str, groups: int) -> te.Tensor:
    """A grouped conv on blocked data, each group whole blocks of its input and its output
    (the CPU layout's, `cpu_layout`): data (N, C/bi, H, W, 1, bi), kernel (O/bo, (C/g)/bi, kh,
    kw, bo, bi); output block c_o reads the input blocks of its group. Its block is named as
    the plain packed conv's (`PACKED_CONV`): the packed conv space's nest schedules the same
    ten loops, only the data index differs."""
    out_per_group = int(kernel.shape[0]) // groups
    in_per_group = int(kernel.shape[1])
    return _packed_conv(
        data,
        kernel,
        strides,
        padding,
        out_dtype,
        lambda c_o, k_o, k_i, bc, bi: (c_o // out_per_group * in_per_group + k_o, k_i),
        PACKED_CONV,
    )


def _depthwise_conv(
    data: te.Tensor, kernel: te.Tensor, kh: int, kw: int, weight, strides, padding, out_dtype: str, name: str
) -> te.Tensor:
    """The depthwise sum over (d_i, d_j) of a kh x kw kernel; `weight(c_o, d_i, d_j, c_i)` is the
    kernel's element for those indices in its layout."""
    nb, cb, _, _, bn, bc = (int(d) for d in data.shape)
    pad, hs, ws, oh, ow = _pad(data, kh, kw, strides, padding)
    d_i = te.reduce_axis((0, kh), name="d_i")
    d_j = te.reduce_axis((0, kw), name="d_j")
    return te.compute(
        (nb, cb, oh, ow, bn, bc),
        lambda b_o, c_o, i, j, b_i, c_i: te.sum(
            pad[b_o, c_o, i * hs + d_i, j * ws + d_j, b_i, c_i].astype(out_dtype)
            * weight(c_o, d_i, d_j, c_i).astype(out_dtype),
            axis=[d_i, d_j],
        ),
        name=name,
        tag=name,
    )


def depthwise_conv2d_packed(data: te.Tensor, kernel: te.Tensor, strides, padding, out_dtype: str) -> te.Tensor:
    """Depthwise conv on packed data: kernel (C/c, 1, kh, kw, c)."""
    _, _, kh, kw, _ = (int(d) for d in kernel.shape)
    return _depthwise_conv(
        data,
        kernel,
        kh,
        kw,
        lambda c_o, d_i, d_j, c_i: kernel[c_o, 0, d_i, d_j, c_i],
        strides,
        padding,
        out_dtype,
        PACKED_DEPTHWISE,
    )


def depthwise_conv2d_dot_packed(data: te.Tensor, kernel: te.Tensor, strides, padding, out_dtype: str) -> te.Tensor:
    """Depthwise conv with each kernel row's taps innermost, in fours: kernel (C/c, 1, kh, 1, c, 4)."""
    _, _, kh, _, _, kw = (int(d) for d in kernel.shape)
    return _depthwise_conv(
        data,
        kernel,
        kh,
        kw,
        lambda c_o, d_i, d_j, c_i: kernel[c_o, 0, d_i, 0, c_i, d_j],
        strides,
        padding,
        out_dtype,
        DEPTHWISE_DOT,
    )


def _reads_in_fours(call: relax.Call) -> bool:
    """A dot-product conv: its kernel's input block is split in fours (`OIHW{c}o4i` over data
    in blocks of c), or an int8 stem's (`OIHW{c}o4i` over one block of 4 channels)."""
    data, kernel = shape_of(call.args[0]), shape_of(call.args[1])
    stem = kernel[5] < kernel[4] and str(call.args[1].ty.dtype) == "int8"
    return kernel[5] < data[5] or stem


def _legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> Any:
    a = call.attrs
    if not (_is_packed(a.data_layout) or _is_packed(a.kernel_layout)):
        from tvm.relax.transform.legalize_ops import nn as default_nn

        return default_nn._nn_conv2d(bb, call)
    if any(int(d) != 1 for d in a.dilation):
        raise ValueError(f"packed conv2d with dilation {list(a.dilation)} is not supported")
    out_dtype = str(a.out_dtype)
    if out_dtype in ("", "void", "None"):
        out_dtype = str(call.args[0].ty.dtype)
    if int(a.groups) != 1 and str(a.kernel_layout).endswith("i"):
        return bb.call_te(
            group_conv2d_packed,
            call.args[0],
            call.args[1],
            strides=a.strides,
            padding=a.padding,
            out_dtype=out_dtype,
            groups=int(a.groups),
            primfunc_name_hint=GROUP_CONV,
        )
    if int(a.groups) != 1 and len(shape_of(call.args[1])) == 6:
        fn, name = depthwise_conv2d_dot_packed, DEPTHWISE_DOT
    elif int(a.groups) != 1:
        fn, name = depthwise_conv2d_packed, PACKED_DEPTHWISE
    elif _reads_in_fours(call):
        fn, name = conv2d_dot_packed, DOT_CONV
    else:
        fn, name = conv2d_packed, PACKED_CONV
    return bb.call_te(
        fn,
        call.args[0],
        call.args[1],
        strides=a.strides,
        padding=a.padding,
        out_dtype=out_dtype,
        primfunc_name_hint=name,
    )


def _legalize_avg_pool2d(bb: relax.BlockBuilder, call: relax.Call) -> Any:
    """TOPI's avg pool of an int32 tensor computes in int64 (the division truncates, as in C):
    cast back, so the result has the type Relax inferred (int32)."""
    from tvm.relax.transform.legalize_ops import nn as default_nn

    dtype = str(call.args[0].ty.dtype)
    if not dtype.startswith(("int", "uint")):
        return default_nn._nn_avg_pool2d(bb, call)
    a = call.attrs

    def pool(data):
        out = topi.nn.pool2d(
            data,
            kernel=a.pool_size,
            stride=a.strides,
            dilation=a.dilation,
            padding=a.padding,
            pool_type="avg",
            ceil_mode=bool(a.ceil_mode),
            layout=a.layout,
            count_include_pad=bool(a.count_include_pad),
        )
        return topi.cast(out, dtype)

    return bb.call_te(pool, call.args[0], primfunc_name_hint="avg_pool2d")


def fast_sigmoid(x: te.Tensor) -> te.Tensor:
    """1 / (1 + e^-x) with TOPI's vectorizable `fast_exp`."""
    e = topi.fast_exp(topi.negative(x))
    return te.compute(x.shape, lambda *i: 1 / (1 + e(*i)), name="fast_sigmoid", tag="elemwise")


def fast_silu(x: te.Tensor) -> te.Tensor:
    """x * sigmoid(x), the swish of efficientnet and the YOLO backbones."""
    s = fast_sigmoid(x)
    return te.compute(x.shape, lambda *i: x(*i) * s(*i), name="fast_silu", tag="elemwise")


FAST_ACTIVATIONS = {"relax.sigmoid": fast_sigmoid, "relax.nn.silu": fast_silu, "relax.tanh": topi.fast_tanh}


def _legalize_activation(op_name: str) -> Any:
    fast = FAST_ACTIVATIONS[op_name]

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> Any:
        shape = shape_of(call.args[0])
        if shape is None or len(shape) != 6 or str(call.args[0].ty.dtype) != "float32":
            return tvm.ir.Op.get(op_name).get_attr("FLegalize")(bb, call)  # Relax's own
        return bb.call_te(fast, call.args[0], primfunc_name_hint=fast.__name__)

    return legalize


def legalize_map() -> dict[str, Any]:
    """`LegalizeOps(customize_legalize_map=legalize_map())`: packed convs get VTA's compute,
    integer avg pools keep their type, blocked tensors' sigmoid, SiLU and tanh vectorize."""
    return {
        "relax.nn.conv2d": _legalize_conv2d,
        "relax.nn.avg_pool2d": _legalize_avg_pool2d,
        **{op: _legalize_activation(op) for op in FAST_ACTIVATIONS},
    }
