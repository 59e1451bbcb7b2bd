"""Typed, validated configuration of a pipeline run.

Every step reads one of these small pydantic models; each field has a default and a
description (shown by `--help` and in error messages). A config file (`--config`, JSON or
TOML) holds the same fields as the CLI flags, grouped by section; unknown keys and wrong
types are rejected with the offending key named.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigError
from .vta.config import VTAConfig

BOARD_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


def board_key_problem(key: str) -> str | None:
    """What is wrong with a board key, or None. A key names the board's logs and work dirs, so
    a '/' would make it a path."""
    if BOARD_KEY.fullmatch(key):
        return None
    return (
        f"board key {key!r} is not a key: use letters, digits, '.', '_', '-' or ':' (no '/', no spaces), "
        "as the boards register it (e.g. pynq, rk3399, host)"
    )


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    source: Literal["builtin", "torchvision", "gluon", "onnx"] = Field(
        "builtin", description="Where the network comes from."
    )
    name: str = Field("tinynet", description="Model name (torchvision / Gluon model zoo / built-in).")
    path: Path | None = Field(None, description="The .onnx file, for source=onnx.")
    input_shape: tuple[int, ...] | None = Field(
        None, description="Input shape NCHW; default 1x3x224x224 (299 for inception_v3)."
    )
    input_name: str = Field("data", description="Input tensor name (ONNX / Gluon).")
    pretrained: bool = Field(False, description="Load pretrained weights (needs network access).")
    seed: int = Field(0, description="Seed of random weights and of the evaluation input.")

    @field_validator("input_shape")
    @classmethod
    def _shape(cls, v):
        if v is not None and (len(v) != 4 or any(d <= 0 for d in v)):
            raise ValueError(f"input shape must be 4 positive dims N,C,H,W, got {v}")
        return v

    @model_validator(mode="after")
    def _onnx_path(self):
        if self.source == "onnx" and self.path is None:
            raise ValueError("source 'onnx' needs a path: pass --onnx-path FILE.onnx")
        if self.source != "onnx" and self.path is not None:  # it would tune the built-in model instead
            raise ValueError(
                f"an ONNX file ({self.path}) is read only with source 'onnx', and the source is "
                f'{self.source!r}: add --source onnx (model.source = "onnx"), or drop --onnx-path'
            )
        return self

    @property
    def display_name(self) -> str:
        """What to call the model in titles: an ONNX file by its name, others by `name`
        (which keeps its default, tinynet, when the model comes from a file)."""
        return Path(self.path).stem if self.source == "onnx" and self.path else self.name


class TuneConfig(_Strict):
    trials_per_task: int = Field(16, gt=0, description="Measured trials per tuning task.")
    trials_per_batch: int = Field(8, gt=0, description="Candidates measured per search round.")
    allocation: Literal["flat", "latency"] = Field(
        "flat",
        description="How the network's budget (trials_per_task x tasks) is spread: flat = trials_per_task "
        "each; latency = half of it each, then the rest by each task's share of the network's latency after "
        "that round (best ms x weight), at most 4x the average per task (vta_pipeline.search.allocation).",
    )
    cost_model: Literal["xgb", "random"] = Field(
        "xgb",
        description="MetaSchedule cost model: xgb is one XGBoost model per target and board key, shared by "
        "all tasks and trained on every record in the store (vta_pipeline.search.cost_model); random scores at random.",
    )
    search: Literal["evolutionary", "replay-trace"] = Field("evolutionary", description="Search strategy.")
    early_stopping: int | None = Field(
        None, gt=0, description="Stop a task after this many trials without improvement."
    )
    task_filter: Literal["auto", "all", "conv2d", "packed"] = Field(
        "auto",
        description="Which extracted tasks to tune: auto = the packed conv2d tasks when the graph is "
        "packed (the VTA recipe's filter), else all.",
    )
    retime_top: int = Field(
        8,
        ge=0,
        description="After the search, measure the task's this many best records again on the board, in turn, "
        "and build with the fastest of that (vta_pipeline.search.retime: one measurement per candidate while tuning "
        "ranks them by the minute they were measured in too); 0 or 1 = build with the recorded best.",
    )
    retime_rounds: int = Field(3, gt=0, description="Rounds of the re-time; a candidate's time is its fastest round.")
    retime_within: float = Field(
        1.5,
        gt=1,
        description="Re-time only the best records recorded within this factor of the best: the host's drift "
        "moves a measurement by up to 1.4x, so a record slower than that is slower, not unlucky.",
    )
    retime_caches: Literal["warm", "flushed", "auto"] = Field(
        "warm",
        description="How the re-time runs each candidate: warm = back to back as the search times it (its weights "
        "stay in the caches); flushed = once per repeat, with its weights and output flushed from the caches first "
        "(the input stays: in a network the layer before just wrote it), as a layer runs inside a network whose "
        "weights do not fit the caches; auto = flushed on 64-bit x86 and Arm CPUs, warm elsewhere (GPUs; TVM "
        "flushes no other CPU's caches). Warm by default: flushed measured no better on resnet18 fp32 "
        "(vta_pipeline.search.retime).",
    )
    builder_timeout_s: float = Field(120.0, gt=0, description="Per-candidate build timeout.")
    seed: int = Field(0, description="Search seed.")
    session: str | None = Field(
        None,
        description="Tuning session (the nightly flow uses the night's date): each session tunes its own "
        "budget in its own records; unset = one open-ended session per workload that a bigger budget continues.",
    )
    warm_start: int = Field(
        32,
        ge=0,
        description="Seed a task's first search of a session with up to this many best records of its workload "
        "from earlier sessions (the Parquet history); 0 = cold start.",
    )

    records_library: str = Field(
        "builtin",
        description="Where a workload the store has no records of starts its search (vta_pipeline.search.records_library): "
        "'builtin' = the records shipped with the package for this CPU class, 'off', or a directory written by "
        "`vta-pipeline library export`. Its records are measured on this board first, never trusted for their "
        "time; warm_start 0 turns it off too.",
    )

    @field_validator("records_library")
    @classmethod
    def _library(cls, v):
        from .search.records_library import LibraryError, resolve  # its one check, before any tuning starts

        try:
            resolve(v)
        except LibraryError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("session")
    @classmethod
    def _session(cls, v):
        import re

        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", v):
            raise ValueError(f"session {v!r} must be a short name of letters, digits, '.', '_', '-' (e.g. 2026-11-21)")
        return v


class MeasureConfig(_Strict):
    """How candidates are timed on the board while tuning."""

    number: int = Field(5, gt=0, description="Runs averaged into one measurement.")
    repeat: int = Field(3, gt=0, description="Measurements per candidate (their mean ranks it).")
    min_repeat_ms: int = Field(
        40,
        ge=0,
        description="Minimum duration of one repeat: a kernel of microseconds is run enough times that "
        "timer and call overhead do not rank the candidates.",
    )
    timeout_s: int = Field(60, gt=0, description="RPC session timeout per measurement.")
    enable_cpu_cache_flush: bool = Field(False, description="Flush caches between runs (CPUs).")
    tracker_wait_s: float = Field(
        900.0,
        gt=0,
        description="How long tuning waits for a tracker that stopped answering (restarted, its host "
        "rebooting) before it gives up: candidates are held, not measured as failures, "
        "and go out once it lists a board under the key again. Not part of any cache key.",
    )


class EvalConfig(_Strict):
    number: int = Field(1, gt=0, description="Runs per timed repeat, at least (see min_repeat_ms).")
    repeat: int = Field(10, gt=0, description="Timed repeats (mean/std/median over these).")
    min_repeat_ms: float = Field(
        200.0,
        ge=0,
        description="Each repeat runs the network enough times to last this long, so that one repeat of a "
        "fast build is not at the mercy of the timer and one scheduler tick.",
    )
    max_seconds: float = Field(
        30.0,
        gt=0,
        description="Time budget of the timed repeats: a build slower than max_seconds / repeat per run (an "
        "untuned network) is timed fewer times, never fewer than 3.",
    )
    rtol: float = Field(1e-3, gt=0, description="Relative tolerance of the output check.")
    atol: float = Field(1e-3, gt=0, description="Absolute tolerance of the output check.")
    compare: bool = Field(
        True,
        description="On a local board of a host CPU target, time ONNX Runtime fp32 (and, for an int8 run, "
        "ORT's own int8 U8S8 QDQ) on the same model and cores in turn with the tuned build, and "
        "report ours / ORT (vta_pipeline.baseline).",
    )
    compare_rounds: int = Field(7, gt=0, description="Rounds of that timing in turn (medians of the rounds).")
    board_timeout_s: float = Field(
        300.0,
        gt=0,
        description="The longest one call to the board may take while evaluating (the session request, loading "
        "the library, one run; an upload gets 1 s more per MiB, the timing its runs' time): past it "
        "the step fails and says the board hung, where it used to wait for good. Not part of the "
        "evaluation's cache key.",
    )


class GuardConfig(_Strict):
    """The regression guard of nightly runs."""

    max_regression_pct: float = Field(
        10.0,
        ge=0,
        description="A tuned latency more than this % slower than the model's best night is a regression: "
        "the run says so and the best night's build stays current.",
    )
    confirm_rounds: int = Field(
        5,
        ge=0,
        le=100,
        description="When tonight's evaluation is past max_regression_pct, its build and the best night's are "
        "timed in turn on the board for this many rounds, and the median per-round ratio decides (one evaluation "
        "on a shared board swings more than 10%). 0: the evaluations in the history alone decide.",
    )


class QuantizeConfig(_Strict):
    """relay.quantize's options, for the int8 path (`--quantize`)."""

    enabled: bool = Field(False, description="Quantize float32 -> int8 with int32 accumulation.")
    global_scale: float = Field(8.0, gt=0, description="Bound of every activation (calibrate_mode global_scale).")
    skip_conv_layers: tuple[int, ...] | None = Field(
        None,
        description="Indices of conv2d layers kept in float. Unset: the stem (conv 0) stays float where VTA "
        "or graph pack runs the convs (VTA cannot pack its 3 input channels), and is quantized too where the CPU's "
        "blocked layout runs them (the dot product pads 3 channels to 4), as ONNX Runtime's int8 does.",
    )
    skip_dense_layer: bool = Field(
        True,
        description="Keep dense layers (matmul with constant weights: the classifier) in float, as "
        "relay.quantize did by default; false quantizes them to int8 x int8 -> int32 with a power-of-two weight "
        "scale, as ONNX Runtime's QGemm does: 4x fewer weight bytes to read per run.",
    )
    nbit_input: int = Field(8, ge=2, le=8, description="Bits of quantized activations.")
    nbit_weight: int = Field(8, ge=2, le=8, description="Bits of quantized weights.")
    dtype_activation: Literal["int32", "int8"] = Field(
        "int32",
        description="Type of activations between layers (relay's option; `--int8-activations`): int32 adds "
        "residuals in int32; int8 reads a residual add's operands as int8 at its scale (but the one accumulator its "
        "conv's epilogue adds them to), as VTA's int8 stores between kernels need (the default of --target vta-sim) "
        "and as ONNX Runtime's QLinearAdd does: on a CPU each conv then writes int8, not int32 and a requantize "
        "(mobilenet_v2 int8 x86 about 10% faster).",
    )
    weight_scale: Literal["power2"] = Field("power2", description="Weight scales are powers of two.")
    calibrate_mode: Literal["global_scale", "max", "percentile"] = Field(
        "global_scale",
        description="global_scale (the recipe) or a per-layer power-of-two scale from the calibration data.",
    )
    percentile: float = Field(99.99, gt=0, le=100, description="Percentile of |x| (calibrate_mode percentile).")
    calibration_data: Path | None = Field(
        None, description=".npz/.npy file with calibration inputs (B,C,H,W); random data when unset."
    )
    calibration_batches: int = Field(4, gt=0, description="Random calibration inputs when no data is given.")

    @field_validator("global_scale")
    @classmethod
    def _pow2(cls, v):
        import math

        if not math.log2(v).is_integer():
            raise ValueError(f"global_scale must be a power of two (VTA requantizes by shifts only), got {v}")
        return v


class PackConfig(_Strict):
    """VTA graph_pack's options (`--pack`)."""

    enabled: bool = Field(False, description="Pack the region between start and stop into VTA's blocked layout.")
    bfactor: int | None = Field(None, gt=0, description="Batch block (default: the VTA config's BATCH).")
    cfactor: int | None = Field(None, gt=0, description="Channel block (default: the VTA config's BLOCK_OUT).")
    weight_bits: int | None = Field(None, gt=0, description="Weight bits (default: the VTA config's WGT_WIDTH).")
    start_name: str = Field("nn.max_pool2d", description="Packing starts after this operator.")
    stop_name: str = Field("nn.global_avg_pool2d", description="Packing stops before this operator.")
    start_name_idx: int | None = Field(None, ge=0, description="Which occurrence of start_name (0 = first).")
    stop_name_idx: int | None = Field(
        None, ge=0, description="Which occurrence of stop_name (default: the first after the start)."
    )
    layout: Literal["vta", "x86"] = Field(
        "vta",
        description="Packed weight layout: vta (OIHW16o16i, what VTA executes) or x86 (OIHW16o4i with uint8 "
        "activations where they are non-negative: the CPU's int8 dot product, VNNI/AVX2).",
    )
    pad_channels: bool = Field(
        False,
        description="Zero-pad channel counts that cfactor does not divide up to the next multiple inside the "
        "region (values unchanged), instead of refusing them: mobilenet_v2's 24-channel layers in "
        "blocks of 16, one AVX-512 register.",
    )
    stem: bool = Field(
        False,
        description="Pack the start operator too, when it is a conv over fewer channels than cfactor (an "
        "image's 3): its input packed as one block (int8: zero-padded to 4 channels, so the stem "
        "runs on the CPU's dot product; x86 layout) and its output in the block. Start the region "
        "at the stem: --pack-start nn.conv2d; quantize it: --skip-conv-layers ''.",
    )
    depthwise_dot: bool = Field(
        False,
        description="x86 layout, blocks of 16: int8 depthwise convs whose input is non-negative take the CPU's "
        "dot product too (each kernel row padded to 4 taps, OIHW16o4w; vpermb + vpdpbusd where the "
        "CPU has AVX512-VNNI and VBMI, else the same taps on int32 lanes, a fourth of them zero).",
    )
    winograd: bool = Field(
        False,
        description="Float packed 3x3 stride-1 convs whose output is at least 14 wide run as Winograd "
        "F(4x4, 3x3): a fourth of the multiplies, weights transformed at build time; tuned in "
        "their own design space (CPU targets).",
    )
    winograd_small_below: int = Field(
        28,
        ge=0,
        description="With --winograd: convs whose output is narrower than this run as F(2x2, 3x3) "
        "instead, whose transformed weights are 16/9 of the direct conv's, not 36/9: in the "
        "network a deep conv streams them from beyond its core's L2 on every call. 0: F(4x4) "
        "everywhere.",
    )


class LayoutConfig(_Strict):
    """The CPU's blocked layout (`passes/cpu_layout`) and what rides on it, for CPU targets run
    without graph pack (`--pack`/`--vta`, which take VTA's layout instead). Unset fields follow
    the optimization level (`opt`); a field given here wins over it."""

    enabled: bool | None = Field(
        None,
        description="Every conv2d in blocked NCHW[x]c (the target's vector lanes), tuned in the packed design "
        "spaces; unset: on from O1.",
    )
    winograd: bool | None = Field(
        None,
        description="Float blocked 3x3 stride-1 convs whose output is at least 14 wide as Winograd F(4x4, 3x3) "
        "(F(2x2, 3x3) below winograd_small_below); unset: on at O2.",
    )
    winograd_small_below: int = Field(
        28, ge=0, description="Convs whose output is narrower than this take Winograd F(2x2, 3x3) instead of F(4x4)."
    )


class BoardConfig(_Strict):
    tracker: str | None = Field(
        None, description="HOST:PORT of the RPC tracker; unset = start a local board on 127.0.0.1."
    )
    key: str = Field("host", description="Device key the boards register under.")
    local_servers: int = Field(
        1,
        gt=0,
        description="rpc_server processes of the local board. More than one time candidates at the "
        "same time on the same cores, each slowing the others: keep 1 unless measuring "
        "is what you are testing.",
    )
    local_threads: int | None = Field(
        None,
        gt=0,
        description="Threads the local board runs kernels with (TVM_NUM_THREADS of its servers); "
        "default: the target's num-cores, else this machine's logical CPUs.",
    )
    max_boards: int | None = Field(None, gt=0, description="Use at most this many boards at once.")
    emulate: bool = Field(
        False,
        description="Run the local board under qemu-user: the target CPU's own TVM runtime (aarch64: "
        "rk3399-cpu), emulated on this machine, so a cross-compiled build is loaded, run and checked "
        "before it meets a board. Its timings are qemu's, marked emulated, never the board's. Set up "
        "once with `vta-pipeline board emulator-setup aarch64`.",
    )
    mismatch: Literal["refuse", "warn"] = Field(
        "refuse",
        description="A board that runs another TVM version than this host, or kernels with other than "
        "the target's num-cores threads: refuse it before any work (the run fails naming the "
        "board and the fix), or warn and measure anyway (its times hold for its threads only).",
    )

    @field_validator("tracker")
    @classmethod
    def _tracker(cls, v):
        if v is not None:
            parse_hostport(v)
        return v

    @field_validator("key")
    @classmethod
    def _key(cls, v):
        problem = board_key_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    def address(self) -> tuple[str, int] | None:
        return parse_hostport(self.tracker) if self.tracker else None


class PipelineConfig(_Strict):
    model: ModelConfig = ModelConfig()
    target: str = Field("host", description="Target preset name or TVM target JSON.")
    opt: Literal["O0", "O1", "O2"] = Field(
        "O2",
        description="Optimization preset of CPU targets (vta_pipeline.presets): O0 = TVM's generic "
        "design spaces in plain NCHW; O1 = every conv blocked (NCHW[x]c, int8 on the CPU's dot product) in the "
        "packed design spaces; O2 = O1 and Winograd for float 3x3 convs. Explicit layout.* fields override it; "
        "--pack/--vta take graph pack's layout instead.",
    )
    layout: LayoutConfig = LayoutConfig()
    tune: TuneConfig = TuneConfig()
    measure: MeasureConfig = MeasureConfig()
    evaluate: EvalConfig = EvalConfig()
    board: BoardConfig = BoardConfig()
    quantize: QuantizeConfig = QuantizeConfig()
    pack: PackConfig = PackConfig()
    vta: VTAConfig = VTAConfig()
    guard: GuardConfig = GuardConfig()
    store: Path = Field(Path("vta-store"), description="Artifact store directory.")
    min_free_gib: float = Field(
        1.0,
        ge=0,
        description="Free space (GiB) the store's filesystem must have when a run starts; below it the run stops "
        "at once and says to run `vta-pipeline store gc` (0 turns the check off).",
    )


def parse_hostport(s: str) -> tuple[str, int]:
    host, sep, port = s.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"tracker address {s!r} is not HOST:PORT (e.g. 127.0.0.1:9190)")
    return host, int(port)


def load_config_file(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        text = path.read_text()
        return tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"config file {path} is not valid {path.suffix[1:] or 'JSON'}: {e}") from e


def build_config(file_values: dict[str, Any] | None, overrides: dict[str, Any], source: str = "") -> PipelineConfig:
    """Merge a config file's sections with CLI overrides ({'tune.trials_per_task': 8, ...})."""
    data: dict[str, Any] = json.loads(json.dumps(file_values or {}, default=str))
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    _apply_preset_defaults(data)
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            lines.append(f"  {loc}: {err['msg']}" + (f" (got {err['input']!r})" if "input" in err else ""))
        where = f" in {source}" if source else ""
        raise ConfigError("invalid configuration" + where + ":\n" + "\n".join(lines)) from None


EMULATED_SLOWDOWN = 10
"""How much longer a measurement may take on an emulated board than the preset allows a real one:
qemu translates every ARM instruction into several of the host's, so a candidate that fits a
board's timeout can run past it emulated and be recorded as failed (docs/boards-and-targets.md)."""


def _apply_preset_defaults(data: dict[str, Any]) -> None:
    """The target preset's board key and config defaults (measure, quantize), for what was not given.

    An emulated local board (`board.emulate`) takes the preset's key + "-emulated": its
    records and timings are qemu's and never share a key (a work dir, a history) with real boards'.
    Its measurement timeout is the preset's times EMULATED_SLOWDOWN."""
    from .targets import preset_defaults

    spec = data.get("target", "host")
    if not isinstance(spec, str):
        return
    try:
        key, sections = preset_defaults(spec)
    except ConfigError:
        return  # resolve_target reports an unknown preset with the full list
    board = data.get("board")
    emulated = isinstance(board, dict) and bool(board.get("emulate"))
    if key is not None and isinstance(data.setdefault("board", {}), dict):
        data["board"].setdefault("key", key + ("-emulated" if emulated else ""))
    if emulated and "timeout_s" in sections.get("measure", {}):
        sections["measure"]["timeout_s"] = int(sections["measure"]["timeout_s"] * EMULATED_SLOWDOWN)
    for section, defaults in sections.items():
        if isinstance(data.setdefault(section, {}), dict):
            for k, v in defaults.items():
                data[section].setdefault(k, v)
