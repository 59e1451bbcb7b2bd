"""Target presets: everything the pipeline needs to know about one kind of board.

A preset names the TVM target and its host (JSON dicts: TVM 0.27 rejects the old
"llvm -mcpu=..." strings, and MetaSchedule needs "num-cores" in CPU targets), the cross
compiler that links libraries for the board (Debian's cross g++ packages), the RPC key
boards of that kind register under, measurement defaults suited to the device, the data
layout it prefers, and for GPUs the hardware parameters MetaSchedule's search obeys
(threads per block, shared memory, warp size).

The tuning database lookup ignores the target, so the store keeps one database per
(target, host) (see `ResolvedTarget.id`).

Spec syntax (``--target``):
  * a preset name, optionally with its option: ``host``, ``pynq-arm``, ``cuda:sm_90``;
  * TVM target JSON: ``{"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2}``;
  * a preset with overrides, as written back by the flow after it read a board's device
    parameters: ``{"preset": "rk3399-mali", "target": {"max_threads_per_block": 512}}``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal

from .errors import ConfigError
from .store.hashing import sha256_json

Device = Literal["cpu", "cuda", "opencl"]


@dataclass(frozen=True)
class TargetPreset:
    name: str
    description: str
    target: dict[str, Any]
    host: dict[str, Any] | None = None
    key: str = "host"
    cross_compiler: str | None = None  # None: this machine's compiler
    cross_package: str | None = None  # the Debian package that provides cross_compiler
    device: Device = "cpu"
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    measure: dict[str, Any] = field(default_factory=dict)  # MeasureConfig defaults for the device
    query_device: bool = False  # read the GPU's limits from a connected board (Mali recipe)
    option: str | None = None  # what ``name:OPTION`` sets (e.g. the CUDA architecture)
    runtime: str = ""  # what a board of this kind needs to serve RPC
    unavailable: str | None = None  # what the preset still needs before anything can run on it
    offload: str | None = None  # "vta": packed convs run on a VTA board's simulator, the rest on its CPU
    server_module: str = "vta_pipeline.boards.server"  # what a local board of this kind runs


# The RK3399's big cluster (2x Cortex-A72): TVM's runtime binds its threads to big cores.
_RK3399_HOST = {
    "kind": "llvm",
    "mtriple": "aarch64-linux-gnu",
    "mcpu": "cortex-a72",
    "mattr": ["+neon"],
    "num-cores": 2,
}
_CPU_MEASURE = {"number": 4, "repeat": 3, "timeout_s": 60}


def _host_preset(option: str | None) -> TargetPreset:
    from tvm.target import codegen

    mcpu = codegen.llvm_get_system_cpu()
    if mcpu in ("", "generic"):
        mcpu = "x86-64"
    return TargetPreset(
        name="host",
        description="This machine's CPU (LLVM, detected -mcpu), measured through a local board",
        target={"kind": "llvm", "mcpu": mcpu, "num-cores": os.cpu_count() or 1},
        key="host",
        runtime="this project's environment (the local board starts its own rpc_server processes)",
    )


def _pynq_arm(option: str | None) -> TargetPreset:
    return TargetPreset(
        name="pynq-arm",
        description="Pynq-Z1's ARM Cortex-A9 (armv7 hard-float, NEON): the VTA recipe's device=arm_cpu mode",
        target={
            "kind": "llvm",
            "mtriple": "armv7a-linux-gnueabihf",
            "mcpu": "cortex-a9",
            "mattr": ["+neon"],
            "mfloat-abi": "hard",
            "num-cores": 2,
        },
        key="pynq",
        cross_compiler="arm-linux-gnueabihf-g++",
        cross_package="g++-arm-linux-gnueabihf",
        measure={"number": 4, "repeat": 3, "timeout_s": 120},  # a slow core: generous timeout
        runtime="TVM's runtime built on the board (PYNQ image, Python 3 + tvm runtime, `python -m tvm.exec.rpc_server`)",
    )


def _pynq_vta(option: str | None) -> TargetPreset:
    # the same ARM host and cross compiler as pynq-arm, with VTA on the FPGA beside it
    return replace(
        _pynq_arm(option),
        name="pynq-vta",
        description="VTA on the Pynq-Z1's FPGA (1x16x16 int8 GEMM core at 100 MHz), driven from its ARM core",
        key="pynq-vta",
        measure={},
        runtime="a VTA bitstream and its driver (see unavailable)",
        unavailable=(
            "a Pynq-Z1 with a VTA bitstream built from VTA's hw_spec.h and this vta_config.json (HW_VER "
            "0.0.2: the instructions vta_pipeline.vta.isa encodes), and a driver on its ARM core that "
            "hands our instruction streams to the FPGA (what VTA's pynq_driver.cc did); neither exists "
            "in this project. VTA's simulator runs the same instructions (docs/vta-target.md); "
            "--target pynq-arm runs VTA's packed int8 layouts on the Pynq's ARM core"
        ),
    )


def _rk3399_cpu(option: str | None) -> TargetPreset:
    return TargetPreset(
        name="rk3399-cpu",
        description="RK3399's aarch64 CPU (Cortex-A72 big cores, NEON)",
        target=dict(_RK3399_HOST),
        key="rk3399",
        cross_compiler="aarch64-linux-gnu-g++",
        cross_package="g++-aarch64-linux-gnu",
        measure=dict(_CPU_MEASURE),
        runtime="TVM's runtime built for aarch64 on the board, started with `python -m tvm.exec.rpc_server`",
    )


def _rk3588_cpu(option: str | None) -> TargetPreset:
    # RK3588's big cluster: 4x Cortex-A76 (ARMv8.2 with the dot product), beside 4 A55s
    return TargetPreset(
        name="rk3588-cpu",
        description="RK3588's aarch64 CPU (Cortex-A76 big cores, NEON and the int8 dot product)",
        target={
            "kind": "llvm",
            "mtriple": "aarch64-linux-gnu",
            "mcpu": "cortex-a76",
            "mattr": ["+neon", "+dotprod"],
            "num-cores": 4,
        },
        key="rk3588",
        cross_compiler="aarch64-linux-gnu-g++",
        cross_package="g++-aarch64-linux-gnu",
        measure=dict(_CPU_MEASURE),
        runtime="TVM's runtime built for aarch64 on the board, started with `python -m tvm.exec.rpc_server`",
    )


def _rk3399_mali(option: str | None) -> TargetPreset:
    return TargetPreset(
        name="rk3399-mali",
        description="RK3399's Mali-T860 GPU through OpenCL, aarch64 host code (limits read from the board)",
        target={
            "kind": "opencl",
            "device": "mali",
            "max_threads_per_block": 256,
            "max_shared_memory_per_block": 32768,
            "thread_warp_size": 1,
        },
        host={k: v for k, v in _RK3399_HOST.items() if k != "num-cores"},
        key="rk3399",
        cross_compiler="aarch64-linux-gnu-g++",
        cross_package="g++-aarch64-linux-gnu",
        device="opencl",
        layout="NHWC",
        measure={"number": 4, "repeat": 3, "min_repeat_ms": 150, "timeout_s": 60},
        query_device=True,
        runtime="TVM's runtime built with USE_OPENCL=ON and the board's Mali OpenCL driver (libmali)",
    )


CUDA_DEFAULT_ARCH = "sm_80"


def _cuda(option: str | None) -> TargetPreset:
    arch = option or CUDA_DEFAULT_ARCH
    if not re.fullmatch(r"sm_\d{2,3}[a-z]?", arch):
        raise ConfigError(f"CUDA architecture {arch!r} is not like sm_80 / sm_90a: use e.g. --target cuda:sm_86")
    return TargetPreset(
        name="cuda",
        description=f"An NVIDIA GPU (CUDA, {arch}; set with cuda:sm_XX), x86-64 host",
        target={
            "kind": "cuda",
            "arch": arch,
            "max_threads_per_block": 1024,
            "max_shared_memory_per_block": 49152,
            "thread_warp_size": 32,
        },
        host={"kind": "llvm", "mcpu": "x86-64"},
        key="cuda",
        device="cuda",
        layout="NHWC",
        measure={"number": 20, "repeat": 3, "min_repeat_ms": 150, "timeout_s": 10},
        query_device=True,
        option="arch",
        runtime="TVM built with USE_CUDA=ON (the apache-tvm wheel is) and the NVIDIA driver",
    )


def _vta_sim(option: str | None) -> TargetPreset:
    return replace(
        _host_preset(option),
        name="vta-sim",
        description="VTA's simulator as a board: packed convs compiled to VTA instructions and run (and timed) "
        "by the simulator, the rest of the network on this machine's CPU; needs --vta",
        key="vta-sim",
        offload="vta",
        server_module="vta_pipeline.vta.rpc_server",
        runtime="this project's environment: `python -m vta_pipeline.vta.rpc_server --tracker HOST:PORT`",
    )


PRESETS: dict[str, Callable[[str | None], TargetPreset]] = {
    "host": _host_preset,
    "pynq-arm": _pynq_arm,
    "pynq-vta": _pynq_vta,
    "vta-sim": _vta_sim,
    "rk3399-cpu": _rk3399_cpu,
    "rk3588-cpu": _rk3588_cpu,
    "rk3399-mali": _rk3399_mali,
    "cuda": _cuda,
}


def preset_names() -> list[str]:
    return list(PRESETS)


def get_preset(spec: str) -> TargetPreset:
    """``name`` or ``name:option`` -> the preset, or a ConfigError listing the presets."""
    name, _, option = spec.partition(":")
    if name not in PRESETS:
        import difflib

        close = difflib.get_close_matches(name, preset_names(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"unknown target preset {name!r}.{hint} Presets: {', '.join(preset_names())} "
            "(`vta-pipeline targets` lists them); "
            'or pass TVM target JSON like \'{"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2}\''
        )
    preset = PRESETS[name](option or None)
    if option and preset.option is None:
        raise ConfigError(f"target preset {name!r} takes no option (got {spec!r})")
    if preset.unavailable:
        raise ConfigError(f"target preset {name!r} cannot run yet: it needs {preset.unavailable}.")
    return preset


def preset_defaults(spec: str) -> tuple[str | None, dict[str, Any]]:
    """(default board key, config defaults by section: measure, quantize) of a spec, without
    importing TVM where the preset does not need it; (None, {}) for target JSON."""
    spec = spec.strip()
    if spec.startswith("{"):
        try:
            d = json.loads(spec)
        except ValueError:
            return None, {}
        if not isinstance(d, dict) or "preset" not in d:
            return None, {}
        spec = d["preset"]
    if spec.partition(":")[0] == "host":
        return "host", {}
    p = get_preset(spec)
    sections = {"measure": dict(p.measure)} if p.measure else {}
    if p.offload == "vta":  # VTA stores int8 between kernels: residual adds read int8
        sections["quantize"] = {"dtype_activation": "int8"}
    return p.key, sections


@dataclass(frozen=True)
class ResolvedTarget:
    """A target as the steps use it: JSON (for keys and subprocesses) plus a TVM object."""

    name: str
    target_json: dict[str, Any]
    host_json: dict[str, Any] | None
    default_key: str
    cross_compiler: str | None
    device: Device = "cpu"
    layout: str = "NCHW"
    cross_package: str | None = None
    query_device: bool = False
    spec: str = "host"  # what resolves back to this target (passed to Prefect tasks)
    offload: str | None = None  # "vta": the network's packed convs run on a VTA board
    server_module: str = "tvm.exec.rpc_server"

    @property
    def id(self) -> str:
        """Stable id of (target, host): names the per-target tuning databases."""
        return sha256_json({"target": self.target_json, "host": self.host_json})[:16]

    @property
    def full_json(self) -> dict[str, Any]:
        """The target JSON with its host, as `tvm.target.Target` takes it."""
        t = dict(self.target_json)
        if self.host_json:
            t["host"] = dict(self.host_json)
        return t

    def tvm_target(self):
        import tvm

        return tvm.target.Target(self.full_json)

    @property
    def kind(self) -> str:
        return self.target_json["kind"]

    @property
    def is_gpu(self) -> bool:
        return self.device != "cpu"

    @property
    def cpu_threads(self) -> int | None:
        """The cores a CPU target's kernels are scheduled for ("num-cores"): the threads a
        board should run them with. None for GPU targets."""
        if self.kind != "llvm":
            return None
        n = self.target_json.get("num-cores")
        return int(n) if n else None

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "target": self.target_json, "host": self.host_json, "key": self.default_key}
        if self.layout != "NCHW":  # part of step keys: the NCHW presets keep their old keys
            d["layout"] = self.layout
        if self.offload:
            d["offload"] = self.offload
        return d

    def with_device_params(self, params: dict[str, int]) -> ResolvedTarget:
        """This target with limits read off a connected board (see boards.device_params)."""
        overrides = {k: v for k, v in params.items() if self.target_json.get(k) != v}
        if not overrides:
            return self
        base = json.loads(self.spec) if self.spec.startswith("{") else {"preset": self.spec}
        base["target"] = {**base.get("target", {}), **overrides}
        return replace(self, target_json={**self.target_json, **overrides}, spec=json.dumps(base, sort_keys=True))

    def check_toolchain(self) -> None:
        """The cross compiler must be on PATH before anything is computed."""
        if self.cross_compiler and shutil.which(self.cross_compiler) is None:
            pkg = f" (Debian: `apt-get install {self.cross_package}`)" if self.cross_package else ""
            raise ConfigError(
                f"target {self.name!r} links its libraries with {self.cross_compiler}, which is not on PATH; "
                f"install it{pkg} and rerun"
            )


def _validate(tj: dict[str, Any], host: dict[str, Any] | None, spec: str) -> None:
    import tvm

    try:
        tvm.target.Target(dict(tj, **({"host": host} if host else {})))
    except Exception as e:  # TVM raises its own error types for bad keys
        raise ConfigError(f"TVM rejects the target {spec}: {str(e).strip().splitlines()[-1]}") from None


def resolve_target(spec: str) -> ResolvedTarget:
    """A preset name (``name[:option]``), TVM target JSON or a preset with overrides ->
    ResolvedTarget, validated by TVM."""
    spec = spec.strip()
    if spec.startswith("{"):
        try:
            tj = json.loads(spec)
        except ValueError as e:
            raise ConfigError(f"--target is neither a preset nor valid JSON: {e}") from None
        if isinstance(tj, dict) and "preset" in tj:
            base = resolve_target(str(tj["preset"]))
            extra = set(tj) - {"preset", "target"}
            if extra:
                raise ConfigError(f"target spec {spec}: unknown key(s) {sorted(extra)}; only 'preset' and 'target'")
            target = {**base.target_json, **tj.get("target", {})}
            _validate(target, base.host_json, spec)
            return replace(base, target_json=target, spec=spec)
        if not isinstance(tj, dict) or "kind" not in tj:
            raise ConfigError('target JSON must be an object with a "kind", e.g. {"kind": "llvm", "num-cores": 2}')
        host = tj.pop("host", None)
        _validate(tj, host, spec)
        if tj["kind"] == "llvm" and "num-cores" not in tj:
            tj["num-cores"] = os.cpu_count() or 1  # MetaSchedule requires it
        device: Device = {"cuda": "cuda", "opencl": "opencl"}.get(tj["kind"], "cpu")  # type: ignore[assignment]
        return ResolvedTarget("custom", tj, host, "host", None, device=device, spec=spec)
    p = get_preset(spec)
    _validate(p.target, p.host, spec)
    return ResolvedTarget(
        p.name,
        p.target,
        p.host,
        p.key,
        p.cross_compiler,
        device=p.device,
        layout=p.layout,
        cross_package=p.cross_package,
        query_device=p.query_device,
        spec=spec,
        offload=p.offload,
        server_module=p.server_module,
    )
