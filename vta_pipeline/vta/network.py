"""A network with offloaded convs, timed on a VTA board: simulated VTA time plus the CPU's.

On the simulator board a run's wall time is mostly the host simulating VTA, which says
nothing about VTA. What a Pynq would take is the convs' simulated cycles at the board's
clock plus what the rest of the network (stem, pools, classifier, the convs left on the
CPU) takes on the board's CPU: the wall time less the seconds spent simulating, both
counted in the session's process (`runtime.counters`).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any

from .runtime import COUNTERS, SET_FUNCTIONAL


@dataclass
class NetworkTime:
    """Per run, in milliseconds."""

    vta_ms: float  # the offloaded convs, simulated, at the board's clock
    cpu_ms: float  # the rest, measured on the board's CPU
    runs: int
    convs: list[dict[str, Any]] = field(default_factory=list)  # per offloaded conv: workload, knobs, cycles, ms

    @property
    def total_ms(self) -> float:
        return self.vta_ms + self.cpu_ms


def time_on_board(vm: Any, dev: Any, session: Any, args: list[Any], repeat: int = 3) -> NetworkTime:
    """Time `vm`'s main on the board `dev` belongs to (`session`: its RPC session, or a local
    one). The timed runs simulate timing only (the cycles do not depend on the values): check
    the output with a run before.

    Convs with the same spec (workload, epilogue, knobs) share one program and its counter,
    and TVM's time evaluator runs once more than it reports: one run alone first says how
    many calls of each spec a run makes."""
    counters, set_functional = session.get_function(COUNTERS), session.get_function(SET_FUNCTIONAL)
    set_functional(False)
    try:
        counters(True)
        vm["main"](*args)
        per_run = {_key(c): c["calls"] for c in json.loads(str(counters(True)))}
        walls = vm.time_evaluator("main", dev, number=1, repeat=repeat)(*args).results
    finally:
        set_functional(True)
    counted = json.loads(str(counters(False)))
    if not counted:
        raise RuntimeError(
            "no conv ran on VTA: the module has no offloaded convs, or the board's runtime "
            "is not registered (start it with `python -m vta_pipeline.vta.rpc_server`)"
        )
    convs, vta_s, sim_s = [], 0.0, 0.0
    for c in counted:
        clock = c["spec"]["cycle_model"]["clock_hz"]
        n = per_run[_key(c)]
        runs = c["calls"] / n
        vta_s += c["cycles"] / runs / clock
        sim_s += c["sim_seconds"] / runs
        cycles = c["cycles"] / c["calls"]
        convs.append(
            {
                "workload": c["spec"]["workload"],
                "knobs": c["spec"]["knobs"],
                "convs": n,
                "cycles": cycles,
                "ms": cycles / clock * 1e3,
            }
        )
    wall = statistics.fmean(walls)
    return NetworkTime(vta_s * 1e3, max(wall - sim_s, 0.0) * 1e3, len(walls), convs)


def _key(counted: dict[str, Any]) -> str:
    return json.dumps(counted["spec"], sort_keys=True)
