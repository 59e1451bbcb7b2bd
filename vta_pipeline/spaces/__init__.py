"""The design spaces we own, one module each, behind one registry.

A space says which tasks it takes, gives them their schedules (a MetaSchedule space
generator) and names its versions. Its *label* (`label`) is kept in every tuning work dir's
state: a task whose search exhausted an older version of its space searches the new one. Its
*versions* (`versions`) are part of every tune step's key: a finished task's cached result
would otherwise stand after its space changed. Both are in every store already made, so a
change of them re-tunes; `tests/test_space_pins.py` pins them.

The registry's order is the dispatch: the first space that takes a task schedules it, and
MetaSchedule's generic space (with our dot-product rule, `int8_dot`) takes the rest.

| space | module | takes |
|---|---|---|
| winograd | `winograd` | Winograd-rewritten 3x3 convs (`--winograd`) |
| packed-conv | `packed_conv` | convs in a packed layout (graph pack, the CPU's blocked layout), by kind |
| dense | `dense` | a float dense layer at small batch: each core its share of the weights |
| pool | `pool` | a packed max pool: row bands |
| injective | `injective` | a CPU function without a reduction (layout transforms, quantizes) |
| metaschedule | (`int8_dot`) | everything else |
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from ..tir import int8_dot
from . import dense, injective, packed_conv, pool, winograd


class Space(ABC):
    """One design space: `kind` (which tasks it takes) and `generator` are its own; `name` and
    `version` make its label and its versions."""

    name: str = ""
    version: int | None = None

    @abstractmethod
    def kind(self, workload: Any, target: Any) -> str | None:
        """None: not this space's task; else the kind of task ("" when the space has one kind)."""

    def label(self, kind: str, workload: Any) -> str:
        return self.name if self.version is None else f"{self.name}:{self.version}"

    @abstractmethod
    def generator(self, target: Any, kind: str, workload: Any, failures: Any = None) -> Any:
        """MetaSchedule's space generator for a task of `kind`."""

    def versions(self) -> dict[str, int]:
        return {} if self.version is None else {self.name: self.version}


class _Module(Space):
    """A space whose module has `applies(workload, target)`, `space_generator()` and `VERSION`."""

    def __init__(self, name: str, module: Any):
        self.name, self.module = name, module

    @property
    def version(self) -> int:  # read when asked: a test (or a hot fix) may change the module's
        return self.module.VERSION

    def kind(self, workload: Any, target: Any) -> str | None:
        return "" if self.module.applies(workload, target) else None

    def generator(self, target: Any, kind: str, workload: Any, failures: Any = None) -> Any:
        return self.module.space_generator()


class _PackedConv(Space):
    """NeoCPU's packed-conv space: one per conv kind ("float", "dot", "depthwise", ...), each
    kind (and a float conv whose weights are read once, a conv whose result is broadcast) with
    its own version. Version 1 has no suffix in the label: the label it had before versions."""

    name = "packed-conv"

    def kind(self, workload: Any, target: Any) -> str | None:
        return packed_conv.conv_kind(workload, target)

    def label(self, kind: str, workload: Any) -> str:
        v = packed_conv.version(kind, workload)
        return f"packed-conv:{kind}" + (f":{v}" if v > 1 else "")

    def generator(self, target: Any, kind: str, workload: Any, failures: Any = None) -> Any:
        return packed_conv.space_generator(target, kind, workload)

    def versions(self) -> dict[str, int]:
        return {
            "packed-conv": packed_conv.VERSION,
            "packed-conv:float:weights-once": packed_conv.WEIGHTS_ONCE_VERSION,
            "packed-conv:broadcast-epilogue": packed_conv.BROADCAST_EPILOGUE_VERSION,
            **{f"packed-conv:{kind}": v for kind, v in packed_conv.KIND_VERSIONS.items()},
        }


class _MetaSchedule(Space):
    """MetaSchedule's generic space, with the dot-product rule for uint8 x int8 blocks: takes
    every task (the last in the registry); unversioned."""

    name = "metaschedule"

    def kind(self, workload: Any, target: Any) -> str | None:
        return ""

    def generator(self, target: Any, kind: str, workload: Any, failures: Any = None) -> Any:
        return int8_dot.space_generator(target, workload, failures)


REGISTRY: tuple[Space, ...] = (
    _Module("winograd", winograd),
    _PackedConv(),
    _Module("dense", dense),
    _Module("pool", pool),
    _Module("injective", injective),
    _MetaSchedule(),
)


def space_for(target: Any, workload: Any) -> tuple[Space, str]:
    """The space that takes the task, and the task's kind in it."""
    for space in REGISTRY:
        kind = space.kind(workload, target)
        if kind is not None:
            return space, kind
    raise AssertionError("the generic space takes every task")


def label(target: Any, workload: Any) -> str:
    """Which space `design_space` gives the task, and its version (kept in the work dir's state)."""
    space, kind = space_for(target, workload)
    return space.label(kind, workload)


def design_space(target: Any, workload: Any, failures: int8_dot.TensorizeFailures | None = None) -> Any:
    """The search space of one task: the space generator of the space that takes it."""
    space, kind = space_for(target, workload)
    return space.generator(target, kind, workload, failures)


def versions() -> dict[str, int]:
    """The version of each of our spaces, part of every tune step's key: a finished task's
    cached result would otherwise stand after its space changed, and the task would never
    reach `tune_task`, which searches the new space (`spaces.upgrade`). A task whose space did
    not change finds its work dir finished and returns at once."""
    return {k: v for space in REGISTRY for k, v in space.versions().items()}
