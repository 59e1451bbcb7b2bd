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

    from ..tir.weight_prefetch import insert

    mod = insert(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod))
    return tvm.driver.build(mod, target=target)


def cross_export(cross_compiler: str, mod) -> str:
    """Link a candidate into a shared library for the board with a cross compiler (the
    stock export ships a tar that the board must link itself)."""
    import os
    import tempfile

    from tvm.support import cc

    path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod.so")
    mod.export_library(path, fcompile=cc.cross_compiler(cross_compiler))
    return path


def make_builder(timeout_sec: float, max_workers: int | None = None, cross_compiler: str | None = None):
    import functools

    from tvm.s_tir import meta_schedule as ms

    f_export = functools.partial(cross_export, cross_compiler) if cross_compiler else None
    return ms.builder.LocalBuilder(
        f_build=fast_build, f_export=f_export, timeout_sec=timeout_sec, max_workers=max_workers
    )
