"""Import MetaSchedule's tensor-intrinsic registry in seconds, not a minute.

`ms.TuneContext` imports `tvm.s_tir.tensor_intrin` the first time a process builds one:
~250 TVMScript intrinsics, each parsed under `@T.prim_func`, which calls `inspect.stack()`.
For every frame whose file is not on disk (importlib's `<frozen importlib._bootstrap>`
frames, several per nested import) `inspect.getmodule` scans all of `sys.modules` (2-3
thousand modules in a pipeline process with torch and Prefect loaded), because such names
never enter its file-to-module cache. That import was the largest single cost of tuning the
first task of a run: 41 s in a pipeline process, 6 s once the two frozen importlib names are
mapped to their modules (the answer the scan finds, or would, for those frames).
"""

from __future__ import annotations

import inspect

_FROZEN = ("importlib._bootstrap", "importlib._bootstrap_external")


def map_frozen_importlib_frames() -> None:
    """Tell inspect which module importlib's frozen frames belong to (idempotent)."""
    for name in _FROZEN:
        inspect.modulesbyfile.setdefault(f"<frozen {name}>", name)


def load() -> None:
    """Import `tvm.s_tir.tensor_intrin` (once per process: Python's import lock serializes
    threads) with the frames mapped first."""
    map_frozen_importlib_frames()
    import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the intrinsics)
