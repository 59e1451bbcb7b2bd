"""Step 5, build: compile the whole network, with the best schedules or untuned.

The tuned build applies the merged database to the same lowered module the tasks were
extracted from (records are matched by the structure of each fused function), then
compiles and exports one shared library for the target and host (cross-compiled when the
preset names a cross compiler). The untuned build of the same module is the baseline.

GPU kernels must bind their loops to blocks and threads; functions without a tuned record
get DLight's default GPU schedules (the same rules Relax's GPU pipelines use), so an
untuned or partly tuned network still builds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .tir import weight_prefetch

STEP = "build"
VERSION = 3  # 2: tuned weight layouts pre-packed at build time; 3: and read as constants, not a tuple per call
LIB = "model.so"
GPU_KINDS = ("cuda", "opencl", "vulkan", "metal", "rocm")


def default_gpu_schedules(mod, target):
    """DLight's GPU rules for every function MetaSchedule did not schedule, in a new module.

    DLight replaces the functions of the module it is given: it works on a shallow copy (the
    functions themselves are immutable), so a caller's module, such as a tuning task's, stays
    unscheduled."""
    import tvm
    from tvm.s_tir import dlight as dl

    with target:
        return dl.ApplyDefaultSchedule(
            dl.gpu.Matmul(),
            dl.gpu.GEMV(),
            dl.gpu.Reduction(),
            dl.gpu.GeneralReduction(),
            dl.gpu.Fallback(),
        )(tvm.IRModule(dict(mod.functions), attrs=mod.attrs))


def build_network(
    extract_dir: Path,
    target_spec: dict[str, Any],
    out_dir: Path,
    best_db_dir: Path | None = None,
    cross_compiler: str | None = None,
    vta_knobs: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """`vta_knobs` (VTA task key -> knobs): the offloaded convs' tuned configs; the convs of
    other tasks keep the untuned config they were extracted with."""
    import tvm
    from tvm import relax

    target = tvm.target.Target(target_spec)
    mod = tvm.ir.load_json((Path(extract_dir) / "lowered.json").read_text())
    applied = vta_applied = 0
    if vta_knobs:
        from .vta.conv import Knobs
        from .vta.tasks import with_knobs

        mod, vta_applied = with_knobs(mod, {k: Knobs(**v) for k, v in vta_knobs.items()})
    if best_db_dir is not None:
        from .passes.pipeline import prepack_weights
        from .pick_best import open_db

        db = open_db(best_db_dir)  # with the intrinsics that tensorized records name registered
        with target, db:
            mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
        mod = prepack_weights(mod)
        applied = sum(
            1
            for _, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tirx.is_scheduled" in f.attrs
        )
    if target.kind.name in GPU_KINDS:
        mod = default_gpu_schedules(mod, target)
    mod = weight_prefetch.insert(mod)  # as the tuner's builder did to the candidates it timed
    ex = tvm.compile(mod, target=target, relax_pipeline="default")  # mod is already fused + scheduled
    lib = out_dir / LIB
    if cross_compiler:
        from tvm.support import cc

        ex.export_library(str(lib), fcompile=cc.cross_compiler(cross_compiler))
    else:
        ex.export_library(str(lib))
    return {
        "tuned": best_db_dir is not None or bool(vta_knobs),
        "scheduled_functions": applied,
        "vta_tuned_convs": vta_applied,
        "lib_bytes": lib.stat().st_size,
    }
