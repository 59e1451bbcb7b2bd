"""MetaSchedule builder function that works on a loaded 2-core machine.

The stock builder function imports `tvm.s_tir.tensor_intrin` in every fresh builder
worker; that import parses hundreds of TVMScript intrinsics and took 30-45 s here, so every
candidate hit LocalBuilder's timeout and tuning "finished" having measured nothing.
Tensorized candidates arrive already lowered (the main process inlined the intrinsic), so
the worker does not need the registry. This module must stay import-light: builder
workers unpickle `fast_build` by reference and import it.
"""

from __future__ import annotations


def fast_build(mod, target, _params):
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.driver.build(mod, target=target)


def make_builder(timeout_sec: float, max_workers: int | None = None):
    from tvm.s_tir import meta_schedule as ms

    return ms.builder.LocalBuilder(f_build=fast_build, timeout_sec=timeout_sec, max_workers=max_workers)
