"""The CPU's int8 dot-product instructions as MetaSchedule tensor intrinsics.

Every x86 int8 dot product multiplies uint8 activations by int8 weights, four at a time
into one int32 lane. The tensor intrinsic's contract (TVM's `dot_product_16x4_u8i8i32_desc`)
is 16 output lanes x 4 reduction steps:

    C[i] += int32(A[k]) * int32(B[i, k])     A: 4 x uint8, B: 16 x 4 int8 (contiguous), C: 16 x int32

which the `x86` pack layout produces: weights `OIHW16o4i`, activations `NCHW1n16c` in uint8.
A network packed in blocks of 8 channels (mobilenet_v2's 24 and 144) gets the same contract
over 8 lanes (`OIHW8o4i`, `NCHW1n8c`): one 256-bit register of int32 sums.
Three implementations, picked by what the target's CPU has:
- `vnni` (AVX512-VNNI, cascadelake and later): one `vpdpbusd` per 16 lanes on 512-bit
  registers, or per 8 lanes on 256-bit ones (AVX512-VL). TVM 0.27's registered intrinsic
  declares the operands as int32x16 and the wheel's LLVM 22 rejects the call ("Call
  parameter type does not match function signature"); ours uses the byte-vector types LLVM
  declares.
- `avx512` (skylake-avx512, 16 lanes): `vpmaddubsw` + `vpmaddwd` on 512-bit registers.
- `avx2` (Haswell, Zen; and the 8-lane form on AVX-512 CPUs without VNNI): the same pair on
  256-bit registers, one per 8 lanes.
- on aarch64, `sdot` (ARMv8.2's dot product: Cortex-A76 and later) or, on ARMv8.0 cores
  such as RK3399's Cortex-A72, NEON's `smull` + `saddlp` + `addp`: 4 lanes per 128-bit
  register, any of 16, 8 or 4 lanes (`_arm_step`).
`vpmaddubsw` adds two uint8 x int8 products into an int16 with saturation, so the AVX2
and AVX-512 forms are exact only while |a0*b0 + a1*b1| <= 32767. The pack layout feeds
them activations in [0, 127] (non-negative int8 values, the requantize clamp keeps
|x| <= 127) and weights in [-127, 127]: 2 * 127 * 127 = 32258. VNNI has no such limit.

Signed activations (mobilenet_v2's expansions read a linear bottleneck's output) take the
same instructions through the sign identity a * b = |a| * (sign(a) * b): the data's
magnitudes are uint8 (|-128| = 128 fits), and each weight takes its activation's sign
(`vpsignb` on 256-bit registers; a compare and a masked subtract on 512-bit ones, which
have no `vpsignb`). |a| <= 128 and |sign(a) * b| <= 127 keep a pair within
2 * 128 * 127 = 32512, so it is exact for any int8 data and weights in [-127, 127] (a -128
weight would flip to itself; quantize clips weights to +-127 and graph pack refuses a
signed-data conv whose weights hold -128). Two more operations per step than the uint8
form, instead of MetaSchedule's generic space.

The depthwise form (`DEPTHWISE_VNNI`) takes one row of a depthwise conv's taps for 16
channels, four taps (a 3-tap row padded with a zero weight, graph pack's `depthwise_dot`):

    C[i] += int32(A[k, i]) * int32(B[i, k])     A: 4 taps x 16 channels int8 in [0, 127], B: 16 x 4 int8

A's 64 bytes are 4 consecutive input pixels of the packed data (`NCHW1n16c`), tap-major;
`vpermb` (AVX512-VBMI) regroups them channel-major, 4 bytes per int32 lane, and one
`vpdpbusd` adds the row into the 16 sums: 48 multiply-adds per instruction, against a sign
extension, a `vpmulld` and a `vpaddd` per tap of 16 channels on int32 lanes. `vpdpbusd`
reads A's bytes as uint8; A is int8 only so that the conv that writes it keeps its type, and
graph pack uses the form only where it proved A's values in [0, 127], where the two types
are the same bytes.

MetaSchedule replays the intrinsic by name (tuning and the tuned build), so `register()`
must run in both processes; builder workers receive already-lowered candidates. All are
defined here rather than imported from `tvm.s_tir.tensor_intrin`, whose import parses
every intrinsic TVM ships (tens of seconds on this machine).
"""

from __future__ import annotations

import threading
from typing import Any

LANES, REDUCE = 16, 4
NARROW_LANES = 8  # the 8-lane form, for networks packed in blocks of 8 channels


def intrinsic_name(isa: str, lanes: int = LANES, signed: bool = False) -> str:
    """The registered name of the dot product of `lanes` lanes on `isa`; `signed`: int8 data."""
    return f"vta_pipeline.dot_{lanes}x4{'_s8' if signed else ''}_{isa}"


VNNI = intrinsic_name("vnni")
AVX512 = intrinsic_name("avx512")
AVX2 = intrinsic_name("avx2")
VNNI_8 = intrinsic_name("vnni", NARROW_LANES)
AVX2_8 = intrinsic_name("avx2", NARROW_LANES)
DEPTHWISE_VNNI = "vta_pipeline.depthwise_dot_16x4_vnni"
ARM_ISAS = ("sdot", "neon")
ARM_STEP = 4  # int32 lanes of one NEON register: ARM's blocks of 4 channels (the layout's narrow blocks)
# (lanes, isa) pairs registered: 16 lanes on each x86 ISA, 8 lanes on 256-bit registers; ARM's
# 128-bit registers take 4 lanes a step, so both lane counts on both of its forms
_FORMS = (
    (LANES, "vnni"),
    (LANES, "avx512"),
    (LANES, "avx2"),
    (NARROW_LANES, "vnni"),
    (NARROW_LANES, "avx2"),
    *((lanes, isa) for isa in ARM_ISAS for lanes in (LANES, NARROW_LANES, ARM_STEP)),
)

_registered = False


def register() -> None:
    """Register our intrinsics with TVM (idempotent)."""
    global _registered
    if _registered:
        return
    from tvm.s_tir import TensorIntrin

    for lanes, isa in _FORMS:
        for signed in (False, True):
            TensorIntrin.register(
                intrinsic_name(isa, lanes, signed), _desc(lanes, signed), _impl(lanes, isa, signed), override=True
            )
    TensorIntrin.register(DEPTHWISE_VNNI, *_depthwise(), override=True)
    _registered = True


def _arm_step(a: Any, b: Any, acc: Any, isa: str) -> Any:
    """4 lanes on one 128-bit register. Both forms multiply signed bytes: the data's (uint8
    values in [0, 127], or int8) read as int8 are the same numbers, so one form serves both.
    `sdot` (ARMv8.2's dot product): one instruction. `neon` (ARMv8.0, RK3399's Cortex-A72):
    `smull` of each half into int16 products (|a * b| <= 128 * 127 fits), `saddlp` adds
    neighbouring pairs into int32, `addp` the remaining pairs: exact for every int8 input."""
    from tvm.script import tirx as T

    if isa == "sdot":
        return T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.aarch64.neon.sdot.v4i32.v16i8"), acc, a, b, dtype="int32x4"
        )
    a8 = T.vectorlow(a, dtype="int8x8")  # the 4 bytes twice: both halves of `a` are alike

    def half(bh: Any) -> Any:
        products = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.aarch64.neon.smull.v8i16"), a8, bh, dtype="int16x8"
        )
        return T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.aarch64.neon.saddlp.v4i32.v8i16"), products, dtype="int32x4"
        )

    return acc + T.call_llvm_pure_intrin(
        T.llvm_lookup_intrinsic_id("llvm.aarch64.neon.addp.v4i32"),
        half(T.vectorlow(b, dtype="int8x8")),
        half(T.vectorhigh(b, dtype="int8x8")),
        dtype="int32x4",
    )


def _depthwise() -> tuple[Any, Any]:
    """The depthwise form's contract and its VNNI + VBMI implementation (see the module doc;
    A int8, its values in [0, 127])."""
    from tvm.script import tirx as T

    nbytes = 4 * LANES

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((4, 1, LANES), "int8", offset_factor=1),
        B: T.Buffer((LANES, 4), "int8", offset_factor=1),
        C: T.Buffer((LANES,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:LANES], A[0:4, 0:1, 0:LANES], B[0:LANES, 0:4])
            T.writes(C[0:LANES])
            for i in T.serial(0, LANES):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk, 0, vi], "int32") * T.cast(B[vi, vk], "int32")

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((4, 1, LANES), "int8", offset_factor=1),
        B: T.Buffer((LANES, 4), "int8", offset_factor=1),
        C: T.Buffer((LANES,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:LANES], A[0:4, 0:1, 0:LANES], B[0:LANES, 0:4])
            T.writes(C[0:LANES])
            # byte l of the result is tap l % 4 of channel l // 4
            lane = T.ramp(T.int8(0), T.int8(1), nbytes)
            index = (lane % T.broadcast(T.int8(4), nbytes)) * T.broadcast(T.int8(LANES), nbytes) + lane // T.broadcast(
                T.int8(4), nbytes
            )
            taps = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.permvar.qi.512"),
                A.vload([0, 0, 0], dtype=f"int8x{nbytes}"),
                index,
                dtype=f"int8x{nbytes}",
            )
            C[T.ramp(0, 1, LANES)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                C.vload([0], dtype=f"int32x{LANES}"),
                taps,
                B.vload([0, 0], dtype=f"int8x{nbytes}"),
                dtype=f"int32x{LANES}",
            )

    return desc, impl


def _desc(lanes: int, signed: bool) -> Any:
    """The contract: C[i] += A[k] * B[i, k] over `lanes` x 4, A uint8 (int8 if `signed`)."""
    from tvm.script import tirx as T

    data = "int8" if signed else "uint8"

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((4,), data, offset_factor=1),
        B: T.Buffer((lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    return desc


def _impl(lanes: int, isa: str, signed: bool) -> Any:
    """The contract on `isa`'s instructions: one step per 16 (512-bit) or 8 (256-bit) lanes."""
    from tvm.script import tirx as T

    data = "int8" if signed else "uint8"
    step = ARM_STEP if isa in ARM_ISAS else 16 if isa == "avx512" or (isa == "vnni" and lanes == LANES) else 8
    steps = lanes // step

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((4,), data, offset_factor=1),
        B: T.Buffer((lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            for s in T.unroll(steps):
                C[T.ramp(s * step, 1, step)] = _step(A, B, C, s * step, step, isa, signed)

    return impl


def _step(A: Any, B: Any, C: Any, lo: Any, step: int, isa: str, signed: bool) -> Any:
    """C[lo : lo + step] plus the 4-deep dot products of A with B's rows lo .. lo + step."""
    from tvm import tirx
    from tvm.script import tirx as T

    nbytes = 4 * step
    bits = 32 * step
    # the 4 data bytes, repeated once per int32 lane
    a = T.reinterpret(
        T.broadcast(T.reinterpret(A.vload([0], f"{A.dtype}x4"), dtype="int32"), step), dtype=f"int8x{nbytes}"
    )
    b = B.vload([lo, 0], dtype=f"int8x{nbytes}")
    if isa in ARM_ISAS:
        return _arm_step(a, b, C.vload([lo], dtype="int32x4"), isa)
    if signed:  # |a| * (sign(a) * b)
        if bits == 256:
            psign = T.llvm_lookup_intrinsic_id("llvm.x86.avx2.psign.b")
            a, b = (
                T.call_llvm_pure_intrin(psign, a, a, dtype=f"int8x{nbytes}"),
                T.call_llvm_pure_intrin(psign, b, a, dtype=f"int8x{nbytes}"),
            )
        else:
            negative = a < T.broadcast(T.int8(0), nbytes)
            zero = T.broadcast(T.int8(0), nbytes)
            a, b = tirx.Select(negative, zero - a, a), tirx.Select(negative, zero - b, b)
    acc = C.vload([lo], dtype=f"int32x{step}")
    if isa == "vnni":
        return T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id(f"llvm.x86.avx512.vpdpbusd.{bits}"), acc, a, b, dtype=f"int32x{step}"
        )
    madd_ub, madd_wd = (
        ("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512")
        if bits == 512
        else ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd")
    )
    pairs = T.call_llvm_pure_intrin(
        T.llvm_lookup_intrinsic_id(madd_ub), T.reinterpret(a, dtype=f"uint8x{nbytes}"), b, dtype=f"int16x{2 * step}"
    )
    return acc + T.call_llvm_pure_intrin(
        T.llvm_lookup_intrinsic_id(madd_wd), pairs, T.broadcast(T.int16(1), 2 * step), dtype=f"int32x{step}"
    )


def intrinsic_for(target: Any, lanes: int = LANES, signed: bool = False) -> str | None:
    """The dot-product intrinsic of `lanes` output lanes (16, or 8; on aarch64 also 4) this
    target's CPU runs, for uint8 data (int8 if `signed`), or None (neither x86 nor aarch64, no
    AVX2, or another lane count)."""
    from tvm.target import codegen

    if target.kind.name != "llvm":
        return None
    triple = str(target.attrs.get("mtriple", "") or "")
    arm = triple.startswith("aarch64")
    if lanes not in ((LANES, NARROW_LANES, ARM_STEP) if arm else (LANES, NARROW_LANES)):
        return None
    if triple and not arm and not triple.startswith(("x86_64", "i686", "i386")):
        return None
    try:
        has = lambda feature: bool(codegen.target_has_features([feature], target))  # noqa: E731
        if arm:  # ARMv8.2's dot product where the CPU has it, else NEON's multiply and pairwise adds
            return intrinsic_name("sdot", lanes, signed) if has("dotprod") else intrinsic_name("neon", lanes, signed)
        if has("avx512vnni") and (lanes == LANES or has("avx512vl")):
            return intrinsic_name("vnni", lanes, signed)
        if has("avx512bw") and lanes == LANES:
            return intrinsic_name("avx512", lanes, signed)
        if has("avx2"):
            return intrinsic_name("avx2", lanes, signed)
    except Exception:  # noqa: BLE001 - an mcpu LLVM does not know: no tensorization, the default rules
        return None
    return None


def depthwise_intrinsic_for(target: Any) -> str | None:
    """The depthwise form's intrinsic where the target's CPU has both VNNI and VBMI, else None."""
    from tvm.target import codegen

    if target.kind.name != "llvm":
        return None
    try:
        if codegen.target_has_features(["avx512vnni", "avx512vbmi"], target):
            return DEPTHWISE_VNNI
    except Exception:  # noqa: BLE001 - an mcpu LLVM does not know
        return None
    return None


def space_generator(target: Any, workload: Any, failures: TensorizeFailures | None = None) -> Any:
    """MetaSchedule's x86 design space with the dot-product rule, for workloads that multiply
    uint8 by int8; "post-order-apply" (the defaults) for everything else.

    The rule list is MetaSchedule's own for llvm with `MultiLevelTilingWithIntrin` placed
    before the plain `MultiLevelTiling` (the block a rule matches first is tiled by it), and
    `RewriteTensorize` among the postprocessors, as its x86 VNNI defaults do."""
    intrin = intrinsic_for(target)
    if intrin is None or intrin.endswith(ARM_ISAS) or not _multiplies_uint8(workload):
        return "post-order-apply"
    register()
    from tvm.s_tir import meta_schedule as ms

    rules = list(ms.schedule_rule.ScheduleRule.create("llvm"))
    at = next(i for i, r in enumerate(rules) if type(r).__name__ == "MultiLevelTiling")
    rules.insert(
        at,
        ms.schedule_rule.MultiLevelTilingWithIntrin(
            intrin,
            structure="SSRSRS",
            tile_binds=None,
            max_innermost_factor=64,
            vector_load_lens=None,
            reuse_read=None,
            reuse_write=ms.schedule_rule.ReuseType(req="may", levels=[1, 2], scope="global"),
        ),
    )
    # No RewriteLayout: OIHW16o4i already is the layout the intrinsic reads (packed once, by
    # graph pack), and MetaSchedule's layout rewrite of tensorized blocks crashed candidate
    # generation here (RemoveLayoutRewriteBlock: "ind.as<PrimVar>()").
    postprocs = [
        ms.postproc.DisallowDynamicLoop(),
        ms.postproc.RewriteParallelVectorizeUnroll(),
        ms.postproc.RewriteReductionBlock(),
        quiet_rewrite_tensorize(failures),
    ]
    return ms.space_generator.PostOrderApply(sch_rules=rules, postprocs=postprocs, mutator_probs="llvm")


AUTO_TENSORIZE = "meta_schedule.auto_tensorize"


class TensorizeFailures:
    """Candidates whose annotated block the intrinsic could not be applied to (kept as plain
    loops, as MetaSchedule's RewriteTensorize keeps them), counted per task, with the first
    error: said once per task in the log instead of one console warning per candidate."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.first: str | None = None

    def add(self, block: str, intrin: str, error: Exception) -> None:
        with self._lock:
            self.count += 1
            if self.first is None:
                msg = str(error).strip().splitlines()
                self.first = f"block {block!r}, intrinsic {intrin!r}: {msg[-1] if msg else type(error).__name__}"


def quiet_rewrite_tensorize(failures: TensorizeFailures | None = None):
    """MetaSchedule's RewriteTensorize (vectorize_init_loop=True) written in Python: each block
    annotated for auto-tensorization is tensorized with its intrinsic, its init block's loop
    vectorized; a block the intrinsic does not fit stays as plain loops and is counted in
    `failures` instead of printing "Tensorize failed with error" to the console."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.postproc import PyPostproc

    failures = failures if failures is not None else TensorizeFailures()

    @derived_object
    class QuietRewriteTensorize(PyPostproc):
        def __init__(self) -> None:
            self.failures = failures

        def _initialize_with_tune_context(self, context) -> None:
            pass

        def apply(self, sch) -> bool:
            jobs = []  # (function, block name, intrinsic): blocks are looked up again by name, as
            for gv, func in sch.mod.functions.items():  # tensorizing one replaces its subtree
                if not hasattr(func, "body"):
                    continue
                for block in _all_blocks(sch, gv.name_hint):
                    stmt = sch.get(block)
                    if AUTO_TENSORIZE in stmt.annotations:
                        jobs.append((gv.name_hint, stmt.name_hint, str(stmt.annotations[AUTO_TENSORIZE])))
            for func_name, name, intrin in jobs:
                block = sch.get_sblock(name, func_name)
                sch.unannotate(block, AUTO_TENSORIZE)
                if intrin:
                    try:
                        sch.tensorize(block, intrin)
                    except Exception as e:  # noqa: BLE001 - kept untensorized, as TVM does
                        self.failures.add(name, intrin, e)
                elif not name.startswith("init"):  # the reduction's init: vectorize its loop
                    (child,) = sch.get_child_blocks(block)
                    (loop,) = sch.get_loops(child)
                    sch.vectorize(loop)
            return True

        def clone(self):
            return QuietRewriteTensorize()

    return QuietRewriteTensorize()


def _all_blocks(sch, func_name: str) -> list:
    """Every block of a function, parents before children."""
    out, todo = [], [sch.get_sblock("root", func_name)]
    while todo:
        block = todo.pop()
        out.append(block)
        todo.extend(sch.get_child_blocks(block))
    return out[1:]


def dot_operands(block: Any) -> str | None:
    """The data type of a dot-product block (a TIR block statement that reads int8 weights and
    8-bit data, nothing else): "uint8", or "int8" for signed data (the sign-identity forms);
    None for any other block."""
    dtypes = frozenset(str(r.source.dtype) for r in block.reads)
    return {frozenset({"uint8", "int8"}): "uint8", frozenset({"int8"}): "int8"}.get(dtypes)


def _multiplies_uint8(workload: Any) -> bool:
    """Does a block of the workload read uint8 and int8 operands (a dot-product candidate)?"""
    from tvm.s_tir import Schedule

    sch = Schedule(workload)
    return any(dot_operands(sch.get(b)) == "uint8" for b in sch.get_child_blocks(sch.get_sblock("root")))
