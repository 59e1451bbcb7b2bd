"""Winograd F(4x4, 3x3) and F(2x2, 3x3) for graph pack's float 3x3 stride-1 convs (`--winograd`).

A direct 3x3 conv does 9 multiply-adds per output and input channel. Winograd's minimal
filtering (Lavin & Gray, CVPR 2016) computes each 4x4 tile of outputs from a 6x6 tile of
inputs with 36 element-wise products per channel pair instead of 144, at the price of two
small linear transforms, so the conv becomes 36 independent GEMMs of
[tiles x C] x [C x OC]:

    V[p, e, n, ci]  = (Bt d_p B)[e, n]               data transform, per tile p and channel
    M[p, e, n, co]  = sum_ci V[p, e, n, ci] * U[e, n, ci, co]
    Y[tile p]       = At M[p, ., ., co] A            inverse transform, 4 x 4 outputs
    U[e, n, ci, co] = (G w[co, ci] Gt)[e, n]          the weight transform: a constant

On CPUs where the direct conv already runs near the FMA peak (ONNX Runtime's MLAS NCHWc
kernels, and ours), this is the one way left to be faster: fewer multiplies (about twice
as fast as ONNX Runtime's conv from 56x56 to 14x14: docs/performance.md). At 7x7x512 the
transformed weights (36 x 512 x 512 floats, 38 MB) make the GEMMs memory-bound and the
direct conv wins, so `applies` keeps convs whose output is at least
`MIN_SIZE` wide on the direct kernel.

Layouts: data and output stay graph pack's (N, C/c, H, W, 1, c); the transformed tiles are
tile-major ([P, 6, 6, C]) so each tile's transforms touch one contiguous block, and the
channel lanes stay innermost so every transform is vectorized over them. The transforms
are written as two 1-D passes each (`winograd_rows` then `winograd_data`; `winograd_cols`
then `winograd_inverse`): a 6x6 tile costs 2 x 216 multiply-adds, not 1296. The weight
transform is its own function over the constant weights, so the build folds it
(FoldConstant) and the network ships U.

Narrow convs take F(2x2, 3x3) (`rewrite`'s small_below: PackConfig.winograd_small_below,
28 by default): 4 x 4 input tiles, 16 products per 4 outputs. Its U is 16/9 of the direct
conv's weights where F(4x4)'s is 36/9, and a deep conv's U is what it streams from beyond
its core's L2 on every call in the network: a kernel timed alone (weights warm) never shows
that. Measured on an AMX Xeon (2 threads, resnet18, 20 rounds in turn with ONNX Runtime):
the three 14x14x256 convs as F(4x4) took 2.07-2.19x their tuned time inside the network,
as F(2x2) 1.65-1.77x, and the network went from 1.089x ORT's to 1.030x; alone F(2x2) is
the slower kernel (0.505 vs 0.461 ms).

The numerics: F(4, 3)'s transforms (TVM's interpolation points 0, +-1, +-1/2, inf) lose a
few bits against the direct sum; float32 outputs stay within 1e-5 relative here (tests).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax, te, tirx
from tvm.topi.nn.winograd_util import winograd_transform_matrices

from .graph import shape_of

TILE = 4  # m: outputs per tile side
SMALL_TILE = 2  # m for outputs narrower than `rewrite`'s small_below: F(2x2, 3x3)
KERNEL = 3  # r
MIN_SIZE = 14  # smallest output width taken (7 x 7 stays direct: see the module doc)
CONV = "conv2d_winograd_packed"
WEIGHT = "winograd_weight_packed"
PAD, GEMM = "winograd_pad", "winograd_gemm"
DATA, ROWS = "winograd_data", "winograd_rows"
INVERSE, COLS = "winograd_inverse", "winograd_cols"
OUT_EWISE_FUSABLE = 4  # Relax's OpPatternKind kOutEWiseFusable: FuseOps fuses the epilogue into it


def applies(call: relax.Call) -> bool:
    """A float packed conv that F(4x4, 3x3) computes here: 3x3, stride 1, no dilation, one
    group, padding 1 on every side, batch block 1, one channel block in and out, output at
    least MIN_SIZE wide."""
    a = call.attrs
    if not (a.data_layout.startswith("NCHW") and len(a.data_layout) > 4 and a.kernel_layout.startswith("OIHW")):
        return False
    data, kernel = shape_of(call.args[0]), shape_of(call.args[1])
    if len(data) != 6 or len(kernel) != 6 or str(call.args[0].ty.dtype) != "float32":
        return False
    if str(call.args[1].ty.dtype) != "float32" or int(a.groups) != 1:
        return False
    return (
        tuple(kernel[2:4]) == (KERNEL, KERNEL)
        and [int(s) for s in a.strides] == [1, 1]
        and [int(d) for d in a.dilation] == [1, 1]
        and [int(p) for p in a.padding] == [1, 1, 1, 1]
        and data[4] == 1
        and data[5] == kernel[4] == kernel[5]
        and data[3] >= MIN_SIZE
    )


def tile_for(width: int, small_below: int) -> int:
    """Outputs per tile side for a conv whose output is `width` wide."""
    return SMALL_TILE if width < small_below else TILE


def weight_transform(kernel: te.Tensor, tile: int = TILE) -> te.Tensor:
    """U[e, n, ci, co] = (G w Gt)[e, n] of a packed kernel (O/c, I/c, 3, 3, c_o, c_i), for
    F(tile x tile, 3x3): (tile + 2) x (tile + 2) slices."""
    ob, ib, kh, kw, bo, bi = (int(d) for d in kernel.shape)
    _, _, g = winograd_transform_matrices(tile, KERNEL, "float32")
    alpha = tile + KERNEL - 1
    r_h = te.reduce_axis((0, kh), "r_h")
    r_w = te.reduce_axis((0, kw), "r_w")
    return te.compute(
        (alpha, alpha, ib * bi, ob * bo),
        lambda e, n, ci, co: te.sum(
            kernel[co // bo, ci // bi, r_h, r_w, co % bo, ci % bi] * g[e, r_h] * g[n, r_w], axis=[r_h, r_w]
        ),
        name=WEIGHT,
    )


def conv2d_winograd_packed(data: te.Tensor, u: te.Tensor) -> te.Tensor:
    """The conv of packed data (N, C/c, H, W, 1, c) with transformed weights U (alpha, alpha,
    C, OC), padding 1: the output in the same packed layout. U's alpha = tile + 2 says which
    F(tile x tile, 3x3) it is."""
    nb, cb, h, w, _, c = (int(d) for d in data.shape)
    alpha, oc = int(u.shape[0]), int(u.shape[3])
    tile = alpha - KERNEL + 1
    a_mat, b_mat, _ = winograd_transform_matrices(tile, KERNEL, "float32")
    n_h, n_w = (h + tile - 1) // tile, (w + tile - 1) // tile
    tiles = nb * n_h * n_w
    pad = te.compute(
        (nb, cb, n_h * tile + 2, n_w * tile + 2, c),
        lambda b, i, y, x, k: tirx.if_then_else(
            tirx.all(y >= 1, y <= h, x >= 1, x <= w), data[b, i, y - 1, x - 1, 0, k], tirx.const(0.0, "float32")
        ),
        name=PAD,
    )

    def tile_input(p, ci, dy, dx):  # tile p's input pixel (dy, dx), channel ci
        return pad[p // (n_h * n_w), ci // c, p % (n_h * n_w) // n_w * tile + dy, p % n_w * tile + dx, ci % c]

    r_a = te.reduce_axis((0, alpha), "r_a")
    rows = te.compute(
        (tiles, alpha, alpha, cb * c),
        lambda p, e, dx, ci: te.sum(tile_input(p, ci, r_a, dx) * b_mat[r_a, e], axis=[r_a]),
        name=ROWS,
    )
    r_b = te.reduce_axis((0, alpha), "r_b")
    v = te.compute(
        (tiles, alpha, alpha, cb * c),
        lambda p, e, n, ci: te.sum(rows[p, e, r_b, ci] * b_mat[r_b, n], axis=[r_b]),
        name=DATA,
    )
    k = te.reduce_axis((0, cb * c), "k")
    m = te.compute(
        (tiles, alpha, alpha, oc), lambda p, e, n, co: te.sum(v[p, e, n, k] * u[e, n, k, co], axis=[k]), name=GEMM
    )
    r_c = te.reduce_axis((0, alpha), "r_c")
    cols = te.compute(
        (tiles, alpha, tile, oc), lambda p, e, dx, co: te.sum(m[p, e, r_c, co] * a_mat[r_c, dx], axis=[r_c]), name=COLS
    )
    r_d = te.reduce_axis((0, alpha), "r_d")
    return te.compute(
        (nb, oc // c, h, w, 1, c),
        lambda b, o, y, x, _bi, ci: te.sum(
            cols[b * n_h * n_w + y // tile * n_w + x // tile, r_d, x % tile, o * c + ci] * a_mat[r_d, y % tile],
            axis=[r_d],
        ),
        name=INVERSE,
    )


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, small_below: int):
        super().__init__(mod)
        self.mod = mod
        self.small_below = small_below
        self.count = 0
        self.conv_funcs: set[str] = set()

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d" and applies(call)):
            return call
        out_dtype = str(call.attrs.out_dtype)
        if out_dtype not in ("", "void", "float32"):
            return call
        tile = tile_for(int(shape_of(call.args[0])[3]), self.small_below)
        u = self.builder_.emit(self.builder_.call_te(weight_transform, call.args[1], tile, primfunc_name_hint=WEIGHT))
        out = self.builder_.call_te(conv2d_winograd_packed, call.args[0], u, primfunc_name_hint=CONV)
        self.conv_funcs.add(out.args[0].name_hint)
        self.count += 1
        return out

    def run(self):
        for gv, func in self.mod.functions.items():
            if isinstance(func, relax.Function):
                self.builder_.update_func(gv, self.visit_expr(func))
        mod = self.builder_.get()
        for gv, func in mod.functions.items():
            if gv.name_hint in self.conv_funcs:
                mod[gv] = func.with_attr("op_pattern", OUT_EWISE_FUSABLE)
        return mod


def rewrite(mod: Any, small_below: int = 0) -> tuple[Any, int]:
    """The module with every conv that `applies` rewritten to its weight transform and its
    Winograd conv, F(2x2, 3x3) where its output is narrower than `small_below`, else
    F(4x4, 3x3); and how many."""
    r = _Rewriter(mod, small_below)
    out = r.run()
    return relax.transform.DeadCodeElimination()(out), r.count
