"""The pipeline's steps bound to the artifact store: key, reuse or compute, persist.

Each `*_key` function computes a step's cache key from the content ids of its inputs and
its config (Olive's (input artifact id, step name, step config, target)); each `*_step`
function returns the step's verified artifact, computing it only when the store has none.
The Prefect tasks call exactly these, and use the same keys for Prefect's cache, so the
library runs the same with or without Prefect.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import build as build_mod
from . import cpu_layout as layout_mod
from . import evaluate as eval_mod
from . import extract as extract_mod
from . import fetch as fetch_mod
from . import guard, spaces
from . import pack as pack_mod
from . import pick_best as pick_best_mod
from . import quantize as quantize_mod
from . import tune as tune_mod
from .boards import BoardSpec
from .boards.emulator import Emulator, arch_for_target
from .config import (
    EvalConfig,
    GuardConfig,
    MeasureConfig,
    ModelConfig,
    PackConfig,
    PipelineConfig,
    QuantizeConfig,
    TuneConfig,
)
from .errors import BoardError, ConfigError
from .search import records_library, retime, trial_log
from .search.work_dir import WorkDir
from .store import history, workload_keys
from .store.artifacts import Artifact, ArtifactStore
from .store.hashing import sha256_file, sha256_json
from .targets import ResolvedTarget
from .vta.config import VTAConfig

if TYPE_CHECKING:
    from .report import RunResult


# ---- checks before any work ------------------------------------------------------------------
def check_target(cfg: PipelineConfig, target: ResolvedTarget) -> None:
    """What a run on `target` needs, checked before anything is computed."""
    target.check_toolchain()
    if cfg.pack.enabled and target.layout != "NCHW":
        raise ConfigError(
            f"graph pack (--vta) rewrites convs into VTA's blocked NCHW layout, but target {target.name!r} "
            f"tunes in {target.layout}; run {target.name!r} without --vta (int8 packing is for CPU targets)"
        )
    if cfg.tune.retime_caches == "flushed":
        import tvm

        from .search.retime import can_flush

        if not can_flush(tvm.target.Target(target.full_json)):
            raise ConfigError(
                f"--retime-caches flushed: target {target.name!r} runs its kernels where TVM's runner cannot flush "
                "the caches (it flushes those of 64-bit x86 and Arm CPUs only); use --retime-caches warm or auto"
            )
    if target.offload == "vta" and not (cfg.quantize.enabled and cfg.pack.enabled and cfg.pack.layout == "vta"):
        raise ConfigError(
            f"target {target.name!r} runs the network's packed int8 convs on VTA: add --vta (quantize and graph "
            f"pack in VTA's layout{'; not --pack-layout ' + cfg.pack.layout if cfg.pack.layout != 'vta' else ''})"
        )


def check_local_board(cfg: PipelineConfig, target: ResolvedTarget) -> None:
    """A local board runs on this machine: it cannot run code cross-compiled for another CPU,
    nor GPU code on a machine whose TVM runtime sees no such GPU."""
    if cfg.board.emulate:
        if cfg.board.tracker is not None:
            raise ConfigError(
                "--emulate starts a local emulated board, and --tracker names a rack's: drop one (an emulated board "
                "behind a tracker of your own: `vta-pipeline board up --emulate aarch64`, then --tracker)"
            )
        Emulator.for_target(target).check()
        return
    if cfg.board.tracker is not None:
        return
    fix = (
        f"pass --tracker HOST:PORT of the tracker your {target.default_key!r} boards register with, "
        "or build without a board with `vta-pipeline build`"
    )
    if target.cross_compiler:
        try:
            arch_for_target(target)
            fix += " (or rehearse on an emulated board: --emulate)"
        except ConfigError:
            pass
        raise ConfigError(
            f"target {target.name!r} builds for another CPU ({target.full_json.get('mtriple', target.kind)}), "
            f"which the local board on this machine cannot run: {fix}"
        )
    if target.device != "cpu" and not local_device_exists(target.device):
        raise ConfigError(
            f"target {target.name!r} runs on a {target.device} device, and this machine has none that TVM's "
            f"runtime can use (no GPU, no driver, or a TVM built without {target.device}), so a local board "
            f"could not run it: {fix}"
        )


def local_device_exists(device: str) -> bool:
    """Whether this machine's TVM runtime can open device 0 of kind `device` ("cuda", "opencl")."""
    import tvm

    try:
        return bool({"cuda": tvm.cuda, "opencl": tvm.opencl}[device](0).exist)
    except Exception:  # a runtime built without the device kind raises instead of answering False
        return False


# ---- fetch ------------------------------------------------------------------------------------
def fetch_key(store: ArtifactStore, model: ModelConfig) -> str:
    inputs = {}
    if model.source == "onnx":
        inputs["onnx"] = sha256_file(Path(model.path))  # the file's content, not its name
        external = fetch_mod.onnx_external_files(Path(model.path))
        if external:  # only where there are some: keys of single-file models stay as they were
            inputs["onnx_external_data"] = sha256_json({f.name: sha256_file(f) for f in external})
    return store.key(fetch_mod.STEP, version=fetch_mod.VERSION, inputs=inputs, config=model.model_dump(mode="json"))


def fetch_step(store: ArtifactStore, model: ModelConfig) -> Artifact:
    fetch_mod.check_model(model)
    key = fetch_key(store, model)
    return store.produce(
        fetch_mod.STEP, key, lambda out: fetch_mod.fetch_model(model, out), config=model.model_dump(mode="json")
    )


# ---- quantize ---------------------------------------------------------------------------------
def _quantize_config(cfg: QuantizeConfig, seed: int) -> dict[str, Any]:
    # skip_dense_layer only when off: stores quantized before it existed keep their keys
    exclude = {"enabled", "calibration_data"} | ({"skip_dense_layer"} if cfg.skip_dense_layer else set())
    return {**cfg.model_dump(mode="json", exclude=exclude), "seed": seed}


def quantize_key(store: ArtifactStore, model_id: str, cfg: QuantizeConfig, seed: int = 0) -> str:
    inputs = {"model": model_id}
    if cfg.calibration_data is not None and cfg.calibrate_mode != "global_scale":
        inputs["calibration"] = sha256_file(Path(cfg.calibration_data))  # content, not the file name
    return store.key(quantize_mod.STEP, version=quantize_mod.VERSION, inputs=inputs, config=_quantize_config(cfg, seed))


def quantize_step(store: ArtifactStore, model: Artifact, cfg: QuantizeConfig, seed: int = 0) -> Artifact:
    key = quantize_key(store, model.id, cfg, seed)
    return store.produce(
        quantize_mod.STEP,
        key,
        lambda out: quantize_mod.quantize_model(model.path, cfg, out, seed),
        inputs={"model": model.id},
        config=_quantize_config(cfg, seed),
    )


# ---- pack -------------------------------------------------------------------------------------
def _pack_config(pack: PackConfig, vta: VTAConfig) -> dict[str, Any]:
    # pad_channels, stem, depthwise_dot and winograd only when on: stores packed before they existed keep their keys
    exclude = {"enabled"} | {f for f in ("pad_channels", "stem", "depthwise_dot", "winograd") if not getattr(pack, f)}
    if not pack.winograd:
        exclude.add("winograd_small_below")
    return {"pack": pack.model_dump(mode="json", exclude=exclude), "vta": vta.model_dump(mode="json")}


def pack_key(store: ArtifactStore, model_id: str, pack: PackConfig, vta: VTAConfig) -> str:
    return store.key(
        pack_mod.STEP, version=pack_mod.VERSION, inputs={"model": model_id}, config=_pack_config(pack, vta)
    )


def pack_step(store: ArtifactStore, model: Artifact, pack: PackConfig, vta: VTAConfig) -> Artifact:
    key = pack_key(store, model.id, pack, vta)
    return store.produce(
        pack_mod.STEP,
        key,
        lambda out: pack_mod.pack_model(model.path, pack, vta, out),
        inputs={"model": model.id},
        config=_pack_config(pack, vta),
    )


# ---- cpu layout -------------------------------------------------------------------------------
def layout_key(store: ArtifactStore, model_id: str, config: dict[str, Any]) -> str:
    return store.key(layout_mod.STEP, version=layout_mod.VERSION, inputs={"model": model_id}, config=config)


def layout_step(store: ArtifactStore, model: Artifact, config: dict[str, Any]) -> Artifact:
    """The network with every conv blocked for the CPU; `config` is `cpu_layout.layout_config`'s."""
    key = layout_key(store, model.id, config)
    return store.produce(
        layout_mod.STEP,
        key,
        lambda out: layout_mod.layout_model(model.path, config, out),
        inputs={"model": model.id},
        config=config,
    )


def wholly_on_cpu(cfg: PipelineConfig, target: ResolvedTarget) -> bool:
    """Whether every task of the network runs on the CPU in our packed spaces (float graph pack
    or the blocked layout): then `select_tasks`' auto tunes them all, not only VTA's packed convs."""
    return (cfg.pack.enabled and not cfg.quantize.enabled) or layout_mod.recipe(cfg, target).blocked


def with_defaults(cfg: PipelineConfig, target: ResolvedTarget | None) -> PipelineConfig:
    """`cfg` with the defaults that depend on where it runs filled in, so that the steps, the
    run's record and its variant all see what ran: `quantize.skip_conv_layers` unset keeps the
    stem float for VTA and graph pack (VTA cannot pack 3 input channels) and quantizes it on
    the CPU's blocked layout (the dot product pads the 3 channels to 4: resnet18's stem, a
    fifth of its int8 time in float, is the one conv a float stem left off the dot product)."""
    if cfg.quantize.skip_conv_layers is not None:
        return cfg
    blocked = target is not None and layout_mod.recipe(cfg, target).blocked
    return cfg.model_copy(
        update={"quantize": cfg.quantize.model_copy(update={"skip_conv_layers": () if blocked else (0,)})}
    )


def prepare_model(
    store: ArtifactStore, cfg: PipelineConfig, upto: str = "pack", target: ResolvedTarget | None = None
) -> Artifact:
    """fetch -> quantize (if enabled) -> pack (if enabled) or, on a CPU `target`, the blocked
    layout (as the preset says): the network the tasks come from."""
    cfg = with_defaults(cfg, target)
    model = fetch_step(store, cfg.model)
    if cfg.quantize.enabled and upto in ("quantize", "pack"):
        model = quantize_step(store, model, cfg.quantize, cfg.model.seed)
    if cfg.pack.enabled and upto == "pack":
        model = pack_step(store, model, cfg.pack, cfg.vta)
    elif upto == "pack" and target is not None:
        r = layout_mod.recipe(cfg, target)
        if r.blocked:
            model = layout_step(store, model, layout_mod.layout_config(r, target.target_json))
    return model


# ---- extract ----------------------------------------------------------------------------------
def offload_config(cfg: PipelineConfig, target: ResolvedTarget) -> VTAConfig | None:
    """The VTA config a run's packed convs are offloaded to (target vta-sim), or None."""
    return cfg.vta if target.offload == "vta" else None


def _extract_config(target: ResolvedTarget, vta: VTAConfig | None) -> dict[str, Any]:
    if vta is None:
        return target.to_dict()
    return {
        **target.to_dict(),
        "offload_vta": vta.model_dump(mode="json"),
        "offload_vta_version": extract_mod.VTA_OFFLOAD_VERSION,
    }


def extract_key(store: ArtifactStore, fetched_id: str, target: ResolvedTarget, vta: VTAConfig | None = None) -> str:
    return store.key(
        extract_mod.STEP, version=extract_mod.VERSION, inputs={"model": fetched_id}, config=_extract_config(target, vta)
    )


def extract_step(
    store: ArtifactStore, fetched: Artifact, target: ResolvedTarget, vta: VTAConfig | None = None
) -> Artifact:
    """Lower the network and extract its tuning tasks; with `vta`, its packed convs offloaded
    to VTA first (their knob tasks listed apart)."""
    key = extract_key(store, fetched.id, target, vta)
    return store.produce(
        extract_mod.STEP,
        key,
        lambda out: extract_mod.extract_tasks(
            fetched.path, target.full_json, out, target.layout, vta.model_dump(mode="json") if vta is not None else None
        ),
        inputs={"model": fetched.id},
        config=_extract_config(target, vta),
    )


# ---- tune -------------------------------------------------------------------------------------
def _tune_config(tune: TuneConfig, measure: MeasureConfig, key: str) -> dict[str, Any]:
    # A task's tuning depends on its own budget only; how the network's budget was spread
    # (tune.allocation) is the flow's business and not part of the task's key.
    # Our design spaces' versions: a task searches again when its space changed (`spaces.upgrade`).
    return {
        "tune": tune.model_dump(mode="json", exclude={"allocation"}),
        "measure": measure.model_dump(mode="json", exclude={"tracker_wait_s"}),
        "board_key": key,
        "spaces": spaces.versions(),
    }


def tune_key(
    store: ArtifactStore,
    task: extract_mod.TaskInfo,
    target: ResolvedTarget,
    tune: TuneConfig,
    measure: MeasureConfig,
    board_key: str,
) -> str:
    return store.key(
        tune_mod.STEP,
        version=tune_mod.VERSION,
        inputs={"workload": task.workload_hash, "target": target.id},
        config=_tune_config(tune, measure, board_key),
    )


def tune_work_dir(
    store: ArtifactStore, task: extract_mod.TaskInfo, target: ResolvedTarget, board_key: str, session: str | None
) -> Path:
    """Where a task's records accumulate: per (target, board key, workload, session).

    Work dirs of a store written before workloads had structural keys are moved first."""
    workload_keys.migrate(store.root / "work")
    return trial_log.task_work_dir(store.root / "work", f"{target.id}-{board_key}", task.workload_hash, session)


def tune_step(
    store: ArtifactStore,
    extracted: Artifact,
    task: extract_mod.TaskInfo,
    target: ResolvedTarget,
    board: BoardSpec,
    tune: TuneConfig,
    measure: MeasureConfig,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> Artifact:
    """Tune one task. Its records accumulate in a work dir keyed by (target, workload, board
    key), so a killed or re-budgeted run continues from them; the finished result (the
    task's database and summary) is a normal artifact keyed also by the budget."""
    key = tune_key(store, task, target, tune, measure, board.key)
    work = tune_work_dir(store, task, target, board.key, tune.session)

    def compute(out: Path) -> dict[str, Any]:
        # Earlier sessions' best records of this workload (same target and board key) seed the
        # search; their best latency is what this session is measured against.
        seeds, previous_best, seed_hashes = history.best_records(
            store.root, task.workload_hash, target.id, board.key, tune.warm_start, exclude_session=tune.session
        )
        # A workload the store never measured starts from the records library (its CPU class's).
        library = (
            records_library.seeds(
                records_library.resolve(tune.records_library),
                task.workload_hash,
                target,
                min(tune.warm_start, records_library.PER_WORKLOAD),
            )
            if tune.warm_start and not seeds
            else None
        )
        warm = tune_mod.WarmStart(
            seeds=tuple(seeds) if tune.warm_start else (),
            seed_hashes=tuple(seed_hashes) if tune.warm_start else (),
            previous_best_ms=previous_best,
            library=library,
        )
        job = tune_mod.TaskJob(
            extracted.path / task.file,
            task.name,
            task.flops,
            task.workload_hash,
            target.full_json,
            board,
            tune,
            measure,
            work,
            cross_compiler=target.cross_compiler,
            progress=progress,
        )
        outcome = tune_mod.tune_task(job, warm)
        names = [WorkDir.WORKLOADS, WorkDir.RECORDS, WorkDir.TRIALS]
        if outcome.retimed:  # pick best builds with its winner
            names.append(retime.RETIMED)
        for name in names:
            if (work / name).exists():
                shutil.copy2(work / name, out / name)
        (out / WorkDir.SUMMARY).write_text(json.dumps(outcome.to_dict(), indent=1))
        return {k: v for k, v in outcome.to_dict().items() if k != "curve"}

    return store.produce(
        tune_mod.STEP,
        key,
        compute,
        inputs={"workload": task.workload_hash, "target": target.id},
        config=_tune_config(tune, measure, board.key),
    )


# ---- VTA knob tuning --------------------------------------------------------------------------
VTA_TUNE_STEP = "vta_tune"
VTA_TUNE_VERSION = 2  # 2: hardware-legal streams, the calibrated cycle model


def _vta_tune_config(tune: TuneConfig, vta: VTAConfig, board_key: str) -> dict[str, Any]:
    return {
        "trials": tune.trials_per_task,
        "batch": tune.trials_per_batch,
        "strategy": tune.cost_model,
        "early_stopping": tune.early_stopping,
        "seed": tune.seed,
        "session": tune.session,
        "vta": vta.model_dump(mode="json"),
        "board_key": board_key,
    }


def vta_tune_key(store: ArtifactStore, task: Any, vta: VTAConfig, board_key: str, tune: TuneConfig) -> str:
    return store.key(
        VTA_TUNE_STEP,
        version=VTA_TUNE_VERSION,
        inputs={"task": task.key},
        config=_vta_tune_config(tune, vta, board_key),
    )


def vta_tune_step(
    store: ArtifactStore,
    task: Any,
    vta: VTAConfig,
    tracker: str,
    board_key: str,
    tune: TuneConfig,
    progress: Callable[[int, int, float | None], None] | None = None,
) -> Artifact:
    """Tune one VTA task's knobs on the boards under `board_key` (`tune.cost_model`: xgb or
    random). Its trials accumulate in a work dir per (VTA config, board key, task, session),
    so a killed run goes on from them; the result (best knobs, untuned and tuned latency) is
    an artifact keyed also by the budget."""
    from .vta.remote import board_measure
    from .vta.tuner import KnobTuner

    config = _vta_tune_config(tune, vta, board_key)
    inputs = {"task": task.key}
    key = vta_tune_key(store, task, vta, board_key, tune)
    vta_id = sha256_json(vta.model_dump(mode="json"))[:12]
    work = trial_log.task_work_dir(store.root / "work", f"vta-{vta_id}-{board_key}", task.key, tune.session)

    def compute(out: Path) -> dict[str, Any]:
        tuner = KnobTuner(
            task.workload,
            task.epilogue,
            vta,
            work,
            board_measure(tracker, board_key, task.workload, task.epilogue, vta),
            strategy=tune.cost_model,
            seed=tune.seed,
            batch=tune.trials_per_batch,
        )
        default_ms = tuner.default_ms()
        tophub_ms = tuner.tophub[0].seconds * 1e3 if tuner.tophub else None  # on a Pynq, AutoTVM's epilogue
        best = tuner.tune(tune.trials_per_task, tune.early_stopping, progress)
        if best is None:
            raise RuntimeError(f"VTA task {task.name}: no knob config ran on the board (see {work / WorkDir.TRIALS})")
        shutil.copy2(work / WorkDir.TRIALS, out / WorkDir.TRIALS)
        summary = {
            "task": task.name,
            "key": task.key,
            "count": task.count,
            "workload": task.to_dict()["workload"],
            "epilogue": task.to_dict()["epilogue"],
            "best_knobs": best[0].to_dict(),
            "best_ms": best[1],
            "default_ms": default_ms,
            "start_from": tuner.start_from,  # where the untuned config came from (TopHub or the fallback)
            "tophub_measured_ms": tophub_ms,
            "trials": len(tuner.trials()),
            "ops": task.ops(),
        }
        (out / WorkDir.SUMMARY).write_text(json.dumps(summary, indent=1))
        return summary

    return store.produce(VTA_TUNE_STEP, key, compute, inputs=inputs, config=config)


# ---- pick best --------------------------------------------------------------------------------
def pick_best_key(store: ArtifactStore, tuned_ids: list[str], target: ResolvedTarget) -> str:
    return store.key(
        pick_best_mod.STEP,
        version=pick_best_mod.VERSION,
        inputs={"tuned": sorted(tuned_ids), "target": target.id},
        config={},
    )


def pick_best_step(store: ArtifactStore, tuned: list[Artifact], target: ResolvedTarget) -> Artifact:
    ids = [a.id for a in tuned]
    key = pick_best_key(store, ids, target)
    return store.produce(
        pick_best_mod.STEP,
        key,
        lambda out: pick_best_mod.pick_best([a.path for a in tuned], out),
        inputs={"tuned": sorted(ids), "target": target.id},
    )


# ---- build ------------------------------------------------------------------------------------
def _build_inputs(extracted_id: str, best_id: str | None, vta_tuned_ids: list[str] | None) -> dict[str, Any]:
    # without VTA tasks, the inputs (and keys) builds always had
    return {"tasks": extracted_id, "best": best_id, **({"vta_tuned": sorted(vta_tuned_ids)} if vta_tuned_ids else {})}


def build_key(
    store: ArtifactStore,
    extracted_id: str,
    best_id: str | None,
    target: ResolvedTarget,
    vta_tuned_ids: list[str] | None = None,
) -> str:
    return store.key(
        build_mod.STEP,
        version=build_mod.VERSION,
        inputs=_build_inputs(extracted_id, best_id, vta_tuned_ids),
        config=target.to_dict(),
    )


def build_step(
    store: ArtifactStore,
    extracted: Artifact,
    best: Artifact | None,
    target: ResolvedTarget,
    vta_tuned: list[Artifact] | None = None,
) -> Artifact:
    """Build the network with the best MetaSchedule records (`best`) and, for offloaded
    convs, the best knobs of each VTA task (`vta_tuned`); untuned without them."""
    target.check_toolchain()
    best_id = best.id if best else None
    vta_ids = [a.id for a in vta_tuned or []]
    key = build_key(store, extracted.id, best_id, target, vta_ids)
    knobs = {}
    for a in vta_tuned or []:
        summary = json.loads((a.path / WorkDir.SUMMARY).read_text())
        knobs[summary["key"]] = summary["best_knobs"]
    return store.produce(
        build_mod.STEP,
        key,
        lambda out: build_mod.build_network(
            extracted.path, target.full_json, out, best.path if best else None, target.cross_compiler, knobs or None
        ),
        inputs=_build_inputs(extracted.id, best_id, vta_ids),
        config=target.to_dict(),
    )


# ---- evaluate ---------------------------------------------------------------------------------
def evaluate_key(store: ArtifactStore, built_id: str, fetched_id: str, cfg: EvalConfig, board_key: str) -> str:
    return store.key(
        eval_mod.STEP,
        version=eval_mod.VERSION,
        inputs={"lib": built_id, "reference": fetched_id},
        config={"evaluate": _eval_keyed(cfg), "board_key": board_key},
    )


def _eval_keyed(cfg: EvalConfig) -> dict[str, Any]:
    """The evaluation's settings that change its result (a deadline does not)."""
    return cfg.model_dump(mode="json", exclude={"board_timeout_s"})


def evaluate_step(
    store: ArtifactStore,
    built: Artifact,
    fetched: Artifact,
    target: ResolvedTarget,
    tracker: tuple[str, int],
    board_key: str,
    cfg: EvalConfig,
) -> Artifact:
    key = evaluate_key(store, built.id, fetched.id, cfg, board_key)

    def compute(out: Path) -> dict[str, Any]:
        ev = eval_mod.evaluate_on_board(
            built.file(build_mod.LIB),
            fetch_mod.load_reference(fetched.path),
            target.kind,
            tracker,
            board_key,
            cfg.number,
            cfg.repeat,
            cfg.rtol,
            cfg.atol,
            float_output=fetch_mod.load_float_reference(fetched.path),
            max_seconds=cfg.max_seconds,
            min_repeat_ms=cfg.min_repeat_ms,
            vta=target.offload == "vta",
            board_timeout_s=cfg.board_timeout_s,
        )
        (out / "evaluation.json").write_text(json.dumps(ev.to_dict(), indent=1))
        return ev.to_dict()

    return store.produce(
        eval_mod.STEP,
        key,
        compute,
        inputs={"lib": built.id, "reference": fetched.id},
        config={"evaluate": _eval_keyed(cfg), "board_key": board_key},
    )


# ---- after the evaluation ----------------------------------------------------------------------
def compare_runtime(
    cfg: PipelineConfig,
    target: ResolvedTarget,
    built: Artifact,
    fetched: Artifact,
    tracker: tuple[str, int],
    board_key: str,
    threads: int | None,
) -> dict[str, Any]:
    """The tuned build timed in turn with ONNX Runtime fp32, and for an int8 run with ORT's own
    int8 (`baseline`), or why not."""
    import tempfile

    from . import baseline

    why = baseline.absent_reason(cfg, target)
    if why is not None:
        return {"engine": baseline.INT8_ENGINE if cfg.quantize.enabled else baseline.ENGINE, "absent": why}
    x, y = fetch_mod.load_reference(fetched.path)
    with tempfile.TemporaryDirectory() as work:
        onnx_path = baseline.onnx_model(cfg, fetched.path, Path(work))
        int8_onnx, int8_absent = None, None
        if cfg.quantize.enabled:
            try:
                int8_onnx = baseline.quantize_qdq(
                    onnx_path,
                    Path(work) / "model.qdq.onnx",
                    quantize_mod.calibration_inputs(cfg.quantize, tuple(x.shape), cfg.model.seed),
                )
            except baseline.QuantizerUnavailable as e:
                int8_absent = str(e)
        out = baseline.compare(
            built.file(build_mod.LIB),
            onnx_path,
            x,
            y,
            tracker,
            board_key,
            threads or target.cpu_threads or 1,
            cfg.evaluate.compare_rounds,
            cfg.evaluate.min_repeat_ms,
            int8_onnx=int8_onnx,
            float_reference=fetch_mod.load_float_reference(fetched.path),
            board_timeout_s=cfg.evaluate.board_timeout_s,
        )
    out["int8_run"] = cfg.quantize.enabled
    if int8_absent:
        out["int8_absent"] = int8_absent
    return out


def regression_verdict(
    store: ArtifactStore,
    result: RunResult,
    cfg: GuardConfig,
    target: ResolvedTarget,
    tracker: tuple[str, int],
    board_key: str,
    fetched: Artifact,
    min_repeat_ms: float = 50.0,
) -> guard.Verdict:
    """The regression guard's verdict on tonight's run: the history's, and when that says
    "regressed", the two builds' (tonight's and the best night's) timed in turn on a board
    under `board_key` for `cfg.confirm_rounds` rounds. Where they cannot be timed in turn
    (the best build was garbage-collected, no board answers, a VTA simulator board whose wall
    time is the host's simulation), the history's verdict stands and says why."""
    verdict = guard.check(store.root, result, cfg.max_regression_pct)
    if not verdict.regressed or cfg.confirm_rounds == 0:
        return verdict
    if target.offload == "vta":
        return replace(verdict, in_turn_error="a VTA simulator board's wall time is the host simulating, not the board")
    tonight = store.find_id(build_mod.STEP, result.tuned.build_id)
    best = store.find_id(build_mod.STEP, verdict.best_build_id)
    if tonight is None or best is None:
        gone = "tonight's build" if tonight is None else f"the build of {verdict.best_night} ({verdict.best_build_id})"
        return replace(verdict, in_turn_error=f"{gone} is no longer in the store {store.root}")
    x, _ = fetch_mod.load_reference(fetched.path)
    try:
        ms = eval_mod.time_in_turn(
            [tonight.file(build_mod.LIB), best.file(build_mod.LIB)],
            x,
            target.kind,
            tracker,
            board_key,
            cfg.confirm_rounds,
            min_repeat_ms=min_repeat_ms,
        )
    except BoardError as e:
        return replace(verdict, in_turn_error=str(e))
    return guard.confirm_in_turn(verdict, ms[0], ms[1])
