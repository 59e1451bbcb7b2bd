"""Quantize: float32 -> int8 x int8 -> int32, with relay.quantize's rules, as a Relax rewrite.

The arithmetic is what VTA executes (and what `relay.quantize` produced for it):
- every value carries a power-of-two scale 2^-e ("exponent" e);
- a quantized conv2d takes int8 activations at exponent `a` and int8 weights at
  exponent `w` (power-of-two weight scale: w = nbit-1 - ceil(log2 max|W|)), and
  accumulates in int32 at exponent a + w;
- a dense layer (matmul with constant 2-D weights: the classifier) stays float unless
  `quantize_dense` (relay.quantize's skip_dense_layer=False): then it is int8 x int8 ->
  int32 like a conv, its weights at their own power-of-two exponent;
- bias adds become int32 adds of the bias rounded at the accumulator's exponent; relu,
  relu6 (clip), max pool, avg pool (int32, truncating division), residual adds and
  concats (operands shifted to the coarser exponent) stay in int32;
- with int8 activations (relay's dtype_activation="int8", what VTA's int8 stores between
  kernels need), a residual add reads all its operands but one as int8 at the sum's
  activation exponent; the one left (the finest int32 accumulator) is shifted there;
- a max pool whose output is only ever quantized (resnet18's after its stem, float or int8)
  pools the (re)quantized int8 value instead: the same values, since (re)quantizing is
  monotonic;
- entering the next quantized conv, an int32 value is requantized as VTA's ALU does it:
  add the rounding bias 2^(k-1), right_shift by k, clamp with minimum/maximum (R.clip
  would stop operator fusion), cast to int8; a float value is rounded at 2^a and clamped;
- any other consumer (global pooling, dense, the function output) gets the value
  dequantized to float32 (astype, times 2^-e): the end of the quantized region.

Activation exponents: one global bound (`global_scale`, the recipe: 8.0 -> a = 4 for
8 bits) or one per conv from calibration data (max or percentile of |x|).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..errors import ModelError
from .graph import Rebuilder, const_value, dtype_of, main_bindings, op_name, shape_of


@dataclass
class QuantizeParams:
    act_exp: int = 4  # exponent of every quantized activation (global_scale mode)
    # calibrated exponents of individual activations (the float module's variables)
    var_act_exp: dict[Any, int] = field(default_factory=dict)
    skip_conv_layers: tuple[int, ...] = (0,)
    nbit_input: int = 8
    nbit_weight: int = 8
    quantize_dense: bool = False  # matmuls with constant weights too (relay's skip_dense_layer=False)
    int8_activations: bool = False  # residual adds read int8 operands (relay's dtype_activation="int8")

    @staticmethod
    def exp_for_bound(bound: float, nbit: int) -> int:
        """Largest power-of-two exponent whose scale keeps |x| <= bound representable."""
        if not bound > 0:
            return nbit - 1
        return (nbit - 1) - math.ceil(math.log2(bound))


@dataclass
class LayerRecord:
    index: int
    name: str
    groups: int
    input_shape: list[int]
    weight_shape: list[int]
    quantized: bool
    act_exp: int | None = None
    weight_exp: int | None = None
    acc_exp: int | None = None
    kind: str = "conv2d"  # or "dense" (`index` counts each kind on its own)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class QValue:
    expr: Any
    dtype: str  # "int32" | "int8"
    exp: int


def fold_batch_norm(mod: tvm.IRModule) -> tvm.IRModule:
    """Batch norm into conv weights first (it matches OIHW kernels only), then the leftovers
    decomposed into elementwise ops: the graph that quantize and pack both see."""
    return tvm.transform.Sequential([
        relax.transform.FoldBatchnormToConv2D(),
        relax.transform.FoldConstant(),
        relax.transform.DecomposeOpsForInference(),
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),  # (x, mean, var)[0] left by decomposed BN -> x
        relax.transform.DeadCodeElimination(),
    ])(mod)  # fmt: skip


def activation_uses(mod: tvm.IRModule) -> list[tuple[Any, str, int | None, Any]]:
    """Every use of a variable in main, in binding order: (var, how, conv index, call).

    `how`: "conv" (the data of a conv2d, the `conv index`-th of the graph), "dense" (the data
    of a matmul with constant weights), "add" / "concat" (an operand), "other" (any other
    argument, a conv's weights, the function's output). A variable used through a tuple is
    used as the tuple is. The one walk behind both
    questions the quantizer asks: which activations may be quantized, and which are only
    ever quantized."""
    uses: list[tuple[Any, str, int | None, Any]] = []
    tuples: dict[Any, Any] = {}
    conv = 0

    def use(expr: Any, how: str, index: int | None, call: Any) -> None:
        if isinstance(expr, relax.Var):
            if expr in tuples:
                for f in tuples[expr].fields:
                    use(f, how, index, call)
                return
            uses.append((expr, how, index, call))
        elif isinstance(expr, relax.Tuple):
            for f in expr.fields:
                use(f, how, index, call)

    for b in main_bindings(mod):
        v = b.value
        if isinstance(v, relax.Tuple):
            tuples[b.var] = v
            continue
        name = op_name(v)
        if name == "nn.conv2d":
            use(v.args[0], "conv", conv, v)
            conv += 1
            rest = v.args[1:]
        elif _dense_weights(v) is not None:
            use(v.args[0], "dense", None, v)
            rest = v.args[1:]
        elif name in ("add", "concat"):
            for a in v.args:
                use(a, name, None, v)
            continue
        else:
            rest = v.args if isinstance(v, relax.Call) else [v]
        for a in rest:
            use(a, "other", None, v)
    use(mod["main"].body.body, "other", None, None)
    return uses


def quantization_points(mod: tvm.IRModule) -> list[Any]:
    """The float activations that may be quantized: conv and dense inputs and the operands of
    adds and concats (a float operand next to a quantized one is quantized); what calibration
    measures."""
    points: list[Any] = []
    for var, how, _, _ in activation_uses(mod):
        if how != "other" and var not in points:
            points.append(var)
    return points


def quantized_only(mod: tvm.IRModule, skip_conv_layers: tuple[int, ...], dense: bool = False) -> set[Any]:
    """Variables every use of which quantizes them: the data of a conv that is quantized (not
    in `skip_conv_layers`), of a dense layer when `dense` layers are quantized, an operand of
    an add or a concat. A float max pool producing one of them can run on the int8 value
    instead (see `Quantizer.rewrite`); any other use (the output, a float op) would then read
    a dequantized value where it read the float one."""
    quantizes: dict[Any, bool] = {}
    for var, how, index, call in activation_uses(mod):
        q = (
            how in ("add", "concat")
            or how == "conv"
            and index not in skip_conv_layers
            and const_value(call.args[1]) is not None
            or how == "dense"
            and dense
        )
        quantizes[var] = quantizes.get(var, True) and q
    return {var for var, q in quantizes.items() if q}


def _dense_weights(call: Any) -> np.ndarray | None:
    """The constant 2-D float weights of a dense layer (`matmul(x, W)`), else None."""
    if op_name(call) != "matmul" or len(call.args) != 2:
        return None
    w = const_value(call.args[1])
    return w if w is not None and w.ndim == 2 and str(w.dtype) == "float32" else None


def _i32(x: int) -> relax.Expr:
    return relax.const(int(x), "int32")


class Quantizer(Rebuilder):
    def __init__(self, params: QuantizeParams):
        super().__init__()
        self.p = params
        self.qmax_in = (1 << (params.nbit_input - 1)) - 1
        self.qmax_w = (1 << (params.nbit_weight - 1)) - 1
        self.q: dict[Any, QValue] = {}
        self.deq: dict[Any, Any] = {}
        self.req: dict[tuple[Any, int], Any] = {}
        self.conv_index = 0
        self.dense_index = 0
        self.layers: list[LayerRecord] = []
        self.quantize_before_pool: set[Any] = set()  # see `quantized_only`

    # ---- values ----------------------------------------------------------------------------------
    def lookup(self, expr: Any) -> Any:
        if isinstance(expr, relax.Var) and expr in self.q:
            return self._dequantize(expr)
        return super().lookup(expr)

    def _dequantize(self, var: Any) -> Any:
        if var not in self.deq:
            qv = self.q[var]
            src = qv.expr
            if self.p.int8_activations and qv.dtype == "int32" and qv.exp == self._exp_for(var):
                # an activation (a residual sum) leaves as VTA stores it: int8 (an accumulator,
                # at a finer scale, is left as it is)
                src = self._to_int8(var, qv.exp)
            f = relax.op.astype(src, "float32")
            self.deq[var] = self.emit(relax.op.multiply(f, relax.const(2.0**-qv.exp, "float32")), "dequantize")
        return self.deq[var]

    def _clamp(self, x: Any, lo: int, hi: int, dtype: str) -> Any:
        x = relax.op.minimum(x, relax.const(hi, dtype))
        return relax.op.maximum(x, relax.const(lo, dtype))

    def _shift_to(self, qv: QValue, exp: int) -> Any:
        """int32 value of qv at a smaller-or-equal exponent, rounding (VTA: add, shift)."""
        v = qv.expr if qv.dtype == "int32" else relax.op.astype(qv.expr, "int32")
        k = qv.exp - exp
        if k > 0:
            v = relax.op.right_shift(relax.op.add(v, _i32(1 << (k - 1))), _i32(k))
        elif k < 0:
            v = relax.op.left_shift(v, _i32(-k))
        return v

    def _to_int8(self, arg: Any, exp: int) -> Any:
        key = (arg, exp)
        if key in self.req:
            return self.req[key]
        if isinstance(arg, relax.Var) and arg in self.q:
            qv = self.q[arg]
            if qv.dtype == "int8" and qv.exp == exp:
                return qv.expr
            v = self._clamp(self._shift_to(qv, exp), -self.qmax_in, self.qmax_in, "int32")
        else:
            x = relax.op.round(relax.op.multiply(self.lookup(arg), relax.const(2.0**exp, "float32")))
            v = self._clamp(x, -self.qmax_in, self.qmax_in, "float32")
        out = self.emit(relax.op.astype(v, "int8"), "quantize")
        self.req[key] = out
        return out

    def _exp_for(self, var: Any) -> int:
        return self.p.var_act_exp.get(var, self.p.act_exp)

    def _qvalue(self, var: Any) -> QValue:
        """A quantized operand; a float one is quantized to int8 at its activation exponent."""
        if var in self.q:
            return self.q[var]
        exp = self._exp_for(var)
        return QValue(self._to_int8(var, exp), "int8", exp)

    def _unify(self, vars_: list[Any]) -> tuple[list[Any], int]:
        qvs = [self._qvalue(v) for v in vars_]
        exp = min(qv.exp for qv in qvs)
        return [self._shift_to(qv, exp) for qv in qvs], exp

    # ---- the rules -------------------------------------------------------------------------------
    def rewrite(self, index: int, binding: Any) -> Any:
        v, var = binding.value, binding.var
        name = op_name(v)
        quant = [isinstance(a, relax.Var) and a in self.q for a in v.args] if name else []
        name_hint = str(var.name)
        if name == "nn.conv2d":
            return self._conv(v, var)
        w = _dense_weights(v)
        if w is not None:
            return self._dense(v, var, w)
        if name == "add" and any(quant):
            qi = 0 if quant[0] else 1
            other = v.args[1 - qi]
            c = const_value(other)
            if c is not None:
                qv = self.q[v.args[qi]]
                base = qv.expr if qv.dtype == "int32" else relax.op.astype(qv.expr, "int32")
                cq = np.round(c.astype(np.float64) * 2.0**qv.exp)
                if np.abs(cq).max(initial=0) > 2**31 - 1:
                    raise ModelError(
                        f"quantize: the constant added at {var.name} does not fit int32 at scale 2^-{qv.exp} "
                        f"(max |c| = {np.abs(c).max():.3g}); the activations before it are too small for the "
                        "chosen scales: use a coarser calibration (--calibrate-mode global_scale or percentile)"
                    )
                cq = relax.const(cq.astype("int32"))
                return self._set(var, self.emit(relax.op.add(base, cq), name_hint), qv.exp)
            if all(isinstance(a, relax.Var) for a in v.args):
                if self.p.int8_activations:
                    return self._int8_add(list(v.args), var)
                (a, b), exp = self._unify(list(v.args))
                return self._set(var, self.emit(relax.op.add(a, b), name_hint), exp)
        if name == "nn.relu" and quant[0]:
            qv = self.q[v.args[0]]
            return self._set(var, self.emit(relax.op.nn.relu(qv.expr), name_hint), qv.exp, qv.dtype)
        if name == "clip" and quant[0]:
            qv = self.q[v.args[0]]
            lo, hi = (float(getattr(a.value, "value", a.value)) for a in v.args[1:3])
            s = 2.0**qv.exp
            lo_q = max(int(np.round(lo * s)), -(2**31)) if math.isfinite(lo) else -(2**31)
            hi_q = min(int(np.round(hi * s)), 2**31 - 1) if math.isfinite(hi) else 2**31 - 1
            base = qv.expr if qv.dtype == "int32" else relax.op.astype(qv.expr, "int32")
            return self._set(var, self.emit(self._clamp(base, lo_q, hi_q, "int32"), name_hint), qv.exp)
        if (
            name == "nn.max_pool2d"
            and var in self.quantize_before_pool
            and (self.q[v.args[0]].dtype == "int32" if quant[0] else dtype_of(v.args[0]) == "float32")
        ):
            # A max pool whose output is only ever quantized, of a float or an int32 value:
            # quantize (requantize) its input instead. Exact: rounding, shifting and clamping are
            # monotonic, so the max of the quantized values is the quantized max (the pool pads
            # with the dtype's minimum, below -qmax). The quantize then fuses into the producer
            # (resnet18's stem conv, bias, relu; float, or int8 when the stem is quantized) and
            # the pool moves int8: 4x fewer bytes (resnet18's int32 pool took a third of its
            # int8 stem conv's time).
            exp = self._exp_for(var)
            new = relax.Call(v.op, [self._to_int8(v.args[0], exp)], v.attrs, v.ty_args)
            return self._set(var, self.emit(new, name_hint), exp, "int8")
        if name == "nn.max_pool2d" and quant[0]:
            qv = self.q[v.args[0]]
            new = relax.Call(v.op, [qv.expr], v.attrs, v.ty_args)
            return self._set(var, self.emit(new, name_hint), qv.exp, qv.dtype)
        if name == "nn.avg_pool2d" and quant[0]:
            qv = self.q[v.args[0]]
            base = qv.expr if qv.dtype == "int32" else relax.op.astype(qv.expr, "int32")
            new = relax.Call(v.op, [base], v.attrs, v.ty_args)
            return self._set(var, self.emit(new, name_hint), qv.exp)
        fields = self.fields_of(v.args[0]) if name == "concat" else None
        if fields is not None:
            if any(isinstance(f, relax.Var) and f in self.q for f in fields) and all(
                isinstance(f, relax.Var) for f in fields
            ):
                vals, exp = self._unify(fields)
                new = relax.Call(v.op, [relax.Tuple(vals)], v.attrs, v.ty_args)
                return self._set(var, self.emit(new, name_hint), exp)
        return self.copy(binding)

    def _int8_add(self, args: list[Any], var: Any) -> Any:
        """A residual add as VTA runs it (`int8_activations`): VTA stores int8 between kernels,
        so every operand but one arrives as int8 at the sum's activation exponent (requantized
        and clipped like a conv's input); the one left, the int32 accumulator with the finest
        scale, is shifted to that exponent and takes the others in its conv's epilogue."""
        qvs = [self._qvalue(a) for a in args]
        exp = self._exp_for(var)
        wide = [i for i, qv in enumerate(qvs) if qv.dtype == "int32"]
        main = max(wide, key=lambda i: qvs[i].exp) if wide else None
        vals = [
            self._shift_to(qv, exp) if i == main else relax.op.astype(self._to_int8(a, exp), "int32")
            for i, (a, qv) in enumerate(zip(args, qvs))
        ]
        return self._set(var, self.emit(relax.op.add(*vals), str(var.name)), exp)

    def _set(self, var: Any, expr: Any, exp: int, dtype: str = "int32") -> None:
        self.q[var] = QValue(expr, dtype, exp)
        return None

    def _conv(self, call: Any, var: Any) -> Any:
        idx = self.conv_index
        self.conv_index += 1
        a = call.attrs
        w = const_value(call.args[1])
        rec = LayerRecord(
            idx,
            str(var.name),
            int(a.groups),
            list(shape_of(call.args[0]) or []),
            list(shape_of(call.args[1]) or []),
            quantized=False,
        )
        self.layers.append(rec)
        if idx in self.p.skip_conv_layers or w is None or dtype_of(call.args[0]) != "float32":
            return self.copy_call(call, var)
        act = self._exp_for(call.args[0])
        wq, wexp = self._weights(w)
        xq = self._to_int8(call.args[0], act)
        acc = self.emit(relax.op.nn.conv2d(
            xq, relax.const(wq), a.strides, a.padding, a.dilation, a.groups,
            a.data_layout, a.kernel_layout, a.out_layout, out_dtype="int32",
        ), str(var.name))  # fmt: skip
        rec.quantized, rec.act_exp, rec.weight_exp, rec.acc_exp = True, act, wexp, act + wexp
        return self._set(var, acc, act + wexp)

    def _weights(self, w: np.ndarray) -> tuple[np.ndarray, int]:
        """int8 weights at the power-of-two exponent their largest magnitude allows."""
        wexp = QuantizeParams.exp_for_bound(float(np.abs(w).max()), self.p.nbit_weight)
        return np.clip(np.round(w.astype(np.float64) * 2.0**wexp), -self.qmax_w, self.qmax_w).astype("int8"), wexp

    def _dense(self, call: Any, var: Any, w: np.ndarray) -> Any:
        """A dense layer with constant weights `w` (`_dense_weights`): int8 when quantize_dense."""
        idx = self.dense_index
        self.dense_index += 1
        rec = LayerRecord(
            idx, str(var.name), 1, list(shape_of(call.args[0]) or []), list(w.shape), quantized=False, kind="dense"
        )
        self.layers.append(rec)
        if not self.p.quantize_dense:
            return self.copy_call(call, var)
        act = self._exp_for(call.args[0])
        wq, wexp = self._weights(w)
        acc = self.emit(
            relax.op.matmul(self._to_int8(call.args[0], act), relax.const(wq), out_dtype="int32"), str(var.name)
        )
        rec.quantized, rec.act_exp, rec.weight_exp, rec.acc_exp = True, act, wexp, act + wexp
        return self._set(var, acc, act + wexp)

    def copy_call(self, call: Any, var: Any) -> Any:
        new = relax.Call(call.op, [self.lookup(a) for a in call.args], call.attrs, call.ty_args)
        return self.emit(new, str(var.name))


def quantize(mod: tvm.IRModule, params: QuantizeParams) -> tuple[tvm.IRModule, list[LayerRecord]]:
    """Quantize a BN-folded float module (see `fold_batch_norm`); returns it and the layer table."""
    q = Quantizer(params)
    q.quantize_before_pool = quantized_only(mod, params.skip_conv_layers, params.quantize_dense)
    out = q.run(mod)
    return out, q.layers


def QuantizeRealize(params: QuantizeParams) -> tvm.ir.transform.Pass:  # noqa: N802 (TVM's pass naming)
    @tvm.ir.transform.module_pass(opt_level=0, name="vta_pipeline.QuantizeRealize")
    def _pass(mod, _ctx):
        return quantize(mod, params)[0]

    return _pass
