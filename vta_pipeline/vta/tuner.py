"""Knob tuning of a packed conv on VTA: the recipe's AutoTVM search, resumable like our tasks.

One task per conv workload (with its epilogue). Its candidates are the knob configs that fit
VTA's buffers (`conv.knob_space`); a measurement compiles a config and runs it on a VTA
board (the simulator: its cycles at the board's clock are the latency). Three strategies, as
AutoTVM had them for the recipe:
- `grid`: the space in order;
- `random`: the space in a seeded random order;
- `xgb`: after a random first round, an XGBoost model over knob features (log tile sizes,
  threads, buffer fill, instruction counts; the recipe's `xgb_knob` fits on the knob values)
  ranks every unmeasured config and the best predicted are measured, one per round drawn at
  random so the model keeps seeing the rest of the space.

The task's work dir holds the same append-only `trials.jsonl` and `state.json` as a
MetaSchedule task's (`trial_log`): a restarted tuner reads them, never measures a config
twice, and continues with the budget it has left. Early stopping ends a task whose best has
not improved for that many trials.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..search import trial_log
from ..search.work_dir import Status, WorkDir
from .config import VTAConfig
from .conv import ConvWorkload, Epilogue, KnobError, Knobs, check, compile_conv, default_knobs, knob_space
from .isa import Layout
from .simulator import STRICT, CycleModel, Dram, HardwareRules, Simulator, StreamError
from .tophub import configs_for, start_knobs

STRATEGIES = ("grid", "random", "xgb")


@dataclass(frozen=True)
class Measurement:
    cycles: int | None
    ms: float | None
    error: str | None = None


Measure = Callable[[list[Knobs]], list[Measurement]]


def local_measure(
    wl: ConvWorkload,
    epi: Epilogue,
    cfg: VTAConfig,
    model: CycleModel | None = None,
    rules: HardwareRules | None = STRICT,
) -> Measure:
    """Measure configs on an in-process simulator (timing only: the cycles do not depend on the
    values) under `rules`. A config whose stream fails (a rule it breaks, a deadlock) is an error
    measurement, not an exception."""
    model = model or CycleModel()

    def measure(batch: list[Knobs]) -> list[Measurement]:
        out = []
        for k in batch:
            try:
                dram = Dram()
                prog = compile_conv(wl, k, epi, cfg, dram)
                stats = Simulator(cfg, model, functional=False, rules=rules).run(prog.instructions, dram)
                out.append(Measurement(stats.cycles, stats.cycles / model.clock_hz * 1e3))
            except (StreamError, KnobError) as e:  # a rule the stream breaks, a config that cannot be one
                out.append(Measurement(None, None, str(e)))
        return out

    return measure


def features(k: Knobs, wl: ConvWorkload, cfg: VTAConfig, epi: Epilogue) -> list[float]:
    """What the cost model sees of a config: the knobs (log2), its threads, how full it fills
    each SRAM, and how many tiles, steps and micro-ops it runs."""
    g, lay = check(wl, k, epi, cfg), Layout.of(cfg)
    tiles = (g.cob // k.tile_co) * (g.oh // k.tile_h) * (g.ow // k.tile_w)
    steps = g.cib // k.tile_ci
    return [
        math.log2(k.tile_h),
        math.log2(k.tile_w),
        math.log2(k.tile_ci),
        math.log2(k.tile_co),
        k.h_nthread,
        k.oc_nthread,
        g.inp_entries * g.threads / (1 << lay.inp_depth_log),
        g.wgt_entries * g.threads / (1 << lay.wgt_depth_log),
        g.acc_entries * g.threads / (1 << lay.acc_depth_log),
        math.log2(tiles),
        math.log2(tiles * steps),
        math.log2(k.tile_ci * wl.kh * wl.kw * k.tile_w),
        math.log2(g.ih * g.iw * k.tile_ci),
    ]


class KnobTuner:
    """Tune one conv workload's knobs into `work_dir` (see the module doc)."""

    def __init__(
        self,
        wl: ConvWorkload,
        epi: Epilogue,
        cfg: VTAConfig,
        work_dir: Path,
        measure: Measure,
        strategy: str = "xgb",
        seed: int = 0,
        batch: int = 8,
        warm_start: bool = True,
    ):
        """`warm_start`: measure TopHub's configs for the workload first, and start (the untuned
        latency, `default_ms`) from the fastest of them (`tophub.start_knobs`); False starts
        cold, from the smallest legal tile."""
        if strategy not in STRATEGIES:
            raise ValueError(f"knob search strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
        self.wl, self.epi, self.cfg, self.work_dir = wl, epi, cfg, Path(work_dir)
        self.measure, self.strategy, self.seed, self.batch = measure, strategy, seed, batch
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.space = knob_space(wl, cfg, epi)
        self.order = list(range(len(self.space)))
        if strategy != "grid":
            self.order = list(np.random.default_rng(seed).permutation(len(self.space)))
        # TopHub's measured configs for the workload, fastest first (where the search starts)
        self.tophub = configs_for(wl, cfg, epi) if warm_start else []
        self.start, self.start_from = (
            start_knobs(wl, cfg, epi, self.tophub) if warm_start else (default_knobs(wl, cfg, epi), "")
        )
        if self.tophub:  # measured first, as the recipe's tophub context began
            index = {k: i for i, k in enumerate(self.space)}
            first = [index[r.knobs] for r in self.tophub if r.knobs in index]
            taken = set(first)
            self.order = first + [i for i in self.order if i not in taken]

    # ---- the record --------------------------------------------------------------------------------
    def trials(self) -> list[dict[str, Any]]:
        return [r for r in trial_log.read_trials(self.work_dir) if "knobs" in r]

    def best(self) -> tuple[Knobs, float] | None:
        """The fastest measured config and its latency (ms)."""
        ok = [r for r in self.trials() if r.get("latency_ms") is not None]
        if not ok:
            return None
        r = min(ok, key=lambda r: r["latency_ms"])
        return Knobs(**r["knobs"]), r["latency_ms"]

    def default_ms(self) -> float | None:
        """The untuned config's latency (where the untuned build starts: `self.start`), measured
        once and kept."""
        p = self.work_dir / WorkDir.DEFAULT
        if not p.exists():
            (m,) = self.measure([self.start])
            p.write_text(
                json.dumps(
                    {
                        "ms": m.ms,
                        "cycles": m.cycles,
                        "error": m.error,
                        "knobs": self.start.to_dict(),
                        "from": self.start_from,
                    }
                )
            )
        return json.loads(p.read_text())["ms"]

    # ---- the search --------------------------------------------------------------------------------
    def tune(
        self,
        trials: int,
        early_stopping: int | None = None,
        progress: Callable[[int, int, float | None], None] | None = None,
    ) -> tuple[Knobs, float] | None:
        """Measure until the task has `trials` measurements (counting earlier runs'), the space is
        exhausted, or `early_stopping` trials brought no improvement."""
        trial_log.write_state(self.work_dir, status=Status.TUNING, trials=trials, strategy=self.strategy)
        while True:
            done = self.trials()
            lats = [r["latency_ms"] for r in done if r.get("latency_ms") is not None]
            since = _since_best([r.get("latency_ms") for r in done])
            if (
                len(done) >= trials
                or len(done) >= len(self.space)
                or (early_stopping is not None and lats and since >= early_stopping)
            ):
                break
            batch = self._propose(min(self.batch, trials - len(done)), done)
            if not batch:
                break
            results = self.measure(batch)
            rows = [
                {
                    "knobs": k.to_dict(),
                    "cycles": m.cycles,
                    "latency_ms": m.ms,
                    "error": m.error,
                    "strategy": self.strategy,
                    "time": time.time(),
                }
                for k, m in zip(batch, results)
            ]
            trial_log.append_trials(self.work_dir, rows)
            if progress:
                b = self.best()
                progress(len(done) + len(rows), trials, b[1] if b else None)
        best = self.best()
        trial_log.write_state(
            self.work_dir,
            status=Status.FINISHED,
            trials=trials,
            strategy=self.strategy,
            measured=len(self.trials()),
            best_ms=best[1] if best else None,
        )
        return best

    def _propose(self, n: int, done: list[dict[str, Any]]) -> list[Knobs]:
        seen = {Knobs(**r["knobs"]) for r in done}
        fresh = [self.space[i] for i in self.order if self.space[i] not in seen]
        ok = [r for r in done if r.get("latency_ms") is not None]
        if self.strategy != "xgb" or len(ok) < max(self.batch, 8):
            return fresh[:n]
        import xgboost

        x = np.array([features(Knobs(**r["knobs"]), self.wl, self.cfg, self.epi) for r in ok])
        y = np.log(np.array([r["latency_ms"] for r in ok]))
        params = {"max_depth": 4, "eta": 0.3, "seed": self.seed, "nthread": 1, "objective": "reg:squarederror"}
        model = xgboost.train(params, xgboost.DMatrix(x, label=y), num_boost_round=64)
        pred = model.predict(xgboost.DMatrix(np.array([features(k, self.wl, self.cfg, self.epi) for k in fresh])))
        ranked = [fresh[i] for i in np.argsort(pred, kind="stable")]
        picks = ranked[: max(n - 1, 1)]
        rest = [k for k in fresh if k not in set(picks)]
        if n > 1 and rest:  # one at random: the model keeps seeing the rest of the space
            picks.append(rest[int(np.random.default_rng(self.seed + len(done)).integers(len(rest)))])
        return picks[:n]


def _since_best(lats: list[float | None]) -> int:
    best, since = math.inf, 0
    for v in lats:
        if v is not None and v < best:
            best, since = v, 0
        else:
            since += 1
    return since
