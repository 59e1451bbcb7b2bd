"""The optimization presets of CPU targets (`PipelineConfig.opt`), resolved to what a run applies.

In the manner of a compiler's -O levels, so that the fast path is what a user who passes no
flag gets and the expert flags are overrides:
  O0  TVM's generic design spaces in plain NCHW: what MetaSchedule does alone
  O1  every conv blocked NCHW[x]c (`passes/cpu_layout`) and tuned in our packed design spaces
      (float: NeoCPU's direct conv; int8: the CPU's dot product)
  O2  O1, and Winograd for float 3x3 stride-1 convs at least 14 wide (the default)
Graph pack (`--pack`, `--vta`) replaces the blocked layout by VTA's region; GPU targets and
VTA offload take none of this. Read from a config's JSON dump, so that the variant of a
recorded run (`variant`) resolves as the run did; it imports nothing else of the library.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

LEVELS = ("O0", "O1", "O2")
DEFAULT = "O2"


@dataclass(frozen=True)
class Recipe:
    """What a run applies to its network on its target."""

    blocked: bool
    winograd: bool
    winograd_small_below: int = 28

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self, packed: bool) -> str:
        """What the network's convs get, in words, for the run's log."""
        if self.blocked:
            return "every conv blocked" + (", Winograd 3x3" if self.winograd else "")
        return "graph pack's layout" if packed else "plain NCHW, TVM's generic spaces"


def on_cpu(config: dict[str, Any], target: Any) -> bool:
    """Whether the blocked layout can apply: an NCHW CPU target, no VTA offload, no graph pack."""
    return (
        target.kind == "llvm"
        and target.offload is None
        and target.layout == "NCHW"
        and not (config.get("pack") or {}).get("enabled")
    )


def recipe(config: dict[str, Any], target: Any) -> Recipe:
    """The preset of a config (`PipelineConfig.model_dump(mode="json")`) on `target`, with the
    layout fields it sets winning over the preset. A config without `opt` predates the
    presets: it ran plain NCHW (O0)."""
    layout = config.get("layout") or {}
    level = int(str(config.get("opt", "O0"))[1])
    enabled = layout.get("enabled")
    blocked = on_cpu(config, target) and (enabled if enabled is not None else level >= 1)
    wino = layout.get("winograd")
    winograd = blocked and (wino if wino is not None else level >= 2)
    return Recipe(blocked, winograd, int(layout.get("winograd_small_below", 28)))
