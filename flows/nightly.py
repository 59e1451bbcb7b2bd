"""Flow `nightly`: tune every (model, target) pair of the night, one `tune_network` subflow each.

What the deployment in `deployments/prefect.yaml` runs every night:

* The night is the scheduled start date in the deployment's time zone (a run triggered by
  hand gets today's). Each pair tunes a full budget in its own session named after the
  night, warm-started from the best records of earlier nights (the store's history).
* All pairs' configs are validated before any work: a typo in the parameters fails the run
  at once, naming the pair and the key.
* A pair that fails is reported and the others still run; the run then fails with the list
  of failed pairs, and Prefect retries it (flow retries). The retry goes through the same
  subflows, whose steps are cached in the store: only what failed is redone.
* A pair whose tuned latency regressed beyond the guard's percentage ends in the state
  `Regressed` with the verdict as its message; the nightly summary shows it prominently.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.logging import get_run_logger
from prefect.runtime import flow_run

from vta_pipeline.config import PipelineConfig, build_config
from vta_pipeline.errors import ConfigError
from vta_pipeline.fetch import check_model
from vta_pipeline.flows.tune_network import tune_network
from vta_pipeline.targets import resolve_target
from vta_pipeline.tasks.dask_runner import with_task_runner

NIGHT_TIMEOUT_S = 20 * 3600
"""A night that is still running 20 h after it started is failed by Prefect (TimeoutError), so
it cannot hold the deployment's one concurrency slot into the next night's start; with the
deployment's CANCEL_NEW the next night is cancelled, not queued, while one still runs. Every
call to a board has its own, much shorter deadline (evaluate.board_timeout_s, the tuning
timeout): this is the last line, for what has none."""


class NightlyFailures(RuntimeError):
    """Some pairs failed tonight (the others finished)."""


def parse_model(spec: str | dict[str, Any]) -> dict[str, Any]:
    """'torchvision:resnet18' (source:name), 'tinynet' (built-in) or a ModelConfig dict."""
    if isinstance(spec, dict):
        return dict(spec)
    source, sep, name = spec.partition(":")
    if not sep:
        source, name = "builtin", spec
    if source == "onnx":
        return {"source": "onnx", "name": name.rsplit("/", 1)[-1].removesuffix(".onnx"), "path": name}
    return {"source": source, "name": name}


def night_of(scheduled: dt.datetime | None, time_zone: str) -> str:
    try:
        tz = zoneinfo.ZoneInfo(time_zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"time_zone {time_zone!r} is not an IANA time zone (e.g. Europe/Berlin, UTC)") from None
    when = scheduled or dt.datetime.now(dt.timezone.utc)
    return when.astimezone(tz).strftime("%Y-%m-%d")


def pair_configs(
    models: list[str | dict[str, Any]], targets: list[str], overrides: dict[str, Any], config: dict[str, Any] | None
) -> list[PipelineConfig]:
    """One validated PipelineConfig per (model, target); errors name the pair.

    What the operator wrote (a target, a model name, a value) fails the whole night here,
    before any work. An ONNX file's content does not: a file torn or replaced since the
    night was set up fails its own pair (tune_network checks it first), and the other
    pairs still run."""
    if not models or not targets:
        raise ConfigError("nightly needs at least one model and one target (parameters `models`, `targets`)")
    out = []
    for m in models:
        for t in targets:
            where = f"pair ({m}, {t})"
            try:
                resolved = resolve_target(t)
                model = parse_model(m)
                values = {**overrides, **{f"model.{k}": v for k, v in model.items()}, "target": t}
                if values.get("board.key") is None and ((config or {}).get("board") or {}).get("key") is None:
                    values["board.key"] = resolved.default_key
                cfg = build_config(config, values, source=f"the nightly parameters, {where}")
                if cfg.model.source != "onnx":
                    check_model(cfg.model)
            except Exception as e:  # bad values, an unknown model or target: the library's own message
                raise ConfigError(f"{where}: {e}") from None
            out.append(cfg)
    return out


@flow(name="nightly", retries=1, retry_delay_seconds=600, log_prints=True, timeout_seconds=NIGHT_TIMEOUT_S)
def nightly(
    models: list[Any] = ["builtin:tinynet"],  # noqa: B006 (Prefect parameters are copied per run)
    targets: list[str] = ["host"],  # noqa: B006
    config: dict[str, Any] | None = None,
    time_zone: str = "UTC",
    night: str | None = None,
    dask_address: str | None = None,
    cache: str = "on",
) -> dict[str, Any]:
    """Tune each model on each target tonight, continuing past failed pairs.

    `config` is the PipelineConfig every pair runs with, the same fields as `vta-pipeline run
    --config` reads (e.g. {"tune": {"trials_per_task": 64}, "board": {"tracker": "lab:9190"},
    "store": "/data/vta-store"}); each pair sets its model, its target and the night's tuning
    session. No `board.tracker`: a local board (loopback) per pair; no `board.key`: each
    target preset's default key. `dask_address` runs the tuning tasks on an existing Dask
    cluster (the store on shared storage)."""
    logger = get_run_logger()
    night = night or night_of(flow_run.get_scheduled_start_time(), time_zone)
    cfgs = pair_configs(models, targets, {"tune.session": night}, config)
    logger.info("night %s: %d pair(s): %s", night, len(cfgs), ", ".join(f"{c.model.name}@{c.target}" for c in cfgs))
    rows, failed = [], []
    for cfg in cfgs:
        name = f"{cfg.model.name}-{cfg.target if len(cfg.target) < 24 else 'custom'}-{night}"
        sub = with_task_runner(tune_network, dask_address, cfg).with_options(flow_run_name=name)
        state = sub(cfg.model_dump(mode="json"), cache=cache, return_state=True)
        row = {
            "pair": name,
            "model": cfg.model.name,
            "target": cfg.target,
            "state": state.name,
            "untuned ms": "-",
            "tuned ms": "-",
            "speed-up": "-",
            "guard": state.message or "",
        }
        if state.is_completed():
            r = state.result()
            row.update(
                {
                    "untuned ms": f"{r['untuned']['mean_ms']:.3f}",
                    "tuned ms": f"{r['tuned']['mean_ms']:.3f}",
                    "speed-up": f"{r['speedup']:.2f}x",
                    "guard": r.get("guard", {}).get("message", ""),
                }
            )
        else:
            failed.append(f"{name}: {state.message}")
            logger.error("pair %s failed (%s); going on with the others", name, state.message)
        rows.append(row)
    create_table_artifact(rows, key="nightly", description=f"the night {night}: one row per model/target pair")
    regressed = [r for r in rows if r["state"] == "Regressed"]
    create_markdown_artifact(
        f"# Night {night}\n\n{len(rows) - len(failed)} of {len(rows)} pair(s) finished"
        + "".join(f"\n\n> **{r['pair']}: {r['guard']}**" for r in regressed)
        + "".join(f"\n\n> **FAILED {f}**" for f in failed),
        key="nightly-summary",
    )
    if failed:
        raise NightlyFailures(f"{len(failed)} of {len(rows)} pair(s) failed tonight: " + "; ".join(failed))
    return {"night": night, "pairs": rows}
