"""How a network's tuning tasks are scheduled (`tuning_rounds`), without Prefect: the same
object the flow drives with Prefect's submit, driven here by a thread pool.

Each "tuning task" below is a real concurrent job that records when it ran and with which
budget; its summary is what a tuned task reports (its best latency), so the second round
can be steered by it."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from dataclasses import dataclass

import pytest

from vta_pipeline.search import allocation
from vta_pipeline.search.rounds import TuningRounds


@dataclass
class Task:
    name: str
    weight: int = 1


class Rack:
    """Runs submitted tasks on a thread pool and remembers what ran, with which budget, and
    how many ran at once."""

    def __init__(self, latency_ms: dict[str, float], stopped: dict[str, str] | None = None):
        self.latency_ms, self.stopped = latency_ms, stopped or {}
        self.pool = cf.ThreadPoolExecutor(8)
        self.lock = threading.Lock()
        self.running = self.most_at_once = 0
        self.calls: list[tuple[str, int]] = []

    def _tune(self, name: str, budget: int) -> dict:
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.calls.append((name, budget))
        time.sleep(0.02)
        with self.lock:
            self.running -= 1
        return {"task": name, "budget": budget}

    def submit(self, task: Task, budget: int) -> cf.Future:
        return self.pool.submit(self._tune, task.name, budget)

    @staticmethod
    def wait(futures, timeout: float):
        return cf.wait(futures, timeout=timeout, return_when=cf.FIRST_COMPLETED).not_done

    def summary(self, ref: dict) -> dict:
        return {
            "best_latency_ms": self.latency_ms[ref["task"]],
            "default_ms": None,
            "stopped": self.stopped.get(ref["task"], "budget"),
        }


def run(rounds: TuningRounds, rack: Rack, **kw) -> dict:
    try:
        return rounds.run(rack.submit, rack.wait, rack.summary, poll_s=0.005, **kw)
    finally:
        rack.pool.shutdown()


TASKS = [Task("conv_a", 2), Task("conv_b"), Task("dense"), Task("pool")]
LATENCY = {"conv_a": 4.0, "conv_b": 2.0, "dense": 0.05, "pool": 0.01}


def test_flat_tunes_every_task_once_with_the_full_budget():
    rack = Rack(LATENCY)
    refs = run(TuningRounds(TASKS, 8, "flat", in_flight=2), rack)
    assert sorted(rack.calls) == sorted((t.name, 8) for t in TASKS)
    assert refs == {t.name: {"task": t.name, "budget": 8} for t in TASKS}


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_no_more_tasks_run_at_once_than_the_window_allows(in_flight):
    rack = Rack(LATENCY)
    run(TuningRounds(TASKS, 4, "flat", in_flight=in_flight), rack)
    assert rack.most_at_once <= in_flight
    assert rack.most_at_once == in_flight  # and the window is used: tasks do run side by side


def test_a_window_wider_than_the_network_is_the_network():
    assert TuningRounds(TASKS, 4, "flat", in_flight=16).in_flight == len(TASKS)
    assert TuningRounds(TASKS, 4, "flat", in_flight=0).in_flight == 1


def test_tasks_start_in_the_order_given():
    rack = Rack(LATENCY)
    run(TuningRounds(TASKS, 4, "flat", in_flight=1), rack)
    assert [n for n, _ in rack.calls] == [t.name for t in TASKS]


def test_latency_steering_gives_the_second_round_to_where_the_network_spends_its_time():
    rack = Rack(LATENCY)
    rounds = TuningRounds(TASKS, 8, "latency", in_flight=2)
    refs = run(rounds, rack)
    first = allocation.first_round(8)
    assert sorted(rack.calls[: len(TASKS)]) == sorted((t.name, first) for t in TASKS)  # round one: all, half budget
    second = dict(rack.calls[len(TASKS) :])
    assert set(second) == set(rounds.second_round) and "conv_a" in second  # the costliest task tunes on
    assert "pool" not in second  # a task the network barely spends time in does not
    assert rounds.budgets["conv_a"] > rounds.budgets["conv_b"] > rounds.budgets["pool"]
    assert sum(rounds.budgets.values()) <= 8 * len(TASKS)  # the network's budget, not more
    assert rounds.second_round_trials == sum(rounds.budgets.values()) - first * len(TASKS)
    # each task's last outcome is returned, and its first round's is kept
    assert refs["conv_a"] == {"task": "conv_a", "budget": rounds.budgets["conv_a"]}
    assert rounds.first_refs["conv_a"] == {"task": "conv_a", "budget": first}
    assert refs["pool"] is rounds.first_refs["pool"] or refs["pool"] == rounds.first_refs["pool"]


def test_a_task_whose_search_stopped_gets_no_second_round():
    rack = Rack(LATENCY, stopped={"conv_a": "early-stopping"})
    rounds = TuningRounds(TASKS, 8, "latency", in_flight=1)
    run(rounds, rack)
    assert "conv_a" not in rounds.second_round
    assert rounds.budgets["conv_a"] == allocation.first_round(8)


def test_progress_is_refreshed_while_the_window_waits():
    rack = Rack(LATENCY)
    ticks = []
    run(TuningRounds(TASKS, 4, "flat", in_flight=1), rack, on_poll=lambda: ticks.append(1))
    assert len(ticks) >= len(TASKS)


def test_an_unknown_allocation_is_refused_by_name():
    with pytest.raises(ValueError, match="'fastest'"):
        TuningRounds(TASKS, 4, "fastest")
