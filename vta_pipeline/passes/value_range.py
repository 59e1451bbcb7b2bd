"""Interval analysis of a quantized network's integer values: which tensors are non-negative.

The x86 pack layout feeds a conv uint8 activations only where that is exact: an int8
tensor whose values are provably in [0, 127] (ReLU before the requantize clamp, a max
pool of such values, ...). The bounds follow the integer ops the quantizer emits (relu,
min/max clamps, shifts, adds, casts, pools, concats); anything else gets its dtype's
full range, so the answer errs on the safe side (signed, not tensorized).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tvm import relax

from .graph import const_value, dtype_of, main_bindings, op_name

Bounds = tuple[float, float]
UNKNOWN: Bounds = (-math.inf, math.inf)


def dtype_bounds(dtype: str | None) -> Bounds:
    if dtype and dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return float(info.min), float(info.max)
    return UNKNOWN


class ValueRange:
    """Bounds of every binding in `main`, computed on demand and memoized."""

    def __init__(self, mod: Any):
        self.values = {b.var: b.value for b in main_bindings(mod)}
        self.memo: dict[Any, Bounds] = {}

    def nonnegative(self, expr: Any) -> bool:
        return self.bounds(expr)[0] >= 0

    def bounds(self, expr: Any) -> Bounds:
        c = const_value(expr)
        if c is not None:
            return (float(c.min()), float(c.max())) if c.size else UNKNOWN
        if not isinstance(expr, relax.Var) or expr not in self.values:
            return dtype_bounds(dtype_of(expr))
        if expr not in self.memo:
            self.memo[expr] = UNKNOWN  # cycles cannot occur in a dataflow block; be safe anyway
            own = self._call(self.values[expr])
            lo_t, hi_t = dtype_bounds(dtype_of(expr))
            self.memo[expr] = (max(own[0], lo_t), min(own[1], hi_t))
        return self.memo[expr]

    def _call(self, value: Any) -> Bounds:
        if isinstance(value, relax.Var):
            return self.bounds(value)
        name = op_name(value)
        if name is None:
            return UNKNOWN
        args = list(value.args)
        if name == "concat":
            fields = value.args[0].fields if isinstance(value.args[0], relax.Tuple) else []
            if not fields:
                return UNKNOWN
            bs = [self.bounds(f) for f in fields]
            return min(b[0] for b in bs), max(b[1] for b in bs)
        bs = [self.bounds(a) for a in args if isinstance(a, relax.Expr)]
        if name == "nn.relu":
            return max(bs[0][0], 0.0), max(bs[0][1], 0.0)
        if name == "maximum":
            return max(b[0] for b in bs), max(b[1] for b in bs)
        if name == "minimum":
            return min(b[0] for b in bs), min(b[1] for b in bs)
        if name == "add":
            return bs[0][0] + bs[1][0], bs[0][1] + bs[1][1]
        if name == "multiply" and all(b[0] >= 0 for b in bs):  # non-negative factors only: no sign cases
            return bs[0][0] * bs[1][0], bs[0][1] * bs[1][1]
        if name in ("round", "floor", "ceil"):  # monotone
            f = {"round": np.round, "floor": math.floor, "ceil": math.ceil}[name]
            return tuple(float(f(v)) if math.isfinite(v) else v for v in bs[0])  # type: ignore[return-value]
        if name == "right_shift" and bs[1][0] == bs[1][1] and bs[1][0] >= 0:
            k = 2.0 ** bs[1][0]
            return (
                math.floor(bs[0][0] / k) if math.isfinite(bs[0][0]) else bs[0][0],
                math.floor(bs[0][1] / k) if math.isfinite(bs[0][1]) else bs[0][1],
            )
        if name == "astype":  # a value that does not fit the new type wraps around
            lo_t, hi_t = dtype_bounds(str(value.attrs.dtype))
            return bs[0] if lo_t <= bs[0][0] and bs[0][1] <= hi_t else (lo_t, hi_t)
        if name in ("nn.max_pool2d", "nn.avg_pool2d", "reshape", "permute_dims"):
            return bs[0]
        return UNKNOWN
