"""Walking and rebuilding a network's `main` function, binding by binding.

Imported networks are one dataflow block of calls in topological order (what the
frontends emit, and what VTA's graph_pack walked in A-normal form). Both our passes
rebuild that block: each old binding becomes zero or more new ones, and `env` maps every
old variable to the expression that now holds its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..errors import ModelError

Const = tvm.ir.expr.GenericConst  # TVM 0.27's relax.Constant


def op_name(call: Any) -> str | None:
    """'nn.conv2d' for a call of relax.nn.conv2d; None for non-operator calls."""
    if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op):
        name = call.op.name
        return name[len("relax.") :] if name.startswith("relax.") else name
    return None


def tensor_type(expr: Any) -> Any:
    """The expression's tensor type (TVM 0.27 calls struct info `ty`), or None."""
    ty = getattr(expr, "ty", None)
    return ty if isinstance(ty, relax.TensorType) else None


def shape_of(expr: Any) -> tuple[int, ...] | None:
    ty = tensor_type(expr)
    if ty is None or ty.shape is None:
        return None
    try:
        return tuple(int(d) for d in ty.shape.values)
    except (TypeError, AttributeError):
        return None


def dtype_of(expr: Any) -> str | None:
    ty = tensor_type(expr)
    return str(ty.dtype) if ty is not None else None


def const_value(expr: Any) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, Const) else None


def main_bindings(mod: tvm.IRModule) -> list[Any]:
    func = mod["main"]
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        raise ModelError("the network's main function is not a sequence of bindings; cannot rewrite it")
    return [b for block in body.blocks for b in block.bindings]


@dataclass
class OpInfo:
    """One operator call of the network, as `pack-points` lists it."""

    index: int  # position among all operator calls
    name: str  # 'nn.conv2d'
    occurrence: int  # k-th call of this name
    var: Any
    call: Any
    in_shapes: list[tuple[int, ...] | None]
    out_shape: tuple[int, ...] | None

    def describe(self) -> str:
        ins = ", ".join("x".join(map(str, s)) if s else "?" for s in self.in_shapes)
        out = "x".join(map(str, self.out_shape)) if self.out_shape else "?"
        return f"#{self.index} {self.name}[{self.occurrence}] ({ins}) -> {out}"


def _tensor_args(call) -> list[Any]:
    out = []
    for a in call.args:
        if isinstance(a, relax.Tuple):
            out.extend(a.fields)
        elif tensor_type(a) is not None:
            out.append(a)
    return out


def op_sequence(mod: tvm.IRModule) -> list[OpInfo]:
    seen: dict[str, int] = {}
    ops: list[OpInfo] = []
    tuples: dict[Any, Any] = {}
    for b in main_bindings(mod):
        if isinstance(b.value, relax.Tuple):
            tuples[b.var] = b.value
        name = op_name(b.value)
        if name is None:
            continue
        k = seen.get(name, 0)
        seen[name] = k + 1
        args = [tuples.get(a, a) for a in b.value.args]
        ins = [shape_of(a) for a in _tensor_args(relax.Call(b.value.op, args, b.value.attrs))]
        ops.append(OpInfo(len(ops), name, k, b.var, b.value, ins, shape_of(b.var)))
    return ops


class Rebuilder:
    """Rebuild `main` binding by binding; subclasses override `rewrite`."""

    def __init__(self) -> None:
        self.env: dict[Any, Any] = {}
        self.tuples: dict[Any, Any] = {}  # tuple bindings (concat's operands), kept symbolic
        self.bb: relax.BlockBuilder | None = None

    def fields_of(self, expr: Any) -> list[Any] | None:
        """The old fields of a tuple argument, bound inline or to a variable."""
        if isinstance(expr, relax.Tuple):
            return list(expr.fields)
        if isinstance(expr, relax.Var) and expr in self.tuples:
            return list(self.tuples[expr].fields)
        return None

    # the value an old expression has in the new function
    def lookup(self, expr: Any) -> Any:
        if isinstance(expr, relax.Var) and expr in self.tuples:
            return relax.Tuple([self.lookup(f) for f in self.tuples[expr].fields])
        if isinstance(expr, relax.Var):
            return self.env.get(expr, expr)
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.lookup(f) for f in expr.fields])
        return expr

    def emit(self, expr: Any, name: str = "") -> Any:
        return self.bb.emit(expr, name)

    def copy(self, binding: Any) -> Any:
        """The binding with its arguments renamed, unchanged otherwise."""
        v = binding.value
        if isinstance(v, relax.Call):
            new = relax.Call(v.op, [self.lookup(a) for a in v.args], v.attrs, v.ty_args)
        elif isinstance(v, relax.TupleGetItem):
            new = relax.TupleGetItem(self.lookup(v.tuple_value), v.index)
        else:
            new = self.lookup(v)
        return self.emit(new, str(binding.var.name))

    def rewrite(self, index: int, binding: Any) -> Any:
        return self.copy(binding)

    def finish(self, out: Any) -> Any:
        """The new function's return value, from the old one's."""
        return self.lookup(out)

    def run(self, mod: tvm.IRModule) -> tvm.IRModule:
        func = mod["main"]
        bindings = main_bindings(mod)
        self.bb = relax.BlockBuilder()
        attrs = dict(func.attrs) if func.attrs else None
        with self.bb.function("main", list(func.params), attrs=attrs):
            with self.bb.dataflow():
                for i, b in enumerate(bindings):
                    if isinstance(b.value, relax.Tuple):
                        self.tuples[b.var] = b.value
                        continue
                    self.env[b.var] = self.rewrite(i, b)
                gv = self.bb.emit_output(self.finish(func.body.body))
            self.bb.emit_func_output(gv)
        new_main = self.bb.get()["main"]
        out = tvm.IRModule({gv_: f for gv_, f in mod.functions.items() if gv_.name_hint != "main"})
        out["main"] = new_main
        return relax.transform.DeadCodeElimination(["main"])(out)
