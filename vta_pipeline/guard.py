"""The regression guard and the current build of each (model, variant, target, board key).

A nightly run that came out slower than the model's best night (noise, a changed board, a
TVM upgrade, an unlucky search) must not replace a good build. After each run:

* `check` compares tonight's tuned latency with the best correct tuned latency of earlier
  runs of the same variant (`variant.py`: fp32 and int8 builds of one model are not
  compared) in the history;
* when that says "regressed", `confirm_in_turn` decides from the two builds timed in turn
  on the board (`evaluate.time_in_turn`, run by `steps.regression_verdict`): evaluations
  from different nights on a shared board differ by more than the allowed percentage (a
  "regression" that timed even in turn was measured: docs/performance.md), and a false alarm keeps last
  week's build current while tonight's better one is thrown away;
* `promote` makes tonight's build the current one
  (`current/<model>--<target>--<key>--<variant>.json` plus a copy of its `model.so`)
  unless it regressed by more than the allowed percentage; then the previous best build
  stays (or becomes) the current one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import statistics
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from .store import history
from .store.artifacts import ArtifactStore, atomic_write_text, durable_replace
from .store.hashing import sha256_file

if TYPE_CHECKING:
    from .report import RunResult

log = logging.getLogger(__name__)


@dataclass
class Verdict:
    regressed: bool
    tonight_ms: float
    best_ms: float | None  # best earlier night (None: first run of this model/variant/target/key)
    best_night: str | None
    best_build_id: str | None
    worse_pct: float | None  # how much slower tonight is than the best night
    max_regression_pct: float
    # the two builds timed in turn on the board, when the history said "regressed"
    # (rounds, tonight_ms and best_ms per round, their medians, the median per-round ratio)
    in_turn: dict[str, Any] | None = None
    in_turn_error: str | None = None  # why they could not be (the history's verdict then stands)
    skipped: str | None = None  # why tonight was not guarded at all (an emulated board)

    @property
    def message(self) -> str:
        if self.skipped:
            return f"not guarded: {self.skipped}"
        if self.best_ms is None:
            return f"first recorded run: {self.tonight_ms:.3f} ms"
        if self.in_turn is not None:
            t = self.in_turn
            timed = (
                f"timed in turn on the board ({t['rounds']} rounds): tonight {t['tonight_median_ms']:.3f} ms vs "
                f"the best night {self.best_night}'s build {t['best_median_ms']:.3f} ms "
                f"({100 * (t['ratio'] - 1):+.1f}% per round, median; allowed {self.max_regression_pct:g}%)"
            )
            if self.regressed:
                return f"REGRESSION: {timed}; the build of {self.best_night} stays current"
            return (
                f"tuned {self.tonight_ms:.3f} ms was {self.worse_pct:.1f}% slower than the best night's "
                f"{self.best_ms:.3f} ms in the evaluations, but {timed}: not a regression, tonight's build "
                f"becomes current"
            )
        if self.regressed:
            return (
                f"REGRESSION: tuned {self.tonight_ms:.3f} ms is {self.worse_pct:.1f}% slower than the best "
                f"night {self.best_night} ({self.best_ms:.3f} ms; allowed {self.max_regression_pct:g}%); "
                f"the build of {self.best_night} stays current"
                + (f" (not confirmed in turn: {self.in_turn_error})" if self.in_turn_error else "")
            )
        return (
            f"tuned {self.tonight_ms:.3f} ms vs best night {self.best_night} {self.best_ms:.3f} ms "
            f"({self.worse_pct:+.1f}%)"
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), message=self.message)


def check(store_root: Path, result: RunResult, max_regression_pct: float) -> Verdict:
    """Tonight's tuned latency vs the best correct tuned latency of every earlier run of its
    variant (earlier rows whose variant is unknown, their run's result gone, are left out).
    An emulated board's timing is qemu's: it is neither guarded nor a night to guard against."""
    if result.emulated:
        return Verdict(
            False,
            result.tuned.mean_ms,
            None,
            None,
            None,
            None,
            max_regression_pct,
            skipped=f"the board was emulated ({result.emulated}): its timings are qemu's, not the board's",
        )
    f = (
        (pc.field("model") == result.model)
        & (pc.field("target") == result.target)
        & (pc.field("board_key") == result.board_key)
        & (pc.field("build") == "tuned")
        & (pc.field("correct") == True)  # noqa: E712 - an Arrow expression, not a Python truth test
        & (pc.field("run_id") != result.run_id)
        & history.not_emulated()
    )
    mine = result.of_variant
    rows = [r for r in history.evaluations(store_root, f) if r["variant"] == mine]
    tonight = result.tuned.mean_ms
    if not rows:
        return Verdict(False, tonight, None, None, None, None, max_regression_pct)
    best = min(rows, key=lambda r: r["mean_ms"])
    worse = 100.0 * (tonight / best["mean_ms"] - 1.0)
    return Verdict(
        worse > max_regression_pct, tonight, best["mean_ms"], best["night"], best["build_id"], worse, max_regression_pct
    )


def confirm_in_turn(verdict: Verdict, tonight_ms: list[float], best_ms: list[float]) -> Verdict:
    """The verdict of the two builds timed in turn (round i of each list from the same round):
    regressed when the median over rounds of tonight / best is past the allowed percentage.
    A per-round ratio, not a ratio of medians: a slow minute slows both builds of its round."""
    if len(tonight_ms) != len(best_ms) or not tonight_ms:
        raise ValueError(f"in-turn timings need one time per build per round, got {len(tonight_ms)} and {len(best_ms)}")
    ratio = statistics.median(t / b for t, b in zip(tonight_ms, best_ms))
    in_turn = {
        "rounds": len(tonight_ms),
        "tonight_ms": tonight_ms,
        "best_ms": best_ms,
        "ratio": ratio,
        "tonight_median_ms": statistics.median(tonight_ms),
        "best_median_ms": statistics.median(best_ms),
    }
    return replace(verdict, regressed=100.0 * (ratio - 1.0) > verdict.max_regression_pct, in_turn=in_turn)


def slug(model: str, target: str, key: str, variant_: str) -> str:
    # the variant's hash is its tail, so a long target JSON is cut before it, not it
    head = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{model}--{target}--{key}")[:100]
    return f"{head}--{re.sub(r'[^A-Za-z0-9._-]+', '_', variant_)}"


def current_path(store_root: Path, model: str, target: str, key: str, variant_: str) -> Path:
    return Path(store_root) / "current" / f"{slug(model, target, key, variant_)}.json"


def read_current(store_root: Path, model: str, target: str, key: str, variant_: str) -> dict[str, Any] | None:
    """The current build of a model's variant (`variant.of(config)`, or a result's `variant`).

    Its copy of `model.so` is checked against the SHA-256 recorded when it was promoted:
    `lib_ok` is False (with a warning naming the file) where a power cut or a full disk left
    it torn, and the next `promote` copies it again from the store. A record that does not
    parse is named in a warning and read as absent; the next `promote` writes it anew."""
    p = current_path(store_root, model, target, key, variant_)
    if not p.exists():
        return None
    try:
        cur = json.loads(p.read_text())
    except ValueError:
        log.warning(
            "current build record %s does not parse (torn by a power cut or a full disk?): "
            "read as absent; the next night's promotion rewrites it",
            p,
        )
        return None
    want, lib = cur.get("lib_sha256"), Path(cur.get("lib", p.with_suffix(".so")))
    cur["lib_ok"] = lib.is_file() and (want is None or sha256_file(lib) == want)
    if not cur["lib_ok"]:
        log.warning(
            "the current build's library %s is missing or not the one promoted (SHA-256 differs): "
            "the next promotion copies it again from %s",
            lib,
            cur.get("artifact"),
        )
    return cur


def promote(store: ArtifactStore, result: RunResult, verdict: Verdict) -> dict[str, Any]:
    """Point `current/` at tonight's build, or at the best night's build if tonight regressed."""
    model, target, key, var = result.model, result.target, result.board_key, result.of_variant
    if verdict.regressed:
        build_id, night, ms = verdict.best_build_id, verdict.best_night, verdict.best_ms
        why = "kept: tonight regressed"
    else:
        build_id, night, ms = result.tuned.build_id, result.night, result.tuned.mean_ms
        why = "tonight's build"
    art = store.find_id("build", build_id)
    now = read_current(store.root, model, target, key, var)
    if art is None:  # the best build was garbage-collected: keep whatever is current
        return now or {}
    p = current_path(store.root, model, target, key, var)
    lib = p.with_suffix(".so")
    if now is None or now.get("build_id") != build_id or not now.get("lib_ok") or "lib_sha256" not in now:
        # a copy of its own per run: two runs promoting the same build at once shared one
        # ".so.tmp", and the second's rename found it gone (FileNotFoundError)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=p.parent, prefix=f"{lib.name}.", suffix=".tmp")
        os.close(fd)
        shutil.copy2(art.file("model.so"), name)
        durable_replace(Path(name), lib)
    cur = {
        "model": model,
        "variant": var,
        "target": target,
        "board_key": key,
        "build_id": build_id,
        "night": night,
        "tuned_ms": ms,
        "lib": str(lib),
        "lib_sha256": sha256_file(lib),
        "artifact": str(art.path),
        "why": why,
        "run_id": result.run_id,
    }
    atomic_write_text(p, json.dumps(cur, indent=1))
    return cur
