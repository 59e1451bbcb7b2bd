"""What a network's offloaded convs call on a VTA board: run one conv on the simulator.

`vta_pipeline.vta.conv2d(data, kernel, [bias], [residual], spec, out)` is the packed function
that `offload.offload_convs` puts in place of a packed conv and its epilogue (Relax's
`call_dps_packed`: the output tensor is the last argument). `spec` is a JSON string: the
VTA config, the workload, the epilogue, the knobs and the cycle model. The first call of a
spec compiles its program (instructions and micro-ops in the simulator's DRAM); every call
writes its tensors where the program reads them, runs it and copies the int8 output out.

The simulator counts cycles; `vta_pipeline.vta.counters(reset)` returns, per spec since the
last reset, the calls, the simulated cycles and the host seconds spent simulating (JSON), so
an evaluation can report the network's time on VTA: simulated time of its convs plus the
time of the rest on the board's CPU (the wall time less the simulating).
`vta_pipeline.vta.set_functional(False)` switches the session to timing only: a program's
cycles do not depend on the values, so a call of a spec already run is its cycles again, with
no simulating, and its output is not computed. What the timed runs of an evaluation use once a
functional run has checked the output: an untuned resnet18 simulates for minutes per run.

Counters live in the process that runs the network: on a board, the session's (TVM forks one
per session), so run and read them in one session.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .config import VTAConfig
from .conv import ConvWorkload, Epilogue, Knobs, Program, compile_conv, run_conv
from .simulator import STRICT, CycleModel, Dram, HardwareRules, Simulator

CONV2D = "vta_pipeline.vta.conv2d"
COUNTERS = "vta_pipeline.vta.counters"
SET_FUNCTIONAL = "vta_pipeline.vta.set_functional"


@dataclass(frozen=True)
class ConvSpec:
    """Everything the board needs to run one offloaded conv (its weights come as arguments)."""

    vta: dict[str, Any]
    workload: ConvWorkload
    epilogue: Epilogue
    knobs: Knobs
    cycle_model: CycleModel = CycleModel()

    def to_json(self) -> str:
        return json.dumps(
            {
                "vta": self.vta,
                "workload": asdict(self.workload),
                "epilogue": asdict(self.epilogue),
                "knobs": self.knobs.to_dict(),
                "cycle_model": asdict(self.cycle_model),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> ConvSpec:
        d = json.loads(text)
        return cls(
            d["vta"],
            ConvWorkload(**d["workload"]),
            Epilogue(**d["epilogue"]),
            Knobs(**d["knobs"]),
            CycleModel(**d["cycle_model"]),
        )

    def inputs(self) -> list[str]:
        """The tensor arguments before the output, in call order."""
        return (
            ["data", "kernel"]
            + (["bias"] if self.epilogue.bias else [])
            + (["residual"] if self.epilogue.residual_shift is not None else [])
        )


@dataclass
class _Compiled:
    spec: ConvSpec
    program: Program
    dram: Dram
    sim: Simulator
    timing: Simulator  # timing-only
    program_cycles: int | None = None  # of one run: the same for every run of the program
    calls: int = 0
    cycles: int = 0
    sim_seconds: float = 0.0


_compiled: dict[str, _Compiled] = {}
_lock = threading.Lock()
_functional = True
_rules: HardwareRules | None = STRICT  # the board's `--sim-mode`: the hardware's rules, or fsim's


def set_rules(rules: HardwareRules | None) -> None:
    """What this process's simulators enforce (the board's `--sim-mode`; before any session)."""
    global _rules
    _rules = rules
    _compiled.clear()


def rules() -> HardwareRules | None:
    return _rules


def _get(spec_json: str) -> _Compiled:
    """The spec's compiled program: parsed and compiled on its first call only."""
    with _lock:
        c = _compiled.get(spec_json)
        if c is None:
            spec = ConvSpec.from_json(spec_json)
            cfg = VTAConfig(**spec.vta)
            dram = Dram()
            c = _compiled[spec_json] = _Compiled(
                spec,
                compile_conv(spec.workload, spec.knobs, spec.epilogue, cfg, dram),
                dram,
                Simulator(cfg, spec.cycle_model, rules=_rules),
                Simulator(cfg, spec.cycle_model, functional=False, rules=_rules),
            )
    return c


def conv2d(*args: Any) -> None:
    """The packed function: tensors, the spec (a string), then the output tensor."""
    *tensors, spec_json, out = args
    c = _get(str(spec_json))
    names = c.spec.inputs()
    if len(tensors) != len(names):
        raise ValueError(f"{CONV2D}: {len(tensors)} tensors for {names} ({c.spec.workload})")
    start = time.perf_counter()
    if _functional:
        result, stats = run_conv(c.program, c.dram, c.sim, {n: t.numpy() for n, t in zip(names, tensors)})
        out.copyfrom(np.ascontiguousarray(result))
        c.program_cycles = stats.cycles
    elif c.program_cycles is None:
        c.program_cycles = c.timing.run(c.program.instructions, c.dram).cycles
    c.sim_seconds += time.perf_counter() - start
    c.calls += 1
    c.cycles += c.program_cycles


def counters(reset: bool = False) -> str:
    """Per spec: calls, simulated cycles, host seconds simulating; then zeroed if `reset`."""
    with _lock:
        reply = [
            {"spec": json.loads(key), "calls": c.calls, "cycles": c.cycles, "sim_seconds": c.sim_seconds}
            for key, c in _compiled.items()
            if c.calls
        ]
        if reset:
            for c in _compiled.values():
                c.calls, c.cycles, c.sim_seconds = 0, 0, 0.0
    return json.dumps(reply)


def set_functional(on: bool) -> None:
    global _functional
    _functional = bool(on)


def register() -> None:
    """Register the functions in this process (idempotent): a board's server, or a local VM."""
    import tvm_ffi

    tvm_ffi.register_global_func(CONV2D, conv2d, override=True)
    tvm_ffi.register_global_func(COUNTERS, lambda reset: counters(bool(reset)), override=True)
    tvm_ffi.register_global_func(SET_FUNCTIONAL, set_functional, override=True)
