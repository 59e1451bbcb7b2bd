"""Schedule steps more than one of our spaces takes: which blocks are spatial, how many row
bands a parallel loop gets, and the epilogue folded into a tile's write-back."""

from __future__ import annotations

from typing import Any


def is_spatial(stmt) -> bool:
    """Whether a block has no reduction axis (every iter var data-parallel)."""
    return all(int(iv.iter_type) == 0 for iv in stmt.iter_vars)  # IterVar.DataPar


def parallel_bands(target: Any = None) -> int:
    """Row bands per conv: one per core of the target (its "num-cores", else this machine's)."""
    import os

    cores = target.attrs.get("num-cores") if target is not None and "num-cores" in target.attrs else None
    return max(1, int(cores or os.cpu_count() or 1))


def fuse_epilogue(sch, acc) -> None:
    """Fold the elementwise blocks after the conv (bias add, residual add, ReLU, requantize)
    into the tile's write-back, so the conv's output never goes to memory before them. A block
    that cannot be folded (it broadcasts the result over a wider tensor) runs on its own,
    vectorized (`_schedule_wide_consumer`), not as one scalar loop."""
    while True:
        consumers = sch.get_consumers(acc)
        if len(consumers) != 1:
            return
        try:
            sch.reverse_compute_inline(consumers[0])
        except Exception:  # noqa: BLE001 - not elementwise in the tile's indices: schedule it alone
            try:
                _schedule_wide_consumer(sch, consumers[0])
            except Exception:  # noqa: BLE001 - loops it cannot fuse or split: it stays as lowered
                pass
            return


def _schedule_wide_consumer(sch, block) -> None:
    """A block after the conv that its tile could not absorb (it broadcasts the conv's result
    over a wider tensor): its packed lanes vectorized, and its outer loops split over the
    cores or not, a knob. Such a block streams memory and computes little: spread over the
    cores it can lose to one core streaming it, so the measurement decides, per board."""
    loops = sch.get_loops(block)
    from tvm.tirx import IterVar

    if not loops or any(iv.iter_type != IterVar.DataPar for iv in sch.get(block).iter_vars):  # a reduction
        return
    lanes = loops[-1] if int(sch.get(loops[-1]).extent) <= 64 else None
    outer = loops[:-1] if lanes is not None else loops
    cores = parallel_bands()
    if outer and cores > 1:
        fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        jobs = sch.sample_categorical([1, cores], probs=[0.5, 0.5])
        sch.parallel(sch.split(fused, factors=[jobs, None])[0])
    if lanes is not None:
        sch.vectorize(lanes)
