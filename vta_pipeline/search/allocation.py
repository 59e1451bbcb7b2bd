"""How a network's trial budget is spread over its tuning tasks.

Why: a flat budget gives a 1x1 convolution that costs a tenth of a millisecond as many
trials as the 3x3 convolution that draws a slow schedule and is a large share of the network
(docs/performance.md, "Numbers behind the library's choices"). What the tuned network's latency is made of is known after a first
round: each task's best latency (or its default lowering, when the build would use that)
times its weight. MetaSchedule's gradient task scheduler steers by the same quantity, one
round at a time inside one process; our tasks run as separate, cached, retried Prefect task
runs, so the budget is spent in two fan-outs instead:

1. every task gets `first_round(trials_per_task)` trials (at least one measured schedule,
   and its default lowering, to know where it stands);
2. the rest of the network's budget (`trials_per_task` x tasks) goes to the tasks in
   proportion to their share of the network's latency, capped per task, by largest
   remainder so the total is exact.

Pure functions over plain numbers: the flow reads the first round's summaries and calls
`allocate`; the result is deterministic, so a cached rerun makes the same second round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CAP_FACTOR = 4  # no task gets more than this many times the average budget


@dataclass(frozen=True)
class TaskSpend:
    """One task after the first round: what it costs the network now."""

    name: str
    weight: int  # how many times the network runs it
    ms: float | None  # the latency the build would use (best tuned or default lowering); None: nothing measured
    searchable: bool = True  # False: its search stopped early or ran out of new schedules

    @property
    def cost(self) -> float:
        return self.weight * self.ms if self.ms and self.searchable else 0.0


def first_round(trials_per_task: int) -> int:
    """Trials every task gets before the budget is steered: half the average, at least one."""
    return max(1, trials_per_task // 2)


def used_ms(best_ms: float | None, default_ms: float | None) -> float | None:
    """The latency a task contributes to the built network: pick best takes the faster of its
    best tuned record and its default lowering."""
    options = [v for v in (best_ms, default_ms) if v]
    return min(options) if options else None


def allocate(spends: list[TaskSpend], trials_per_task: int) -> dict[str, int]:
    """Each task's whole budget (first round included) for a network budget of
    `trials_per_task` x len(spends), the remainder after the first round spread by cost share.

    A task nothing was measured for, or whose search has stopped (cost 0), keeps its
    first-round budget; when no task has a cost, the remainder is spread evenly over the
    searchable ones (a flat budget)."""
    if trials_per_task <= 0:
        raise ValueError(f"trials_per_task must be positive, got {trials_per_task}")
    first = first_round(trials_per_task)
    budget = {s.name: first for s in spends}
    left = trials_per_task * len(spends) - first * len(spends)
    cap = max(first, CAP_FACTOR * trials_per_task)
    weights = {s.name: s.cost for s in spends}
    if not any(weights.values()):
        weights = {s.name: 1.0 if s.searchable else 0.0 for s in spends}
    while left > 0:
        open_ = {n: w for n, w in weights.items() if w > 0 and budget[n] < cap}
        if not open_:
            break  # every task at its cap: the rest of the budget is not spent
        total = sum(open_.values())
        exact = {n: left * w / total for n, w in open_.items()}
        given = {n: min(math.floor(x), cap - budget[n]) for n, x in exact.items()}
        short = left - sum(given.values())
        # largest remainder first (ties: larger cost, then name, for a deterministic split)
        for n in sorted(open_, key=lambda n: (-(exact[n] - math.floor(exact[n])), -open_[n], n)):
            if short <= 0:
                break
            if budget[n] + given[n] < cap:
                given[n] += 1
                short -= 1
        if not any(given.values()):
            break
        for n, g in given.items():
            budget[n] += g
        left -= sum(given.values())
    return budget
