"""The VTA tuning tasks of an offloaded network, and its build under the tuned knobs.

One task per distinct (workload, epilogue structure), as the recipe tuned one task per conv
workload: the epilogue's numbers (the shift, the clip bounds) change no cycle, but its
structure (a bias, a residual, a left-shifted residual, a rounding add, a shift) adds loads
and ALU ops and takes accumulator space, so it is part of what the knobs are tuned for.

The network is offloaded once with the untuned knobs (task extraction) and its lowered
module built later with the tuned ones: `with_knobs` rewrites each call's spec, nothing else,
so the CPU functions the MetaSchedule records were tuned on are the same.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import tvm
from tvm import relax

from .conv import ConvWorkload, Epilogue, Knobs
from .runtime import CONV2D, ConvSpec

TASKS_FILE = "vta_tasks.json"


def epilogue_structure(epi: Epilogue) -> Epilogue:
    """The epilogue with every number that costs no cycle made canonical."""
    rs = epi.residual_shift
    return Epilogue(
        bias=epi.bias,
        residual_shift=None if rs is None else (rs > 0) - (rs < 0),
        round_add=int(bool(epi.round_add)),
        shift=int(bool(epi.shift)),
        clip_min=-127,
        clip_max=127,
        post_round_add=int(bool(epi.post_round_add)),
        post_shift=int(bool(epi.post_shift)),
    )


@dataclass(frozen=True)
class VtaTask:
    """Convs of the network that share a workload and an epilogue structure."""

    workload: ConvWorkload
    epilogue: Epilogue  # the structure (epilogue_structure): what the tuner compiles
    count: int

    @property
    def key(self) -> str:
        text = json.dumps({"workload": asdict(self.workload), "epilogue": asdict(self.epilogue)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def name(self) -> str:
        w = self.workload
        extras = "".join(
            c for c, on in (("b", self.epilogue.bias), ("r", self.epilogue.residual_shift is not None)) if on
        )
        kind = "dw" if w.depthwise else (f"g{w.groups}" if w.groups > 1 else "")
        return (
            f"vta_conv2d_{w.height}x{w.width}_{w.in_filter}_{w.out_filter}_k{w.kh}x{w.kw}"
            f"_s{w.stride_h}{'_' + kind if kind else ''}{'_' + extras if extras else ''}"
        )

    def ops(self) -> int:
        return self.workload.ops()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "workload": asdict(self.workload),
            "epilogue": asdict(self.epilogue),
            "count": self.count,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VtaTask:
        return cls(ConvWorkload(**d["workload"]), Epilogue(**d["epilogue"]), d["count"])


def tasks_of(convs: list[Any]) -> list[VtaTask]:
    """The tasks of an offload report's convs on VTA, in network order."""
    counts: dict[tuple[ConvWorkload, Epilogue], int] = {}
    for c in convs:
        if c.on_vta:
            k = (c.workload, epilogue_structure(c.epilogue))
            counts[k] = counts.get(k, 0) + 1
    return [VtaTask(wl, epi, n) for (wl, epi), n in counts.items()]


def describe(tasks: list[VtaTask], cpu_packed_convs: int) -> str:
    """What runs on VTA and what stays on the CPU, for the run's log."""
    return (
        f"{sum(t.count for t in tasks)} packed conv(s) on VTA as {len(tasks)} knob task(s): "
        f"{', '.join(t.name for t in tasks)}; {cpu_packed_convs} packed conv(s) stay on the CPU"
    )


def save_tasks(out_dir: Path, tasks: list[VtaTask]) -> None:
    (Path(out_dir) / TASKS_FILE).write_text(json.dumps([t.to_dict() for t in tasks], indent=1))


def load_tasks(extract_dir: Path) -> list[VtaTask]:
    """The VTA tasks an extraction wrote ([] for a network with none)."""
    p = Path(extract_dir) / TASKS_FILE
    return [VtaTask.from_dict(d) for d in json.loads(p.read_text())] if p.exists() else []


def with_knobs(mod: tvm.IRModule, knobs: dict[str, Knobs]) -> tuple[tvm.IRModule, int]:
    """`mod` with every offloaded conv of a task in `knobs` (task key -> knobs) compiled under
    those knobs; and how many calls changed."""
    changed = 0

    @relax.expr_functor.mutator
    class _Respec(relax.PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            nonlocal changed
            call = super().visit_call_(call)
            if not (
                isinstance(call.op, tvm.ir.Op)
                and call.op.name == "relax.call_dps_packed"
                and isinstance(call.args[0], relax.ExternFunc)
                and call.args[0].global_symbol == CONV2D
            ):
                return call
            *tensors, spec_imm = call.args[1].fields
            spec = ConvSpec.from_json(str(spec_imm.value))
            key = VtaTask(spec.workload, epilogue_structure(spec.epilogue), 1).key
            if key not in knobs:
                return call
            changed += 1
            new = tvm.ir.expr.StringImm(replace(spec, knobs=knobs[key]).to_json())
            return relax.Call(call.op, [call.args[0], relax.Tuple([*tensors, new])], call.attrs, call.ty_args)

    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    out["main"] = _Respec(mod).visit_expr(mod["main"])
    return out, changed
