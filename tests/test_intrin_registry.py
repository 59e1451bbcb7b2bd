"""MetaSchedule's intrinsic registry imports without inspect scanning every module per frame."""

import importlib.abc
import inspect
import sys
import types

from vta_pipeline.tir import intrin_registry


class _CountingModule(types.ModuleType):
    """A module that counts how often something asks for its file (what inspect's scan does)."""

    asked = 0

    def __getattr__(self, name):
        if name == "__file__":
            type(self).asked += 1
        raise AttributeError(name)


def _a_frozen_importlib_frame():
    """A frame of importlib's frozen bootstrap: the caller of a meta path finder."""
    frames = []

    class Spy(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            frames.append(sys._getframe(1))
            return None

    sys.meta_path.insert(0, Spy())
    try:
        try:
            import vta_pipeline_no_such_module  # noqa: F401
        except ImportError:
            pass
    finally:
        sys.meta_path.pop(0)
    return frames[0]


def test_frame_info_of_frozen_importlib_frames_needs_no_scan_of_sys_modules(monkeypatch):
    frame = _a_frozen_importlib_frame()
    assert frame.f_code.co_filename == "<frozen importlib._bootstrap>"
    intrin_registry.map_frozen_importlib_frames()
    monkeypatch.setitem(sys.modules, "counting_module", _CountingModule("counting_module"))
    _CountingModule.asked = 0
    info = inspect.getframeinfo(frame)  # what inspect.stack() does for each frame
    assert info.filename == "<frozen importlib._bootstrap>" and info.function == "_find_spec"
    assert _CountingModule.asked == 0


def test_without_the_mapping_every_such_frame_scans_all_modules(monkeypatch):
    """Why the mapping exists: the scan repeats on each call (TVMScript makes thousands)."""
    frame = _a_frozen_importlib_frame()
    for name in ("importlib._bootstrap", "importlib._bootstrap_external"):
        monkeypatch.delitem(inspect.modulesbyfile, f"<frozen {name}>", raising=False)
    monkeypatch.setitem(sys.modules, "counting_module", _CountingModule("counting_module"))
    _CountingModule.asked = 0
    inspect.getframeinfo(frame)
    inspect.getframeinfo(frame)
    assert _CountingModule.asked >= 2  # at least one full scan per call


def test_load_registers_metaschedules_intrinsics():
    import tvm

    intrin_registry.load()
    assert "tvm.s_tir.tensor_intrin" in sys.modules
    assert tvm.s_tir.TensorIntrin.get("dot_16x4_vnni") is not None
