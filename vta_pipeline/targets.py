"""Target presets: a name for the TVM target (JSON dict), its host and default board key.

TVM 0.27 accepts targets only as JSON dicts (the old "llvm -mcpu=..." strings are
rejected), and MetaSchedule needs "num-cores" in CPU targets. The tuning database lookup
ignores the target, so the store keeps one database per target (see `target_id`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .hashing import sha256_json


@dataclass(frozen=True)
class TargetPreset:
    name: str
    description: str
    target: dict[str, Any]
    host: dict[str, Any] | None = None
    key: str = "host"
    cross_compiler: str | None = None  # None: this machine's compiler
    extra: dict[str, Any] = field(default_factory=dict)


def _host_preset() -> TargetPreset:
    from tvm.target import codegen

    mcpu = codegen.llvm_get_system_cpu()
    if mcpu in ("", "generic"):
        mcpu = "x86-64"
    return TargetPreset(
        name="host",
        description="This machine's CPU (LLVM, detected -mcpu), measured through a local board",
        target={"kind": "llvm", "mcpu": mcpu, "num-cores": os.cpu_count() or 1},
        key="host",
    )


PRESETS = {"host": _host_preset}


def preset_names() -> list[str]:
    return sorted(PRESETS)


@dataclass(frozen=True)
class ResolvedTarget:
    """A target as the steps use it: JSON (for keys and subprocesses) plus a TVM object."""

    name: str
    target_json: dict[str, Any]
    host_json: dict[str, Any] | None
    default_key: str
    cross_compiler: str | None

    @property
    def id(self) -> str:
        """Stable id of (target, host): names the per-target tuning databases."""
        return sha256_json({"target": self.target_json, "host": self.host_json})[:16]

    def tvm_target(self):
        import tvm

        t = dict(self.target_json)
        if self.host_json:
            t["host"] = self.host_json
        return tvm.target.Target(t)

    @property
    def kind(self) -> str:
        return self.target_json["kind"]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "target": self.target_json, "host": self.host_json, "key": self.default_key}


def resolve_target(spec: str) -> ResolvedTarget:
    """A preset name or a TVM target JSON dict -> ResolvedTarget, validated by TVM."""
    import tvm

    spec = spec.strip()
    if spec.startswith("{"):
        try:
            tj = json.loads(spec)
        except ValueError as e:
            raise ConfigError(f"--target is neither a preset nor valid JSON: {e}") from None
        if not isinstance(tj, dict) or "kind" not in tj:
            raise ConfigError('target JSON must be an object with a "kind", e.g. {"kind": "llvm", "num-cores": 2}')
        host = tj.pop("host", None)
        try:
            tvm.target.Target(dict(tj, **({"host": host} if host else {})))
        except Exception as e:  # TVM raises its own error types for bad keys
            raise ConfigError(f"TVM rejects the target JSON {spec}: {str(e).splitlines()[-1]}") from None
        if tj["kind"] == "llvm" and "num-cores" not in tj:
            tj["num-cores"] = os.cpu_count() or 1  # MetaSchedule requires it
        return ResolvedTarget("custom", tj, host, "host", None)
    if spec not in PRESETS:
        import difflib

        close = difflib.get_close_matches(spec, preset_names(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"unknown target preset {spec!r}.{hint} Presets: {', '.join(preset_names())}; "
            'or pass TVM target JSON like \'{"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2}\''
        )
    p = PRESETS[spec]()
    return ResolvedTarget(p.name, p.target, p.host, p.key, p.cross_compiler)
