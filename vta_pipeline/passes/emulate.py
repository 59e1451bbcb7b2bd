"""A numpy interpreter of the network's Relax graph: the integer emulation and calibration.

It evaluates `main` binding by binding with numpy, independently of TVM's code
generation: integer tensors as int64 (int8 x int8 products summed through float64
matrix products, exact below 2^53), float tensors as float32. Two uses:
- the reference of the int8 path: a quantized graph's emulated output is what the
  compiled (packed, tuned) network must produce bit for bit;
- calibration: the float graph's activations at each conv input.
Integer semantics follow TVM's: `round` is half-to-even, int avg pool truncates, shifts
are arithmetic, casts from float truncate.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import relax

from ..errors import ModelError
from .graph import const_value, dtype_of, main_bindings, op_name, shape_of


def _np_dtype(dtype: str):
    return np.int64 if dtype.startswith(("int", "uint")) else np.float32


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype.startswith(("int", "uint")):
        if np.issubdtype(x.dtype, np.floating):
            x = np.trunc(x)
        bits = int(dtype[3:] if dtype.startswith("int") else dtype[4:])
        info = np.iinfo(getattr(np, dtype))
        if x.size and (x.min() < info.min or x.max() > info.max):
            span = 1 << bits
            x = (x.astype(np.int64) - info.min) % span + info.min  # two's complement wrap, as C casts do
        return x.astype(np.int64)
    return x.astype(np.float32)


def _window(x: np.ndarray, kh: int, kw: int, sh: int, sw: int, dh: int = 1, dw: int = 1) -> np.ndarray:
    """(N, C, OH, OW, kh, kw) view of a padded NCHW array."""
    n, c, h, w = x.shape
    oh = (h - (kh - 1) * dh - 1) // sh + 1
    ow = (w - (kw - 1) * dw - 1) // sw + 1
    s = x.strides
    return np.lib.stride_tricks.as_strided(
        x, (n, c, oh, ow, kh, kw), (s[0], s[1], s[2] * sh, s[3] * sw, s[2] * dh, s[3] * dw), writeable=False
    )


def conv2d(x: np.ndarray, w: np.ndarray, strides, padding, dilation, groups: int, integer: bool) -> np.ndarray:
    acc = np.float64 if integer else np.float32
    pt, pl, pb, pr = padding
    xp = np.pad(x.astype(acc), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    o, ig, kh, kw = w.shape
    win = _window(xp, kh, kw, strides[0], strides[1], dilation[0], dilation[1])  # n c oh ow kh kw
    n, c, oh, ow = win.shape[:4]
    wf = w.astype(acc)
    if groups == 1:
        out = np.einsum("ncyxij,ocij->noyx", win, wf, optimize=True)
    elif ig == 1 and o == c == groups:
        out = np.einsum("ncyxij,cij->ncyx", win, wf[:, 0], optimize=True)
    else:
        cg, og = c // groups, o // groups
        out = np.concatenate(
            [np.einsum("ncyxij,ocij->noyx", win[:, g * cg:(g + 1) * cg], wf[g * og:(g + 1) * og], optimize=True)
             for g in range(groups)], axis=1)  # fmt: skip
    return np.rint(out).astype(np.int64) if integer else out.astype(np.float32)


def _pool(x: np.ndarray, attrs, kind: str) -> np.ndarray:
    if str(attrs.layout) != "NCHW":
        raise ModelError(f"the emulator evaluates NCHW pools only, got layout {attrs.layout}")
    kh, kw = (int(k) for k in attrs.pool_size)
    sh, sw = (int(s) for s in attrs.strides)
    dh, dw = (int(d) for d in attrs.dilation)
    pt, pl, pb, pr = (int(p) for p in attrs.padding)
    if bool(attrs.ceil_mode):
        h, w = x.shape[2] + pt + pb, x.shape[3] + pl + pr
        extra_h = (-(h - (kh - 1) * dh - 1)) % sh
        extra_w = (-(w - (kw - 1) * dw - 1)) % sw
        pb, pr = pb + extra_h, pr + extra_w
    integer = np.issubdtype(x.dtype, np.integer)
    if kind == "max":
        fill = np.iinfo(np.int64).min if integer else -np.inf
        xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
        return _window(xp, kh, kw, sh, sw, dh, dw).max(axis=(4, 5))
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    sums = _window(xp.astype(np.int64 if integer else np.float64), kh, kw, sh, sw, dh, dw).sum(axis=(4, 5))
    if bool(attrs.count_include_pad):
        count = np.full(sums.shape[2:], kh * kw, dtype=np.int64)
    else:
        ones = np.pad(np.ones(x.shape[2:], np.int64), ((pt, pb), (pl, pr)))
        count = _window(ones[None, None], kh, kw, sh, sw, dh, dw).sum(axis=(4, 5))[0, 0]
    if integer:
        return np.sign(sums) * (np.abs(sums) // count)  # C division truncates toward zero
    return (sums / count).astype(np.float32)


def _binary(fn):
    return lambda call, a, b: fn(a, b)


def _shift_right(a, b):
    return np.right_shift(a, b)


_BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
    "minimum": np.minimum, "right_shift": _shift_right, "left_shift": np.left_shift,
    "divide": np.divide,
}  # fmt: skip


def _eval(name: str, call: Any, args: list[Any], out_dtype: str) -> np.ndarray:
    a = call.attrs
    if name in _BINARY:
        x, y = args
        r = _BINARY[name](x, y)
        return _cast(r, out_dtype) if out_dtype.startswith("int") else r.astype(np.float32)
    if name == "nn.relu":
        return np.maximum(args[0], 0)
    if name == "clip":
        lo, hi = (float(getattr(v.value, "value", v.value)) for v in call.args[1:3])
        return np.clip(args[0], lo, hi).astype(args[0].dtype)
    if name == "round":
        return np.round(args[0]).astype(np.float32)
    if name == "astype":
        return _cast(args[0], out_dtype)
    if name == "nn.conv2d":
        if str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW":
            raise ModelError(f"the emulator evaluates NCHW/OIHW convs only, got {a.data_layout}/{a.kernel_layout}")
        integer = out_dtype.startswith("int")
        return conv2d(
            args[0],
            args[1],
            [int(s) for s in a.strides],
            [int(p) for p in a.padding],
            [int(d) for d in a.dilation],
            int(a.groups),
            integer,
        )
    if name == "nn.max_pool2d":
        return _pool(args[0], a, "max")
    if name == "nn.avg_pool2d":
        return _pool(args[0], a, "avg")
    if name == "concat":
        return np.concatenate(args[0], axis=int(a.axis))
    if name == "mean":
        axes = tuple(int(x) for x in a.axis) if a.axis is not None else None
        return args[0].astype(np.float32).mean(axis=axes, keepdims=bool(a.keepdims)).astype(np.float32)
    if name == "nn.adaptive_avg_pool2d":
        if [int(s) for s in a.output_size] != [1, 1]:
            raise ModelError("the emulator evaluates adaptive_avg_pool2d to 1x1 only")
        return args[0].astype(np.float32).mean(axis=(2, 3), keepdims=True)
    if name in ("reshape", "flatten"):
        shape = list(shape_of(call))
        return args[0].reshape(shape)
    if name == "permute_dims":
        axes = [int(x) for x in a.axes] if a.axes is not None else None
        return np.transpose(args[0], axes)
    if name == "matmul":
        if out_dtype.startswith("int"):  # int8 x int8 sums, exact in float64 below 2^53
            return _cast(np.matmul(args[0].astype(np.float64), args[1].astype(np.float64)), out_dtype)
        return np.matmul(args[0].astype(np.float32), args[1].astype(np.float32))
    if name == "nn.softmax":
        x = args[0] - args[0].max(axis=int(a.axis), keepdims=True)
        e = np.exp(x)
        return (e / e.sum(axis=int(a.axis), keepdims=True)).astype(np.float32)
    raise ModelError(f"the emulator has no rule for operator {name!r}")


class Interpreter:
    def __init__(self, mod):
        self.func = mod["main"]
        self.bindings = main_bindings(mod)

    def value(self, env: dict, expr: Any) -> Any:
        if isinstance(expr, relax.Var):
            return env[expr]
        if isinstance(expr, relax.Tuple):
            return [self.value(env, f) for f in expr.fields]
        c = const_value(expr)
        if c is not None:
            return c.astype(_np_dtype(str(c.dtype)))
        return None  # attributes passed as arguments (PrimValue, ShapeExpr)

    def run(self, inputs: list[np.ndarray], watch: list[Any] = ()) -> tuple[Any, dict[Any, np.ndarray]]:
        env: dict[Any, Any] = {}
        for p, x in zip(self.func.params, inputs):
            env[p] = x.astype(_np_dtype(dtype_of(p)))
        watched = {}
        wanted = set(watch)
        for b in self.bindings:
            v = b.value
            name = op_name(v)
            if name is not None:
                args = [self.value(env, a) for a in v.args]
                try:
                    env[b.var] = _eval(name, v, args, dtype_of(b.var) or "float32")
                except ModelError as e:
                    raise ModelError(f"emulating {b.var.name} = {name}: {e}") from None
            elif isinstance(v, relax.TupleGetItem):
                env[b.var] = self.value(env, v.tuple_value)[v.index]
            else:
                env[b.var] = self.value(env, v)
            if b.var in wanted:
                watched[b.var] = env[b.var]
        for p in self.func.params:
            if p in wanted:
                watched[p] = env[p]
        return self.value(env, self.func.body.body), watched


def run(mod, inputs: list[np.ndarray], watch: list[Any] = ()) -> tuple[Any, dict[Any, np.ndarray]]:
    """Evaluate mod['main'] on numpy inputs; `watch` lists variables whose values to keep."""
    return Interpreter(mod).run(inputs, watch)
