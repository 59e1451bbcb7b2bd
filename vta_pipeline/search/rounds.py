"""How a network's tuning tasks are scheduled: a window of tasks in flight, and the budget in
one round (flat) or two (latency-steered).

The caller supplies the execution: `submit(task, budget)` starts one task's tuning and
returns a future (Prefect's `task.submit`, a `concurrent.futures` executor, ...) whose
`result()` is the task's outcome reference, and `wait(futures, timeout)` returns those
not done yet. Keeping that out of here is what lets the flow stay a thin Prefect layer and
lets this logic be tested without Prefect.

* The window: at most `in_flight` tasks run at once (one per board: each measures on its
  own board, and a task alone on a rack measures on several), in the order given.
* Flat: every task gets `trials_per_task`.
* Latency-steered (`allocation.py`): every task first gets `allocation.first_round`
  trials; the rest of the network's budget then goes where the network's time goes, by
  each task's share of its latency after the first round, and only the tasks given more
  run again (continuing from their records).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from . import allocation
from .work_dir import Stopped

POLL_S = 2.0  # how often a waiting window looks at its futures (and the progress is refreshed)


class Future(Protocol):
    def result(self) -> Any: ...


class Task(Protocol):
    name: str
    weight: int


class TuningRounds:
    """One network's tuning: `budgets` (task name -> trials) is live, so that a progress bar
    can read it while the rounds run; after `run`, `refs` holds each task's last outcome and
    `first_refs` its first-round one."""

    def __init__(self, tasks: Sequence[Task], trials_per_task: int, steer: str = "flat", in_flight: int = 1):
        if steer not in ("flat", "latency"):
            raise ValueError(f"allocation {steer!r}: use 'flat' or 'latency'")
        self.tasks = list(tasks)
        self.trials_per_task = trials_per_task
        self.steered = steer == "latency"
        self.in_flight = max(1, min(in_flight, len(self.tasks) or 1))
        self.first = allocation.first_round(trials_per_task) if self.steered else trials_per_task
        self.budgets: dict[str, int] = {t.name: self.first for t in self.tasks}
        self.first_refs: dict[str, Any] = {}
        self.refs: dict[str, Any] = {}
        self.second_round: list[str] = []

    def run(
        self,
        submit: Callable[[Task, int], Future],
        wait: Callable[[list[Future], float], list[Future]],
        summary: Callable[[Any], dict[str, Any]],
        on_poll: Callable[[], None] = lambda: None,
        poll_s: float = POLL_S,
    ) -> dict[str, Any]:
        """Tune every task to its budget; returns task name -> its last outcome reference.

        `summary(ref)` reads a finished task's summary (best_latency_ms, default_ms, stopped):
        the second round is steered by it."""
        refs = self._window(self.tasks, submit, wait, on_poll, poll_s)
        self.first_refs = dict(refs)
        if self.steered:
            spends = []
            for t in self.tasks:
                s = summary(refs[t.name])
                spends.append(
                    allocation.TaskSpend(
                        t.name,
                        t.weight,
                        allocation.used_ms(s["best_latency_ms"], s.get("default_ms")),
                        searchable=s.get("stopped", Stopped.BUDGET) == Stopped.BUDGET,
                    )
                )
            self.budgets.update(allocation.allocate(spends, self.trials_per_task))
            more = [t for t in self.tasks if self.budgets[t.name] > self.first]
            self.second_round = [t.name for t in more]
            refs.update(self._window(more, submit, wait, on_poll, poll_s))
        self.refs = refs
        return refs

    def describe_second_round(self) -> str | None:
        """The second round in one line for the log (None when flat)."""
        if not self.steered:
            return None
        return (
            f"second round: {self.second_round_trials} more trial(s) over {len(self.second_round)} task(s), "
            "by their share of the network's latency"
        )

    @property
    def second_round_trials(self) -> int:
        """Trials the second round added over the first (0 when flat)."""
        return sum(self.budgets.values()) - self.first * len(self.tasks)

    def _window(self, todo: Sequence[Task], submit, wait, on_poll, poll_s: float) -> dict[str, Any]:
        futures: dict[str, Future] = {}
        pending, running = list(todo), []
        while pending or running:
            while pending and len(running) < self.in_flight:
                t = pending.pop(0)
                f = futures[t.name] = submit(t, self.budgets[t.name])
                running.append(f)
            running = list(wait(running, poll_s))
            on_poll()
        return {name: f.result() for name, f in futures.items()}
