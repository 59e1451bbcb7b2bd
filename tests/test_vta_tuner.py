"""Knob tuning of a packed conv on the VTA simulator: the strategies, the resumable record (no
config measured twice), early stopping, and a tuned config faster than the untuned one."""

from __future__ import annotations

import numpy as np
import pytest

from vta_pipeline.search import trial_log
from vta_pipeline.vta.config import VTAConfig
from vta_pipeline.vta.conv import ConvWorkload, Epilogue, Knobs, knob_space
from vta_pipeline.vta.tuner import KnobTuner, Measurement, local_measure

CFG = VTAConfig()
WL = ConvWorkload(1, 14, 14, 64, 64, 3, 3, 1, 1, 1, 1)
EPI = Epilogue(round_add=128, shift=8, clip_min=0)


def counting(measure):
    """The measure, with every config it was asked for recorded."""
    asked: list[Knobs] = []

    def m(batch):
        asked.extend(batch)
        return measure(batch)

    return m, asked


@pytest.mark.parametrize("strategy", ["grid", "random", "xgb"])
def test_each_strategy_measures_distinct_configs_and_finds_one_faster_than_untuned(strategy, tmp_path):
    measure, asked = counting(local_measure(WL, EPI, CFG))
    tuner = KnobTuner(WL, EPI, CFG, tmp_path, measure, strategy=strategy, seed=1, batch=8)
    best, ms = tuner.tune(24)
    trials = tuner.trials()
    assert len(trials) == 24 and len(set(asked)) == len(asked) == 24
    assert all(Knobs(**t["knobs"]) in set(knob_space(WL, CFG, EPI)) for t in trials)
    assert ms == min(t["latency_ms"] for t in trials) and ms < tuner.default_ms()
    assert trial_log.read_state(tmp_path)["status"] == "finished"


def test_a_restarted_tuner_continues_without_measuring_a_config_twice(tmp_path):
    first, asked1 = counting(local_measure(WL, EPI, CFG))
    KnobTuner(WL, EPI, CFG, tmp_path, first, strategy="xgb", seed=3).tune(16)
    again, asked2 = counting(local_measure(WL, EPI, CFG))
    tuner = KnobTuner(WL, EPI, CFG, tmp_path, again, strategy="xgb", seed=3)
    tuner.tune(32)
    assert len(asked2) == 16 and not set(asked1) & set(asked2)
    assert len(tuner.trials()) == 32
    tuner.tune(32)  # the budget is spent: nothing more is measured
    assert len(asked2) == 16


def test_the_xgb_search_beats_random_order_on_the_same_budget():
    # averaged over seeds: after a random first round, the model ranks what to measure
    def best_after(strategy, seed, tmp):
        return KnobTuner(WL, EPI, CFG, tmp, local_measure(WL, EPI, CFG), strategy=strategy, seed=seed).tune(32)[1]

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        xgb = [best_after("xgb", s, Path(d) / f"x{s}") for s in range(3)]
        rnd = [best_after("random", s, Path(d) / f"r{s}") for s in range(3)]
    assert np.mean(xgb) <= np.mean(rnd), (xgb, rnd)


def test_early_stopping_ends_a_task_that_stopped_improving(tmp_path):
    slow = {"n": 0}

    def measure(batch):  # the first config is the best; every later one is worse
        out = []
        for _ in batch:
            slow["n"] += 1
            out.append(Measurement(100 + slow["n"], 1.0 + slow["n"]))
        return out

    tuner = KnobTuner(WL, EPI, CFG, tmp_path, measure, strategy="grid", batch=4)
    tuner.tune(64, early_stopping=8)
    assert len(tuner.trials()) == 12  # 1 best + 8 without improvement, in rounds of 4


def test_a_config_whose_stream_fails_is_recorded_as_an_error_not_raised(tmp_path):
    def measure(batch):
        return [Measurement(None, None, "deadlock: ...") if k.tile_h == 1 else Measurement(10, 0.1) for k in batch]

    tuner = KnobTuner(WL, EPI, CFG, tmp_path, measure, strategy="grid", batch=8)
    tuner.tune(8)
    errors = [t for t in tuner.trials() if t["error"]]
    assert errors and all(t["latency_ms"] is None for t in errors)


def test_a_vta_sim_board_behind_a_tracker_measures_what_the_local_simulator_does(tmp_path):
    # a real tracker and a VTA board (TVM's rpc server with the simulator's functions) on 127.0.0.1
    from vta_pipeline.boards import LocalBoard
    from vta_pipeline.vta.remote import board_measure

    configs = knob_space(WL, CFG, EPI)[:3]
    with LocalBoard(
        key="vta-sim", server_module="vta_pipeline.vta.rpc_server", threads=1, registry=tmp_path / "boards.json"
    ) as board:
        remote = board_measure(board.tracker, "vta-sim", WL, EPI, CFG)(configs)
    assert remote == local_measure(WL, EPI, CFG)(configs) and all(m.cycles for m in remote)


def test_a_workload_tophub_measured_starts_from_its_config_and_tunes_from_there(tmp_path):
    """As the recipe's `tophub.context` did: the untuned conv runs TopHub's measured config and the
    search measures it first; without the warm start it starts from the smallest legal tile."""
    from vta_pipeline.vta import tophub

    record = min(tophub.resnet18(CFG), key=lambda r: r.workload.ops())  # a 1x1 conv: quick to time
    epi = Epilogue(bias=True, residual_shift=8, round_add=128, shift=8, clip_min=0)
    warm = KnobTuner(record.workload, epi, CFG, tmp_path / "warm", local_measure(record.workload, epi, CFG))
    assert warm.start == record.knobs and "TopHub" in warm.start_from
    best = warm.tune(4)
    assert Knobs(**warm.trials()[0]["knobs"]) == record.knobs
    assert best[1] <= warm.default_ms()  # the start was measured: the tuned is never slower
    cold = KnobTuner(
        record.workload, epi, CFG, tmp_path / "cold", local_measure(record.workload, epi, CFG), warm_start=False
    )
    cold.tune(4)
    assert cold.start != record.knobs and record.knobs not in [Knobs(**t["knobs"]) for t in cold.trials()]


@pytest.mark.parametrize(
    "wl, epi",
    [
        (  # resnet18's last residual conv
            ConvWorkload(1, 7, 7, 512, 512, 3, 3, 1, 1, 1, 1),
            Epilogue(bias=True, residual_shift=9, round_add=1 << 8, shift=9, clip_min=0),
        ),
        (  # mobilenet_v2's last depthwise conv
            ConvWorkload(1, 7, 7, 960, 960, 3, 3, 1, 1, 1, 1, groups=960),
            Epilogue(bias=True, round_add=1 << 6, shift=7, clip_min=0),
        ),
        (  # and a projection that adds its block's input
            ConvWorkload(1, 14, 14, 576, 96, 1, 1, 0, 0, 1, 1),
            Epilogue(bias=True, residual_shift=8, round_add=1 << 7, shift=8),
        ),
    ],
    ids=["resnet18-7x7-residual", "mobilenet_v2-7x7-depthwise", "mobilenet_v2-14x14-projection"],
)
def test_every_config_a_64_trial_search_measures_keeps_the_hardwares_rules(wl, epi, tmp_path):
    """The tuner measures under the hardware's rules (`local_measure`'s default): a config whose
    stream broke one would come back as an error. None does, untuned included."""
    tuner = KnobTuner(wl, epi, CFG, tmp_path, local_measure(wl, epi, CFG), strategy="random")
    tuner.tune(64)
    trials = tuner.trials()
    assert len(trials) == min(64, len(knob_space(wl, CFG, epi)))
    assert [t["error"] for t in trials if t["error"]] == []
    assert tuner.default_ms() is not None
