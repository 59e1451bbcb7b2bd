"""What a VTA board runs for us, reached through the RPC tracker like any board's functions.

- `vta_pipeline.vta.measure(request)`: compile each knob config of a conv workload and time it
  on the board's simulator; request and reply are JSON strings (the configs, then per config
  its cycles and latency at the board's clock, or the error of its stream).
- `vta_pipeline.vta.conv2d` and `vta_pipeline.vta.counters`: what a network's offloaded convs
  call, and their simulated cycles (`runtime`).

`register()` runs in the board's server process (`vta_pipeline.vta.rpc_server`);
`board_measure` is the tuner's `Measure` through a tracker.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from . import runtime
from .config import VTAConfig
from .conv import ConvWorkload, Epilogue, Knobs
from .simulator import CycleModel
from .tuner import Measure, Measurement, local_measure

MEASURE = "vta_pipeline.vta.measure"


def _measure(request: str) -> str:
    req = json.loads(request)
    cfg = VTAConfig(**req["vta"])
    measure = local_measure(
        ConvWorkload(**req["workload"]),
        Epilogue(**req["epilogue"]),
        cfg,
        CycleModel(**req.get("cycle_model", {})),
        runtime.rules(),
    )
    return json.dumps([asdict(m) for m in measure([Knobs(**k) for k in req["knobs"]])])


def register() -> None:
    """Register the board's functions in this process (idempotent)."""
    import tvm_ffi

    tvm_ffi.register_global_func(MEASURE, _measure, override=True)
    runtime.register()  # what offloaded networks call


def request(
    wl: ConvWorkload, epi: Epilogue, cfg: VTAConfig, knobs: list[Knobs], model: CycleModel | None = None
) -> str:
    return json.dumps(
        {
            "vta": cfg.model_dump(),
            "workload": asdict(wl),
            "epilogue": asdict(epi),
            "knobs": [k.to_dict() for k in knobs],
            "cycle_model": asdict(model or CycleModel()),
        }
    )


def board_measure(
    tracker: str,
    key: str,
    wl: ConvWorkload,
    epi: Epilogue,
    cfg: VTAConfig,
    model: CycleModel | None = None,
    timeout_s: float = 300.0,
) -> Measure:
    """The tuner's Measure on a VTA board behind `tracker` (HOST:PORT) under `key`: one
    session per batch, as a board in a rack is shared between tasks."""
    from tvm import rpc

    host, port = tracker.rsplit(":", 1)

    def measure(batch: list[Knobs]) -> list[Measurement]:
        remote = rpc.connect_tracker(host, int(port)).request(key, priority=1, session_timeout=timeout_s)
        reply: Any = remote.get_function(MEASURE)(request(wl, epi, cfg, batch, model))
        return [Measurement(**m) for m in json.loads(str(reply))]

    return measure
