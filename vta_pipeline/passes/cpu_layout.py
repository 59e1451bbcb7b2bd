"""CPU layout: every conv2d of any network in blocked NCHW[x]c, what ONNX Runtime's NCHWc
transformer and Relay's AlterOpLayout to `conv2d_NCHWc` did, as a Relax rewrite.

Graph pack (`graph_pack`) is VTA's rewrite of one region between a start and a stop
operator, with one channel block; it keeps VTA's semantics for `--vta` and stays as it is.
This pass is the CPU's: no region, a block per tensor, and a layout transform only where a
blocked tensor meets an operator that needs NCHW.

Blocks. A tensor of C channels is kept as (N, C'/b, H, W, 1, b), C' = C rounded up to the
block b (`block_for`): the target's float lanes (16 on x86: one AVX-512 register, two AVX2
ones, the width the packed design spaces are built around) where rounding up to it pads no
more than the narrow block (8) would, else the narrow block; a tensor of at most
`STEM_CHANNELS` channels (an image) is one block of its own channels (int8: padded to the
dot product's 4). Because the block is a function of the channel count, a conv's output
and every elementwise op of it agree on the block, and two convs never need a transform
between them: a conv reads its input in whatever block it is and writes its output in its
own (`OIHW{bo}o{bi}i` weights, packed here at compile time: they are constants).

Per operator:
  conv2d (constant weights, no dilation)   blocked: plain, depthwise, grouped where the block
                                           divides each group's channels, the stem
  elementwise (bias, activations, residual blocked when one operand is; constants per channel
   adds, SE's channel scale, requantize)   or scalar; `clip` becomes maximum + minimum (which fuse)
  max / avg pool, global mean              blocked (a global mean keeps its blocks)
  channel concat, channel split            blocked when every part is whole blocks of one block
  anything else (reshape, shuffles, dense) NCHW: its blocked inputs are unpacked first

Padding. Padded channels of a conv's output are zero (zero weights, zero bias); the ops
after it may make them any finite value (a sigmoid makes them 0.5), which is harmless:
every conv reads them through zero weights and the unpack slices them off. So a padded
tensor stays blocked only through ops that keep finite values finite (`PAD_SAFE`, and a
division by a constant), and concat or split of padded tensors (which would interleave the
padding) runs in NCHW.

int8 (a quantized network on a CPU with a dot product): convs of int8 weights take the dot
product's `OIHW{bo}o4i` layout, their input cast to uint8 where it is provably in [0, 127]
(`value_range`); signed data needs weights in [-127, 127]. An int8 depthwise conv over
non-negative data in blocks of 16 with at most 4 taps a row takes `OIHW16o4w` (graph pack's
`depthwise_dot`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .graph import OpInfo, Rebuilder, const_value, dtype_of, op_sequence, shape_of
from .packed_ops import DOT_REDUCE, depthwise_dot_kernel_layout, packed_data_layout, packed_depthwise_kernel_layout
from .value_range import ValueRange

STEM_CHANNELS = 4  # a tensor of at most this many channels (an image) is one block
UNARY = {
    "nn.relu",
    "astype",
    "round",
    "sigmoid",
    "tanh",
    "negative",
    "abs",
    "floor",
    "ceil",
    "nn.silu",
    "nn.gelu",
    "exp",
    "sqrt",
    "rsqrt",
    "log",
}
BINARY = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "right_shift", "left_shift", "power"}
# ops that map finite values to finite values: a padded tensor may pass through them blocked
PAD_SAFE = {
    "nn.relu",
    "astype",
    "round",
    "sigmoid",
    "tanh",
    "negative",
    "abs",
    "floor",
    "ceil",
    "nn.silu",
    "nn.gelu",
    "add",
    "subtract",
    "multiply",
    "maximum",
    "minimum",
    "right_shift",
    "left_shift",
    "clip",
}
POOLS = {"nn.max_pool2d", "nn.avg_pool2d"}


@dataclass(frozen=True)
class LayoutParams:
    lanes: int = 16  # the wide block: float32 lanes the packed spaces vectorize over
    narrow: int = 8  # the block where the wide one would pad more
    depthwise_dot: bool = True  # int8 depthwise convs on the dot product (blocks of 16)


def params_for(target_json: dict[str, Any]) -> LayoutParams:
    """The blocks for a CPU target (its JSON): 16 / 8 float lanes on x86 (AVX-512's register; on
    AVX2 two registers, as the packed spaces were measured), 8 / 4 on ARM (NEON's 4 lanes)."""
    if str(target_json.get("mtriple", "")).startswith(("arm", "aarch64")):
        return LayoutParams(lanes=8, narrow=4)
    return LayoutParams()


def block_for(channels: int, p: LayoutParams, int8: bool = False) -> tuple[int, int]:
    """(block, padded channels) of a tensor of `channels` channels (see the module doc)."""
    if channels <= STEM_CHANNELS:
        c = -(-channels // DOT_REDUCE) * DOT_REDUCE if int8 else channels
        return c, c
    wide, narrow = (-(-channels // b) * b for b in (p.lanes, p.narrow))
    return (p.lanes, wide) if wide == narrow else (p.narrow, narrow)


@dataclass
class Blocked:
    """An old tensor's value in the blocked layout."""

    expr: Any
    block: int
    channels: int  # its real channels (the rest of `padded` is padding)
    padded: int

    @property
    def pads(self) -> bool:
        return self.padded != self.channels


@dataclass
class Plain:
    """A rule's result that is an NCHW value (a global mean flattened to (N, C))."""

    expr: Any


RECORDED = object()  # a rule's result when it recorded the value itself (a split's fields)


@dataclass
class LayoutReport:
    convs: int = 0
    blocked_convs: int = 0
    plain_convs: list[str] = field(default_factory=list)  # "#index ...: why"
    transforms: Counter = field(default_factory=Counter)  # pack / unpack / reblock
    blocks: Counter = field(default_factory=Counter)  # conv output block -> count
    padded_convs: int = 0
    uint8_convs: int = 0
    nchw_ops: Counter = field(default_factory=Counter)  # ops that ran in NCHW between blocked tensors

    def to_dict(self) -> dict[str, Any]:
        return {
            "convs": self.convs,
            "blocked_convs": self.blocked_convs,
            "plain_convs": self.plain_convs,
            "transforms": dict(self.transforms),
            "blocks": {str(k): v for k, v in sorted(self.blocks.items())},
            "padded_convs": self.padded_convs,
            "uint8_convs": self.uint8_convs,
            "nchw_ops": dict(self.nchw_ops),
        }


class CpuLayout(Rebuilder):
    def __init__(self, mod: tvm.IRModule, p: LayoutParams):
        super().__init__()
        self.p = p
        self.info = {o.var: o for o in op_sequence(mod)}
        self.ranges = ValueRange(mod)
        self.blocked: dict[Any, Blocked] = {}
        self.unpacked: dict[Any, Any] = {}
        self.parts: dict[Any, tuple[list[Blocked], Any]] = {}  # a blocked split: its fields, its call
        self.unsigned: dict[Any, Any] = {}
        self.report = LayoutReport()

    # ---- moving between layouts ------------------------------------------------------------------
    def lookup(self, expr: Any) -> Any:
        """The NCHW value of an old expression (a blocked tensor unpacked, once)."""
        if isinstance(expr, relax.Var) and self.env.get(expr, 0) is None and expr not in self.unpacked:
            if expr in self.blocked:
                self.unpacked[expr] = self._unpack(self.blocked[expr], shape_of(expr))
            elif expr in self.parts:  # a blocked split used whole: split its NCHW input
                call = self.parts[expr][1]
                self.unpacked[expr] = self.emit(relax.Call(call.op, [self.lookup(call.args[0])], call.attrs))
        if isinstance(expr, relax.Var) and expr in self.unpacked:
            return self.unpacked[expr]
        return super().lookup(expr)

    def _unpack(self, b: Blocked, shape: tuple[int, ...]) -> Any:
        self.report.transforms["unpack"] += 1
        n, h, w = shape[0], shape[2], shape[3]
        y = self.emit(
            relax.op.reshape(relax.op.permute_dims(b.expr, [0, 4, 1, 5, 2, 3]), (n, b.padded, h, w)), "unpack"
        )
        if b.pads:
            y = self.emit(relax.op.strided_slice(y, [1], [0], [b.channels]), "unpad_channels")
        return y

    def _pack(self, x: Any, shape: tuple[int, ...], block: int, padded: int, kind: str = "pack") -> Blocked:
        """NCHW `x` (old shape `shape`) as blocks of `block`, its channels zero-padded to `padded`."""
        self.report.transforms[kind] += 1
        n, c, h, w = shape
        if padded != c:
            x = self.emit(relax.op.nn.pad(x, [0, 0, 0, padded - c, 0, 0, 0, 0]), "pad_channels")
        x = relax.op.reshape(x, (n, 1, padded // block, block, h, w))
        return Blocked(self.emit(relax.op.permute_dims(x, [0, 2, 4, 5, 1, 3]), kind), block, c, padded)

    def to_block(self, var: Any, block: int | None = None, int8: bool = False) -> Blocked:
        """`var` (an old 4-D tensor) blocked: as it is when it is, in `block` if one is asked."""
        have = self.blocked.get(var)
        if have is not None and (block is None or have.block == block):
            return have
        shape = shape_of(var)
        if block is None:
            block, padded = block_for(shape[1], self.p, int8)
        else:
            padded = -(-shape[1] // block) * block
        kind = "reblock" if have is not None else "pack"
        packed = self._pack(self.lookup(var), shape, block, padded, kind)
        if have is None:
            self.blocked[var] = packed
        return packed

    def _const(self, value: np.ndarray, b: Blocked, op_name: str) -> Any | None:
        """A scalar or per-channel constant in `b`'s blocks; None if it is neither."""
        if value.ndim == 0 or value.size == 1:
            return relax.const(value.reshape(()) if value.ndim <= 1 else value.reshape((1,) * value.ndim), value.dtype)
        v = value.reshape((1,) * (4 - value.ndim) + value.shape) if value.ndim < 4 else value
        if v.ndim != 4 or v.shape[0] != 1 or v.shape[2:] != (1, 1) or v.shape[1] != b.channels:
            return None
        if b.pads:  # a padded channel: add 0, multiply by 0, divide by 1
            v = np.pad(
                v,
                [(0, 0), (0, b.padded - b.channels), (0, 0), (0, 0)],
                constant_values=1 if op_name in ("divide", "power") else 0,
            )
        return relax.const(np.ascontiguousarray(v.reshape(1, b.padded // b.block, 1, 1, 1, b.block)))

    # ---- the rules -------------------------------------------------------------------------------
    def rewrite(self, index: int, binding: Any) -> Any:
        v, var = binding.value, binding.var
        if isinstance(v, relax.Var) and v in self.blocked and self.env.get(v, 0) is None:
            self.blocked[var] = self.blocked[v]
            return None
        if isinstance(v, relax.TupleGetItem) and isinstance(v.tuple_value, relax.Var) and v.tuple_value in self.parts:
            self.blocked[var] = self.parts[v.tuple_value][0][int(v.index)]
            return None
        op = self.info.get(var)
        new = None
        if op is not None:
            if op.name == "nn.conv2d":
                self.report.convs += 1
                new = self._conv(v, op)
            elif self._feeds_blocked(v):
                new = self._blocked_op(v, op, var)
                if new is None:
                    self.report.nchw_ops[op.name] += 1
        if new is None:
            return self.copy(binding)
        if isinstance(new, Plain):
            return new.expr
        if new is not RECORDED:
            self.blocked[var] = new
        return None

    def _feeds_blocked(self, call: Any) -> bool:
        return any(isinstance(a, relax.Var) and a in self.blocked for a in self._tensor_args(call))

    def _tensor_args(self, call: Any) -> list[Any]:
        out = []
        for a in call.args:
            fields = self.fields_of(a)
            out.extend(fields if fields is not None else [a])
        return out

    def _blocked_op(self, call: Any, op: OpInfo, var: Any) -> Blocked | Plain | object | None:
        name, out_shape = op.name, op.out_shape
        first = next(a for a in self._tensor_args(call) if isinstance(a, relax.Var) and a in self.blocked)
        src = self.blocked[first]
        if name in UNARY | BINARY | {"clip"}:
            return self._elementwise(call, op, src)
        if name in POOLS and str(call.attrs.layout) == "NCHW" and call.args[0].same_as(first):
            a, layout = call.attrs, packed_data_layout(1, src.block)
            f = relax.op.nn.max_pool2d if name == "nn.max_pool2d" else relax.op.nn.avg_pool2d
            y = f(
                src.expr,
                a.pool_size,
                a.strides,
                a.padding,
                a.dilation,
                bool(a.ceil_mode),
                bool(a.count_include_pad),
                layout,
                layout,
            )
            return Blocked(self.emit(y, str(var.name)), src.block, src.channels, src.padded)
        if name in ("mean", "nn.adaptive_avg_pool2d") and _is_global_mean(op):
            keep = name == "nn.adaptive_avg_pool2d" or bool(call.attrs.keepdims)
            y = self.emit(relax.op.mean(src.expr, axis=[2, 3], keepdims=keep), str(var.name))
            if keep:
                return Blocked(y, src.block, src.channels, src.padded)
            # (N, C/b, 1, b) -> (N, C): the channels in order, the padding off
            y = self.emit(relax.op.reshape(y, (out_shape[0], src.padded)), str(var.name) + "_flat")
            if src.pads:
                y = self.emit(relax.op.strided_slice(y, [1], [0], [src.channels]), "unpad_channels")
            return Plain(y)
        if name == "concat":
            return self._concat(call, op)
        if name == "split":
            return self._split(call, op, var, src)
        return None

    def _elementwise(self, call: Any, op: OpInfo, src: Blocked) -> Blocked | None:
        out = op.out_shape
        if out is None or len(out) != 4 or out[1] != src.channels:
            return None
        if src.pads and op.name not in PAD_SAFE:
            consts_only = all(const_value(a) is not None for a in call.args[1:])
            if not (op.name == "divide" and consts_only):
                return None
        name = str(op.var.name)
        if op.name == "clip":  # maximum + minimum: they fuse into the conv's epilogue, clip does not
            dtype = dtype_of(call.args[0])
            y = self.to_block(call.args[0], src.block).expr
            lo, hi = (_prim(b) for b in call.args[1:3])
            if lo != -np.inf:  # relu6 splits into two clips, each with one infinite bound
                y = self.emit(relax.op.maximum(y, relax.const(lo, dtype)), name + ("_lo" if hi != np.inf else ""))
            if hi != np.inf:
                y = self.emit(relax.op.minimum(y, relax.const(hi, dtype)), name)
            return Blocked(y, src.block, src.channels, src.padded)
        args = []
        for a in call.args:
            c = const_value(a)
            if c is not None:
                k = self._const(c, src, op.name)
                if k is None:
                    return None
                args.append(k)
                continue
            shape = shape_of(a)
            if shape is None or len(shape) != 4 or shape[1] != src.channels:
                return None  # a tensor broadcast across channels: NCHW
            args.append(self.to_block(a, src.block).expr)
        y = relax.Call(call.op, args, call.attrs, call.ty_args)
        return Blocked(self.emit(y, name), src.block, src.channels, src.padded)

    def _concat(self, call: Any, op: OpInfo) -> Blocked | None:
        if int(call.attrs.axis) % 4 != 1:
            return None
        fields = self.fields_of(call.args[0])
        parts = [self.blocked.get(f) for f in fields]
        if any(b is None or b.pads for b in parts) or len({b.block for b in parts}) != 1:
            return None
        y = self.emit(relax.op.concat([b.expr for b in parts], axis=1), str(op.var.name))
        c = sum(b.channels for b in parts)
        return Blocked(y, parts[0].block, c, c)

    def _split(self, call: Any, op: OpInfo, var: Any, src: Blocked) -> object | None:
        a = call.attrs
        if int(a.axis) % 4 != 1 or src.pads:
            return None
        ind = a.indices_or_sections
        c = src.channels
        if isinstance(ind, (int, tvm.tirx.IntImm)) or hasattr(ind, "value"):
            k = int(ind)
            if c % k:
                return None
            bounds = [c // k * i for i in range(k + 1)]
        else:
            bounds = [0, *(int(i) for i in ind), c]
        if any(x % src.block for x in bounds):
            return None
        b = src.block
        self.parts[var] = (
            [
                Blocked(
                    self.emit(relax.op.strided_slice(src.expr, [1], [lo // b], [hi // b]), "split"), b, hi - lo, hi - lo
                )
                for lo, hi in zip(bounds, bounds[1:])
            ],
            call,
        )
        return RECORDED

    # ---- convs -----------------------------------------------------------------------------------
    def _plain(self, op: OpInfo, why: str) -> None:
        self.report.plain_convs.append(f"{op.describe()}: {why}")
        return None

    def _conv(self, call: Any, op: OpInfo) -> Blocked | None:
        a = call.attrs
        w = const_value(call.args[1])
        if w is None:
            return self._plain(op, "its weight is not a constant")
        if str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW" or str(a.out_layout) not in ("NCHW", ""):
            return self._plain(op, f"layouts {a.data_layout}/{a.kernel_layout}")
        if any(int(d) != 1 for d in a.dilation):
            return self._plain(op, f"dilation {[int(d) for d in a.dilation]}")
        x_var = call.args[0]
        shape = shape_of(x_var)
        if shape is None or len(shape) != 4 or not isinstance(x_var, relax.Var):
            return self._plain(op, "its input is not a 4-D tensor")
        int8 = str(w.dtype) == "int8"
        o, i, kh, kw = w.shape
        groups, cin = int(a.groups), shape[1]
        depthwise = groups == cin == o and i == 1
        x = self.to_block(x_var, None, int8)
        if depthwise:
            return self._depthwise(call, op, w, x)
        if groups == 1:
            bo, po = block_for(o, self.p, int8)
            wp = np.pad(w, [(0, po - o), (0, x.padded - i), (0, 0), (0, 0)])
            return self._dense_conv(call, op, x, wp, bo, po, o)
        # grouped: each group whole blocks of its input and of its output
        ipg, opg = cin // groups, o // groups
        bo, po = block_for(o, self.p, int8)
        if x.pads or po != o or ipg % x.block or opg % bo or int8:
            return self._plain(op, f"groups={groups}: {ipg} -> {opg} channels a group, blocks {x.block} -> {bo}")
        wp = w.reshape(o // bo, bo, i // x.block, x.block, kh, kw).transpose(0, 2, 4, 5, 1, 3).copy()
        y = relax.op.nn.conv2d(
            x.expr,
            relax.const(wp),
            a.strides,
            a.padding,
            a.dilation,
            groups,
            packed_data_layout(1, x.block),
            f"OIHW{bo}o{x.block}i",
            packed_data_layout(1, bo),
            out_dtype=_out_dtype(call),
        )
        return self._blocked_conv(y, op, bo, o, po)

    def _blocked_conv(self, y: Any, op: OpInfo, block: int, channels: int, padded: int) -> Blocked:
        self.report.blocked_convs += 1
        self.report.blocks[block] += 1
        self.report.padded_convs += padded != channels
        return Blocked(self.emit(y, str(op.var.name)), block, channels, padded)

    def _dense_conv(self, call: Any, op: OpInfo, x: Blocked, w: np.ndarray, bo: int, po: int, o: int) -> Blocked | None:
        """A groups = 1 conv: weights (po, x.padded, kh, kw) -> OIHW{bo}o{bi}i, or the dot
        product's OIHW{bo}o4i for int8."""
        a = call.attrs
        _, pi, kh, kw = w.shape
        data = x.expr
        if str(w.dtype) == "int8":
            r = DOT_REDUCE
            data = self._unsigned(call.args[0], x)
            if dtype_of(data) == "int8" and int(w.min()) < -127:
                return self._plain(
                    op,
                    "signed int8 data and an int8 weight of -128: the CPU's dot product for "
                    "signed data takes weights in [-127, 127]",
                )
        else:
            r = x.block
        wp = w.reshape(po // bo, bo, pi // r, r, kh, kw).transpose(0, 2, 4, 5, 1, 3).copy()
        y = relax.op.nn.conv2d(
            data,
            relax.const(wp),
            a.strides,
            a.padding,
            a.dilation,
            1,
            packed_data_layout(1, x.block),
            f"OIHW{bo}o{r}i",
            packed_data_layout(1, bo),
            out_dtype=_out_dtype(call),
        )
        return self._blocked_conv(y, op, bo, o, po)

    def _depthwise(self, call: Any, op: OpInfo, w: np.ndarray, x: Blocked) -> Blocked:
        a = call.attrs
        c, _, kh, kw = w.shape
        b, cp = x.block, x.padded
        w = np.pad(w, [(0, cp - c), (0, 0), (0, 0), (0, 0)])
        data = x.expr
        if (
            str(w.dtype) == "int8"
            and self.p.depthwise_dot
            and b == 16
            and kw <= DOT_REDUCE
            and self._in_0_127(call.args[0])
        ):
            w = np.pad(w, [(0, 0), (0, 0), (0, 0), (0, DOT_REDUCE - kw)])
            wp = w.reshape(cp // b, b, 1, kh, 1, DOT_REDUCE).transpose(0, 2, 3, 4, 1, 5).copy()
            pt, pl, pb, pr = (int(p) for p in a.padding)
            y = relax.op.nn.conv2d(
                data,
                relax.const(wp),
                a.strides,
                (pt, pl, pb, pr + DOT_REDUCE - kw),
                a.dilation,
                cp,
                packed_data_layout(1, b),
                depthwise_dot_kernel_layout(b),
                packed_data_layout(1, b),
                out_dtype=_out_dtype(call),
            )
        else:
            wp = w.reshape(cp // b, b, 1, kh, kw).transpose(0, 2, 3, 4, 1).copy()
            y = relax.op.nn.conv2d(
                data,
                relax.const(wp),
                a.strides,
                a.padding,
                a.dilation,
                cp,
                packed_data_layout(1, b),
                packed_depthwise_kernel_layout(b),
                packed_data_layout(1, b),
                out_dtype=_out_dtype(call),
            )
        return self._blocked_conv(y, op, b, c, cp)

    def _in_0_127(self, arg: Any) -> bool:
        return dtype_of(arg) == "int8" and self.ranges.nonnegative(arg)

    def _unsigned(self, arg: Any, x: Blocked) -> Any:
        """The blocked int8 conv input as uint8 when its values are provably in [0, 127]."""
        if not self._in_0_127(arg):
            return x.expr
        key = (arg, x.block)
        if key not in self.unsigned:
            self.unsigned[key] = self.emit(relax.op.astype(x.expr, "uint8"), "as_uint8")
        self.report.uint8_convs += 1
        return self.unsigned[key]


def _out_dtype(call: Any) -> str:
    """A conv's output type: its attribute, or its input's where the frontend left it unset."""
    d = str(call.attrs.out_dtype)
    return d if d not in ("", "void", "None") else dtype_of(call.args[0])


def _prim(arg: Any) -> float:
    """The number a clip bound holds (a PrimValue or a scalar constant)."""
    c = const_value(arg)
    v = arg.value
    return float(c) if c is not None else float(getattr(v, "value", v))


def _is_global_mean(op: OpInfo) -> bool:
    from .graph_pack import is_global_avg_pool

    return is_global_avg_pool(op)


def cpu_layout(mod: tvm.IRModule, p: LayoutParams = LayoutParams()) -> tuple[tvm.IRModule, LayoutReport]:
    """Every conv2d of a (BN-folded, optionally quantized) network blocked; see the module doc."""
    rw = CpuLayout(mod, p)
    return rw.run(mod), rw.report


def CpuLayoutPass(p: LayoutParams = LayoutParams()) -> tvm.ir.transform.Pass:  # noqa: N802 (TVM's pass naming)
    @tvm.ir.transform.module_pass(opt_level=0, name="vta_pipeline.CpuLayout")
    def _pass(mod, _ctx):
        return cpu_layout(mod, p)[0]

    return _pass
