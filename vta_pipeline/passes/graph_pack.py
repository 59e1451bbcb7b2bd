"""Graph pack: VTA's `graph_pack` as a Relax rewrite.

Between a start operator (default the first `nn.max_pool2d`) and a stop operator
(default the first global average pool after it) every tensor is kept in VTA's blocked
layout:
    activations NCHW -> (N/b, C/c, H, W, b, c)          "NCHW{b}n{c}c"
    conv weights OIHW -> (O/c, I/c, kh, kw, c, c)        "OIHW{c}o{c}i" (packed here, at
                                                          compile time: they are constants)
The start operator runs unpacked and its output is packed; the stop operator's input is
unpacked (VTA's semantics), except that a stop that is a global mean reads the blocks as they
are and puts the channels in order after it (no transpose of the last feature map).
Elementwise ops right after the start operator (its bias, activation, quantize) stay
unpacked with it, so they fuse into its kernel and the pack moves a finished (int8) value.
Inside, conv2d becomes a packed conv2d whose lowering is VTA's
`conv2d_packed` (see packed_ops), elementwise ops (bias, residual add, shift, clamp, cast)
run on packed tensors with packed constants, pools and channel concats run on the blocked
layout. Anything else in the region, or channels not divisible by the block, is an error
that names the operator, its index and its shapes, raised before any tuning.

`layout="x86"` keeps the activations' layout but packs weights as `OIHW{c}o4i` and feeds
int8 convs whose input is provably in [0, 127] (interval analysis, `value_range`) that
input cast to uint8: the operands of the CPU's int8 dot product (see `int8_dot`), which
VTA's `OIHW{c}o{c}i` cannot use. Other int8 convs keep int8 data (the dot product's signed
form), whose weights must lie in [-127, 127]. Values and results are identical to the VTA
layout's.

`pad_channels` zero-pads channel counts the block does not divide up to the next multiple
inside the region (weights, activations and per-channel constants; the unpack slices them
off again), where it would otherwise stop with an error: mobilenet_v2's 24-channel layers in
blocks of 16, the width of one AVX-512 register of floats and of one 512-bit VNNI dot product.
A padded channel holds zeros (its weights and bias are zero, a divisor is one), and every
conv reads it through zero weights, so values are unchanged; a channel concat of padded
tensors, or a division of two, would interleave or divide the padding and is refused.

`stem` packs the start operator too, when it is a conv over fewer channels than the block
(an image's 3): its input is packed as one block, its output in the block, so its bias,
activation and requantize run on the packed output in the conv's kernel and the pack after
it disappears. An int8 stem's input is zero-padded to a multiple of 4 channels,
`NCHW1n4c`, with weights `OIHW{c}o4i`: the CPU's dot product reads it in groups of 4
channels (a quarter of them padding, against 13/16 in a block of 16). A float stem keeps
its channels, `NCHW1n3c` and `OIHW{c}o3i`. A float stem was a large part of an int8
network's time, and MetaSchedule's generic space for a 3-channel int8 NCHW conv slower
still; packed for the dot product it is a fraction of either (docs/performance.md,
"Numbers behind the library's choices").

`depthwise_dot` (x86 layout, blocks of 16) lays an int8 depthwise conv whose input is
provably in [0, 127] out for the CPU's dot product too: each kernel row zero-padded to 4
taps, `OIHW16o4w`, one more column of right padding for the zero tap to read; a row of taps
for 16 channels is then one `vpdpbusd` (`int8_dot`'s depthwise form, AVX512-VNNI with
AVX512-VBMI's `vpermb`), against a widening, a multiply and an add per tap on int32 lanes.
The input stays int8 (the same bytes as uint8 in [0, 127]; a cast would change the workload
of the conv that writes it, and void a store's records of that conv). A conv it does not
cover (signed input, more than 4 taps a row, blocks of 8) keeps `OIHW{c}o`.

`start_name_idx` / `stop_name_idx` pick the k-th occurrence of the name (0-based);
`nn.global_avg_pool2d` also matches Relax's forms of it (`mean` over H and W,
`nn.adaptive_avg_pool2d` to 1x1). `vta-pipeline pack-points` lists the candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..errors import UserError
from .graph import OpInfo, Rebuilder, const_value, dtype_of, main_bindings, op_sequence, shape_of
from .packed_ops import (
    DOT_REDUCE,
    depthwise_dot_kernel_layout,
    dot_kernel_layout,
    packed_data_layout,
    packed_depthwise_kernel_layout,
    packed_kernel_layout,
)
from .value_range import ValueRange

GLOBAL_AVG_POOL = "nn.global_avg_pool2d"
UNARY = {"nn.relu", "clip", "astype", "round", "sigmoid", "tanh", "negative", "abs", "floor", "ceil", "exp", "sqrt"}
BINARY = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "right_shift", "left_shift"}
POOLS = {"nn.max_pool2d", "nn.avg_pool2d"}
PACKABLE = UNARY | BINARY | POOLS | {"nn.conv2d", "concat"}
LAYOUTS = ("vta", "x86")


class PackError(UserError):
    """The requested region cannot be packed; the message names the operator."""


@dataclass(frozen=True)
class PackParams:
    bfactor: int = 1
    cfactor: int = 16
    weight_bits: int = 8
    start_name: str = "nn.max_pool2d"
    stop_name: str = GLOBAL_AVG_POOL
    start_name_idx: int | None = None
    stop_name_idx: int | None = None
    layout: str = "vta"
    pad_channels: bool = False
    stem: bool = False
    depthwise_dot: bool = False


def is_global_avg_pool(op: OpInfo) -> bool:
    a = op.call.attrs
    if op.name == "mean" and op.in_shapes and op.in_shapes[0] and len(op.in_shapes[0]) == 4:
        axes = {int(x) % 4 for x in a.axis} if a.axis is not None else {0, 1, 2, 3}
        return axes == {2, 3}
    if op.name == "nn.adaptive_avg_pool2d":
        return a.output_size is None or [int(s) for s in a.output_size] == [1, 1]
    return False


def matches(op: OpInfo, name: str) -> bool:
    return op.name == name or (name == GLOBAL_AVG_POOL and is_global_avg_pool(op))


def aliases(op: OpInfo) -> list[str]:
    return [GLOBAL_AVG_POOL] if is_global_avg_pool(op) else []


@dataclass
class Region:
    start: OpInfo
    stop: OpInfo | None  # None: packed to the end of the network


def find_region(ops: list[OpInfo], p: PackParams) -> Region:
    """The start and stop operators the parameters name; errors list what exists."""
    starts = [o for o in ops if matches(o, p.start_name)]
    hint = " `vta-pipeline pack-points MODEL` lists the operators and their occurrence indices."
    if not starts:
        names = sorted({o.name for o in ops} | {a for o in ops for a in aliases(o)})
        raise PackError(f"start operator {p.start_name!r} is not in the network (it has: {', '.join(names)})." + hint)
    k = p.start_name_idx or 0
    if k >= len(starts):
        raise PackError(
            f"start_name_idx {k}: the network has only {len(starts)} occurrence(s) of {p.start_name!r}." + hint
        )
    start = starts[k]
    stops = [o for o in ops if matches(o, p.stop_name)]
    if p.stop_name_idx is not None:
        if p.stop_name_idx >= len(stops):
            raise PackError(
                f"stop_name_idx {p.stop_name_idx}: the network has only {len(stops)} occurrence(s) of "
                f"{p.stop_name!r}." + hint
            )
        stop = stops[p.stop_name_idx]
    else:
        after = [o for o in stops if o.index > start.index]
        if not after:
            raise PackError(f"stop operator {p.stop_name!r} does not occur after the start {start.describe()}." + hint)
        stop = after[0]
    if stop.index <= start.index:
        raise PackError(f"the stop {stop.describe()} comes before the start {start.describe()}." + hint)
    return Region(start, stop)


class GraphPacker(Rebuilder):
    def __init__(self, mod: tvm.IRModule, p: PackParams):
        super().__init__()
        if p.weight_bits != 8:
            raise PackError(
                f"weight_bits={p.weight_bits}: weights narrower than 8 bits need bit-packed weight lanes, "
                "which this graph pack does not implement; use 8"
            )
        if p.layout not in LAYOUTS:
            raise PackError(f"pack layout {p.layout!r}: choose one of {', '.join(LAYOUTS)}")
        if p.layout == "x86" and p.cfactor % DOT_REDUCE:
            raise PackError(
                f"pack layout x86 splits the channel block in groups of {DOT_REDUCE}: "
                f"cfactor={p.cfactor} is not divisible by {DOT_REDUCE}"
            )
        self.p = p
        self.ops = op_sequence(mod)
        self.ranges = ValueRange(mod)
        self.unsigned: dict[Any, Any] = {}
        self.uint8_convs = 0
        self.region = find_region(self.ops, p)
        self.info = {o.var: o for o in self.ops}
        bindings = main_bindings(mod)
        pos = {b.var: i for i, b in enumerate(bindings)}
        self.hi = pos[self.region.stop.var] if self.region.stop else len(bindings)
        start = pos[self.region.start.var]
        if p.stem:
            self._check_stem(self.region.start)
        # the last op left unpacked: the start operator's elementwise tail, or the op before a packed stem
        self.lo = start - 1 if p.stem else self._elementwise_tail(bindings, start)
        self.packed: dict[Any, Any] = {}
        self.unpacked: dict[Any, Any] = {}
        self.layout = packed_data_layout(p.bfactor, p.cfactor)
        self.packed_ops: list[str] = []

    def _elementwise_tail(self, bindings: list, lo: int) -> int:
        """The index of the last op of the elementwise chain right after the start operator
        (unary ops of the previous value, binary ops of it and a constant: its bias add,
        activation and quantize), which stays unpacked with it: the pack comes after them, so
        they fuse with the start operator into one kernel. mobilenet_v2 packed from its stem
        ran the stem conv, then a second kernel that packed the conv's float output and
        added its bias, clipped and quantized it, which took longer than the stem conv."""
        prev = bindings[lo].var
        while lo + 1 < self.hi:
            op = self.info.get(bindings[lo + 1].var)
            if op is None or op.name not in UNARY | BINARY:
                break
            args = list(op.call.args)
            if op.name in UNARY:
                chained = args[0].same_as(prev)
            else:
                others = [a for a in args if not a.same_as(prev)]
                chained = len(others) == 1 and const_value(others[0]) is not None
            if not chained:
                break
            lo, prev = lo + 1, bindings[lo + 1].var
        return lo

    def _check_stem(self, op: OpInfo) -> None:
        """`stem` needs the start operator to be a plain conv over fewer channels than the block
        (and, with int8 weights, the x86 layout: VTA has no 4-channel block)."""
        why = None
        if op.name != "nn.conv2d":
            why = "it is not a conv2d (start the region at the stem: --pack-start nn.conv2d)"
        elif int(op.call.attrs.groups) != 1:
            why = f"it is a grouped conv (groups={int(op.call.attrs.groups)})"
        elif not op.in_shapes[0] or op.in_shapes[0][1] >= self.p.cfactor:
            why = (
                f"its input has {op.in_shapes[0][1] if op.in_shapes[0] else '?'} channels, which pack in the block "
                f"cfactor={self.p.cfactor} as they are (drop --pack-stem)"
            )
        elif dtype_of(op.call.args[1]) == "int8" and self.p.layout != "x86":
            why = "an int8 stem packs for the CPU's dot product, which reads the x86 layout (--pack-layout x86)"
        if why:
            raise PackError(f"cannot pack the stem {op.describe()}: {why}.")

    # ---- layouts ---------------------------------------------------------------------------------
    def _fail(self, op: OpInfo, why: str) -> PackError:
        return PackError(
            f"cannot pack {op.describe()}: {why}. Choose pack points around it "
            "(--pack-start/--pack-stop and their indices; `vta-pipeline pack-points` lists them)."
        )

    def _block_hint(self, *channels: int) -> str:
        """The fix for channels the block does not divide: a smaller block that divides them
        (the x86 int8 layout's dot product takes blocks of 16 or 8)."""
        smaller = (8,) if self.p.layout == "x86" else (8, 4)
        fits = [c for c in smaller if c < self.p.cfactor and not any(n % c for n in channels)]
        pad = "pad them to the block: --pad-channels (pack.pad_channels)"
        return f" (cfactor={fits[0]} divides them: --cfactor {fits[0]}; or {pad})" if fits else f" (or {pad})"

    def _check_nchw(self, shape, op: OpInfo, what: str) -> None:
        b, c = self.p.bfactor, self.p.cfactor
        if shape is None or len(shape) != 4:
            raise self._fail(op, f"{what} has shape {shape}, not NCHW")
        if shape[0] % b or (shape[1] % c and not self.p.pad_channels):
            raise self._fail(
                op,
                f"{what} {'x'.join(map(str, shape))}: batch must be divisible by bfactor={b} "
                f"and channels by cfactor={c}" + self._block_hint(shape[1]),
            )

    def padded(self, channels: int) -> int:
        """`channels` rounded up to the block when pad_channels is on (else as they are)."""
        cf = self.p.cfactor
        return -(-channels // cf) * cf if self.p.pad_channels else channels

    def pack_narrow(self, var: Any, op: OpInfo, cp: int) -> Any:
        """A tensor of fewer channels than the block (a stem's input) as one block of them,
        zero-padded to `cp` channels: NCHW{b}n{cp}c."""
        if shape_of(var)[0] % self.p.bfactor:
            raise self._fail(
                op, f"input {var.name}: batch {shape_of(var)[0]} is not divisible by bfactor={self.p.bfactor}"
            )
        return self._to_blocks(var, cp, cp, "pack_stem")

    def _to_blocks(self, var: Any, cp: int, block: int, name: str) -> Any:
        """NCHW `var`, its channels zero-padded to `cp`, as NCHW{b}n{block}c."""
        n, c, h, w = shape_of(var)
        b = self.p.bfactor
        x = self.lookup(var)
        if cp != c:
            x = self.emit(relax.op.nn.pad(x, [0, 0, 0, cp - c, 0, 0, 0, 0]), "pad_channels")
        x = relax.op.reshape(x, (n // b, b, cp // block, block, h, w))
        return self.emit(relax.op.permute_dims(x, [0, 2, 4, 5, 1, 3]), name)

    def pack(self, var: Any, op: OpInfo) -> Any:
        if var in self.packed:
            return self.packed[var]
        shape = shape_of(var)
        self._check_nchw(shape, op, f"input {var.name}")
        self.packed[var] = self._to_blocks(var, self.padded(shape[1]), self.p.cfactor, "pack")
        return self.packed[var]

    def lookup(self, expr: Any) -> Any:
        if isinstance(expr, relax.Var) and self.env.get(expr, 0) is None and expr in self.packed:
            if expr not in self.unpacked:
                n, c, h, w = shape_of(expr)
                cp = self.padded(c)
                y = relax.op.permute_dims(self.packed[expr], [0, 4, 1, 5, 2, 3])
                y = self.emit(relax.op.reshape(y, (n, cp, h, w)), "unpack")
                if cp != c:
                    y = self.emit(relax.op.strided_slice(y, [1], [0], [c]), "unpad_channels")
                self.unpacked[expr] = y
            return self.unpacked[expr]
        return super().lookup(expr)

    def _packed_const(self, value: np.ndarray, op: OpInfo) -> Any:
        if value.ndim == 0 or value.size == 1 and value.ndim <= 1:
            return relax.const(value)
        v = value.reshape((1,) * (4 - value.ndim) + value.shape) if value.ndim < 4 else value
        cf, c = self.p.cfactor, v.shape[1] if v.ndim == 4 else 0
        cp = self.padded(c)
        if v.ndim != 4 or v.shape[0] != 1 or v.shape[2:] != (1, 1) or cp % cf:
            raise self._fail(op, f"constant of shape {value.shape} is not a per-channel or scalar constant")
        if cp != c:  # a padded channel stays zero: add 0, multiply by 0, divide by 1
            fill = 1 if op.name == "divide" else 0
            v = np.pad(v, [(0, 0), (0, cp - c), (0, 0), (0, 0)], constant_values=fill)
        return relax.const(np.ascontiguousarray(v.reshape(1, v.shape[1] // cf, 1, 1, 1, cf)))

    def _operand(self, arg: Any, op: OpInfo) -> Any:
        c = const_value(arg)
        if c is not None:
            return self._packed_const(c, op)
        if isinstance(arg, relax.Var):
            return self.pack(arg, op)
        raise self._fail(op, f"argument {arg} is neither a tensor nor a constant")

    # ---- the rules -------------------------------------------------------------------------------
    def rewrite(self, index: int, binding: Any) -> Any:
        if index == self.hi and self._is_global_mean_of_packed(binding):
            return self._global_mean(binding)
        if not self.lo < index < self.hi:
            return self.copy(binding)
        v, var = binding.value, binding.var
        if isinstance(v, relax.Var) and v in self.packed:
            self.packed[var] = self.packed[v]
            return None
        op = self.info.get(var)
        if op is None:
            raise PackError(f"cannot pack binding {var.name} = {type(v).__name__}: not an operator call")
        if op.name not in PACKABLE:
            raise self._fail(op, f"{op.name} has no packed form")
        a = v.attrs
        name = str(var.name)
        if op.name == "nn.conv2d":
            new = self._conv(v, op)
        elif op.name in UNARY:
            new = relax.Call(v.op, [self._operand(v.args[0], op)] + list(v.args[1:]), a, v.ty_args)
        elif op.name in BINARY:
            if op.name == "divide" and self._pads(op.out_shape) and all(const_value(x) is None for x in v.args):
                raise self._fail(
                    op,
                    "a division of two tensors whose channels are padded would divide zero by "
                    "zero in the padding; choose a cfactor that divides the channels",
                )
            new = relax.Call(v.op, [self._operand(x, op) for x in v.args], a, v.ty_args)
        elif op.name in POOLS:
            self._check_nchw(op.out_shape, op, "output")
            f = relax.op.nn.max_pool2d if op.name == "nn.max_pool2d" else relax.op.nn.avg_pool2d
            new = f(
                self._operand(v.args[0], op),
                a.pool_size,
                a.strides,
                a.padding,
                a.dilation,
                bool(a.ceil_mode),
                bool(a.count_include_pad),
                self.layout,
                self.layout,
            )
        else:  # concat
            if int(a.axis) % 4 != 1:
                raise self._fail(op, f"concat along axis {int(a.axis)}; only channel concats can be packed")
            for f in self.fields_of(v.args[0]):
                if self._pads(shape_of(f)):
                    field = getattr(f, "name_hint", f)
                    raise self._fail(
                        op,
                        f"its input {field} has {shape_of(f)[1]} channels, which the block "
                        f"cfactor={self.p.cfactor} does not divide: a concat of padded tensors "
                        "would interleave their padding; choose a cfactor that divides them",
                    )
            fields = [self._operand(f, op) for f in self.fields_of(v.args[0])]
            new = relax.op.concat(fields, axis=1)
        self.packed[var] = self.emit(new, name)
        self.packed_ops.append(op.describe())
        return None

    def _is_global_mean_of_packed(self, binding: Any) -> bool:
        x = binding.value.args[0] if isinstance(binding.value, relax.Call) and binding.value.args else None
        return (
            self.region.stop is not None
            and self.region.stop.name == "mean"
            and is_global_avg_pool(self.region.stop)
            and isinstance(x, relax.Var)
            and x in self.packed
            and self.env.get(x, 0) is None
        )

    def _global_mean(self, binding: Any) -> Any:
        """The stop operator when it is a global mean (`mean` over H and W: how Relax imports
        resnet's and mobilenet's global average pool) of a packed tensor: the mean over the
        blocks' own H and W axes, then the channels in order. Unpacked first, it was a transpose
        of the whole last feature map in a kernel of its own. The same values: each channel's mean over
        the same H x W numbers."""
        op, b = self.region.stop, self.p.bfactor
        n, c = op.in_shapes[0][:2]
        cp = self.padded(c)
        y = self.emit(relax.op.mean(self.packed[binding.value.args[0]], axis=[2, 3]), "global_mean")
        if b > 1:  # (N/b, C/c, b, c): the batch's block before the channels
            y = self.emit(relax.op.permute_dims(y, [0, 2, 1, 3]), "global_mean_batch")
        y = relax.op.reshape(y, (n, cp))
        if cp != c:
            y = relax.op.strided_slice(self.emit(y, "global_mean_flat"), [1], [0], [c])
        return self.emit(relax.op.reshape(y, op.out_shape), str(binding.var.name))

    def _pads(self, shape) -> bool:
        return shape is not None and len(shape) == 4 and self.padded(shape[1]) != shape[1]

    def _conv(self, call: Any, op: OpInfo) -> Any:
        a = call.attrs
        w = const_value(call.args[1])
        if w is None:
            raise self._fail(op, "its weight is not a constant (weights must be bound to be packed)")
        if str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW":
            raise self._fail(op, f"layouts {a.data_layout}/{a.kernel_layout} are not NCHW/OIHW")
        cf = self.p.cfactor
        o, i, kh, kw = w.shape
        groups = int(a.groups)
        cin = op.in_shapes[0][1]
        if self.p.stem and op.var.same_as(self.region.start.var):
            return self._stem_conv(call, op, w)
        x = self._operand(call.args[0], op)
        depthwise = groups == cin == o and i == 1
        if groups == 1 or depthwise:  # zero weights read and write the padding
            po, pi = self.padded(o), (self.padded(i) if groups == 1 else i)
            w = np.pad(w, [(0, po - o), (0, pi - i), (0, 0), (0, 0)])
            o, i, groups = po, pi, (po if depthwise else 1)
        if groups == 1:
            if o % cf or i % cf:
                raise self._fail(
                    op,
                    f"weight {o}x{i}x{kh}x{kw}: output and input channels must be divisible by "
                    f"cfactor={cf}" + self._block_hint(o, i),
                )
            if self.p.layout == "x86":
                r = DOT_REDUCE
                wp = w.reshape(o // cf, cf, i // r, r, kh, kw).transpose(0, 2, 4, 5, 1, 3).copy()
                klayout = dot_kernel_layout(cf)
                x = self._unsigned(call.args[0], x)
                if str(w.dtype) == "int8" and dtype_of(x) == "int8" and int(w.min()) < -127:
                    raise self._fail(
                        op,
                        "its data can be negative and its int8 weights hold -128: the CPU's dot "
                        "product for signed data takes weights in [-127, 127] (quantize them "
                        "symmetrically, as vta-pipeline's quantize does, or use --pack-layout vta)",
                    )
            else:
                wp = w.reshape(o // cf, cf, i // cf, cf, kh, kw).transpose(0, 2, 4, 5, 1, 3).copy()
                klayout = packed_kernel_layout(cf)
        elif depthwise:
            if o % cf:
                raise self._fail(
                    op,
                    f"depthwise weight {o}x1x{kh}x{kw}: channels must be divisible by cfactor={cf}"
                    + self._block_hint(o),
                )
            if self._depthwise_dot(call, w):
                return self._depthwise_dot_conv(call, w, x)
            wp = w.reshape(o // cf, cf, 1, kh, kw).transpose(0, 2, 3, 4, 1).copy()
            klayout = packed_depthwise_kernel_layout(cf)
        else:
            raise self._fail(op, f"grouped conv2d with groups={groups} has no packed form (only 1 or depthwise)")
        return relax.op.nn.conv2d(
            x,
            relax.const(wp),
            a.strides,
            a.padding,
            a.dilation,
            groups,
            self.layout,
            klayout,
            self.layout,
            out_dtype=a.out_dtype,
        )

    def _depthwise_dot(self, call: Any, w: np.ndarray) -> bool:
        """Whether this depthwise conv takes the dot product's layout (`depthwise_dot`)."""
        return (
            self.p.depthwise_dot
            and self.p.layout == "x86"
            and self.p.cfactor == 16
            and str(w.dtype) == "int8"
            and w.shape[3] <= DOT_REDUCE
            and self._int8_in_0_127(call.args[0])
        )

    def _depthwise_dot_conv(self, call: Any, w: np.ndarray, x: Any) -> Any:
        """The depthwise conv with `OIHW16o4w` weights: each row's taps padded with zeros to 4,
        and as many more columns of right padding for them to read. Its data keeps its int8
        type: its values are in [0, 127], where int8 and uint8 are the same bytes, so the conv
        that writes them keeps its workload (and a store's records of it) and the dot product
        reads them as uint8."""
        a, cf = call.attrs, self.p.cfactor
        o, _, kh, kw = w.shape
        w = np.pad(w, [(0, 0), (0, 0), (0, 0), (0, DOT_REDUCE - kw)])
        wp = w.reshape(o // cf, cf, 1, kh, 1, DOT_REDUCE).transpose(0, 2, 3, 4, 1, 5).copy()
        pt, pl, pb, pr = (int(p) for p in a.padding)
        return relax.op.nn.conv2d(
            x,
            relax.const(wp),
            a.strides,
            (pt, pl, pb, pr + DOT_REDUCE - kw),
            a.dilation,
            o,
            self.layout,
            depthwise_dot_kernel_layout(cf),
            self.layout,
            out_dtype=a.out_dtype,
        )

    def _stem_conv(self, call: Any, op: OpInfo, w: np.ndarray) -> Any:
        """The stem conv on its input packed as one block (`pack_narrow`), output in the block.
        int8: the input channels zero-padded to a multiple of 4, weights `OIHW{c}o4i` (the dot
        product's groups); float: as they are, weights `OIHW{c}o{i}i` (no padding to multiply)."""
        a, cf = call.attrs, self.p.cfactor
        o, i, kh, kw = w.shape
        r = DOT_REDUCE if str(w.dtype) == "int8" else i
        po, pi = self.padded(o), -(-i // r) * r
        if po % cf:
            raise self._fail(
                op, f"weight {o}x{i}x{kh}x{kw}: output channels must be divisible by cfactor={cf}" + self._block_hint(o)
            )
        w = np.pad(w, [(0, po - o), (0, pi - i), (0, 0), (0, 0)])
        wp = w.reshape(po // cf, cf, pi // r, r, kh, kw).transpose(0, 2, 4, 5, 1, 3).copy()
        x = self.pack_narrow(call.args[0], op, pi)
        if str(w.dtype) == "int8":
            x = self._unsigned(call.args[0], x)
            if dtype_of(x) == "int8" and int(w.min()) < -127:
                raise self._fail(
                    op,
                    "its data can be negative and its int8 weights hold -128: the CPU's dot product "
                    "for signed data takes weights in [-127, 127]",
                )
        return relax.op.nn.conv2d(
            x,
            relax.const(wp),
            a.strides,
            a.padding,
            a.dilation,
            1,
            packed_data_layout(self.p.bfactor, pi),
            f"OIHW{cf}o{r}i",
            self.layout,
            out_dtype=a.out_dtype,
        )

    def _int8_in_0_127(self, arg: Any) -> bool:
        """Whether `arg` is int8 with values provably in [0, 127] (the same bytes as uint8)."""
        return dtype_of(arg) == "int8" and self.ranges.nonnegative(arg)

    def _unsigned(self, arg: Any, packed: Any) -> Any:
        """The packed int8 conv input as uint8 when its values are provably in [0, 127]."""
        if not self._int8_in_0_127(arg):
            return packed
        if arg not in self.unsigned:
            self.unsigned[arg] = self.emit(relax.op.astype(packed, "uint8"), "as_uint8")
        self.uint8_convs += 1
        return self.unsigned[arg]


@dataclass
class PackReport:
    start: str
    stop: str | None
    packed_ops: list[str]
    bfactor: int
    cfactor: int
    layout: str = "vta"
    uint8_convs: int = 0
    stem: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def graph_pack(mod: tvm.IRModule, p: PackParams) -> tuple[tvm.IRModule, PackReport]:
    """Pack the region of a (BN-folded, optionally quantized) network; see the module doc."""
    packer = GraphPacker(mod, p)
    out = packer.run(mod)
    region = packer.region
    return out, PackReport(
        region.start.describe(),
        region.stop.describe() if region.stop else None,
        packer.packed_ops,
        p.bfactor,
        p.cfactor,
        p.layout,
        packer.uint8_convs,
        p.stem,
    )


def GraphPack(p: PackParams) -> tvm.ir.transform.Pass:  # noqa: N802 (TVM's pass naming)
    @tvm.ir.transform.module_pass(opt_level=0, name="vta_pipeline.GraphPack")
    def _pass(mod, _ctx):
        return graph_pack(mod, p)[0]

    return _pass
