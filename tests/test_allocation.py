"""Spreading a network's trial budget over its tasks (vta_pipeline.search.allocation)."""

import pytest

from vta_pipeline.search.allocation import CAP_FACTOR, TaskSpend, allocate, first_round, used_ms


def test_the_first_round_is_half_the_average_budget_and_at_least_one_trial():
    assert [first_round(n) for n in (1, 2, 3, 4, 9, 64)] == [1, 1, 1, 2, 4, 32]


def test_a_task_uses_the_faster_of_its_best_schedule_and_its_default_lowering():
    assert used_ms(2.0, 0.5) == 0.5 and used_ms(2.0, None) == 2.0 and used_ms(None, 3.0) == 3.0
    assert used_ms(None, None) is None


def test_the_rest_of_the_budget_goes_where_the_networks_time_goes():
    # resnet18 at 4 trials: one conv drew an 80 ms schedule, the others are small
    spends = [
        TaskSpend("big", 1, 80.0),
        TaskSpend("mid", 2, 5.0),
        TaskSpend("small", 1, 0.5),
        TaskSpend("tiny", 3, 0.1),
    ]
    budget = allocate(spends, 4)
    assert sum(budget.values()) == 4 * len(spends)  # the network's budget, exactly
    assert all(b >= first_round(4) for b in budget.values())
    assert budget == {"big": 9, "mid": 3, "small": 2, "tiny": 2}


def test_no_task_gets_more_than_the_cap_the_rest_goes_on_to_the_next_costliest():
    spends = [TaskSpend("big", 1, 1000.0)] + [TaskSpend(f"t{i}", 1, 1.0 + i) for i in range(7)]
    budget = allocate(spends, 4)  # 16 trials left: big alone would take all of them
    assert budget["big"] == CAP_FACTOR * 4
    assert sum(budget.values()) == 32 and budget["t6"] == 3 and budget["t5"] == 3


def test_the_split_follows_cost_share_weight_included():
    budget = allocate(
        [TaskSpend("a", 1, 3.0), TaskSpend("b", 3, 1.0), TaskSpend("c", 1, 6.0), TaskSpend("d", 1, 0.0)], 8
    )
    # 16 trials left after 4 each: a and b cost 3 each, c costs 6, d nothing measured
    assert budget == {"a": 8, "b": 8, "c": 12, "d": 4}


def test_nothing_measured_spreads_the_rest_evenly():
    budget = allocate([TaskSpend(n, 1, None) for n in "abc"], 4)
    assert budget == {"a": 4, "b": 4, "c": 4}


def test_a_task_whose_search_stopped_gets_no_more_trials():
    budget = allocate([TaskSpend("done", 1, 50.0, searchable=False), TaskSpend("a", 1, 1.0), TaskSpend("b", 1, 1.0)], 4)
    assert budget == {"done": 2, "a": 5, "b": 5}  # its share goes to the tasks that can use it
    assert allocate([TaskSpend("done", 1, None, searchable=False), TaskSpend("a", 1, None)], 2) == {"done": 1, "a": 3}


def test_when_every_task_is_capped_the_rest_is_not_spent():
    assert allocate([TaskSpend("only", 1, 1.0)], 4) == {"only": 4}


def test_allocation_is_deterministic_so_a_cached_rerun_makes_the_same_second_round():
    spends = [TaskSpend(f"t{i}", 1, 1.0) for i in range(7)]  # 7 trials left over 7 equal tasks
    assert allocate(spends, 3) == allocate(list(reversed(spends)), 3)
    assert sum(allocate(spends, 3).values()) == 21


def test_a_non_positive_budget_is_refused():
    with pytest.raises(ValueError, match="trials_per_task"):
        allocate([TaskSpend("a", 1, 1.0)], 0)
