"""The command line's config flags, in one table: each flag names the config field it sets (a
dotted path into `PipelineConfig`) and takes its help from that field's description, so that a
flag is written once, says what the config file's key says, and cannot drift from it.

A command takes them with `@config_flags(group, ...)`: its signature gets one keyword option per
flag of those groups (shown under the group's panel in `--help`), and the command receives the
values the user gave as `overrides` (dotted path -> value) for `config.build_config`. A flag
the user did not give is absent, so the config file's value or the field's default holds.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Optional

import typer
from pydantic import BaseModel

from vta_pipeline.cli.common import _fail, _guard
from vta_pipeline.config import PipelineConfig

PANELS = {
    "model": "The model",
    "target": "Target and store",
    "board": "Boards",
    "tune": "Tuning",
    "measure": "Measuring",
    "evaluate": "Evaluation",
    "guard": "Regression guard",
    "int8": "int8: quantize and graph pack",
    "opt": "Optimization preset (CPU targets)",
}


def _ints(flag: str, example: str) -> Callable[[str], list[int]]:
    def parse(s: str) -> list[int]:
        try:
            return [int(x) for x in s.replace("x", ",").split(",") if x.strip()]
        except ValueError:
            _fail(f"{flag} {s!r} is not a comma-separated list of integers (e.g. {example})")

    return parse


def _opt_level(s: str) -> str:
    if s.upper() not in ("O0", "O1", "O2"):
        _fail(
            f"--opt {s!r}: use O0 (TVM's generic spaces, plain NCHW), O1 (every conv blocked, packed spaces) "
            "or O2 (O1 and Winograd; the default)"
        )
    return s.upper()


@dataclass(frozen=True)
class Flag:
    """One config flag: `--name` (or `decls`) sets the config field(s) at `paths`."""

    name: str  # the parameter's name; the flag is --name with dashes unless `decls` says
    paths: tuple[str, ...]  # the config fields it sets (a flag that sets one field in two sections names both)
    group: str
    decls: tuple[str, ...] = ()  # e.g. ("--quantize/--no-quantize",)
    type: Any = None  # what the command line parses, where it is not the field's own type
    convert: Callable[[Any], Any] | None = None  # the parsed value -> the config value
    help: str | None = None  # the flag's own words where it does not set its field as is ("{field}": the field's)
    min: int | None = None

    def field_help(self) -> str:
        """The field's description, then its choices and its default (the config's, so that
        `--help` says what an unset flag means)."""
        field = _field(self.paths[0])
        text = field.description or ""
        if self.help:
            text = self.help.replace("{field}", text)
        t = _strip_none(field.annotation)
        if typing.get_origin(t) is Literal:
            text += " One of: " + " | ".join(map(str, typing.get_args(t))) + "."
        if field.default is not None and not self.help and not isinstance(field.default, BaseModel):
            default = str(field.default).lower() if isinstance(field.default, bool) else field.default
            text += f" Default: {default}."
        return text

    def cli_type(self) -> Any:
        if self.type is not None:
            return self.type
        t = _strip_none(_field(self.paths[0]).annotation)
        if typing.get_origin(t) is Literal:
            return str  # the config's validation names the choices
        return t

    def parameter(self) -> inspect.Parameter:
        t = self.cli_type()
        decls = self.decls or ((f"--{self.name.replace('_', '-')}",) if t is not bool else ())
        if t is bool and not decls:
            dashed = self.name.replace("_", "-")
            decls = (f"--{dashed}/--no-{dashed}",)
        option = typer.Option(*decls, help=self.field_help(), min=self.min, rich_help_panel=PANELS[self.group])
        return inspect.Parameter(
            self.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[Optional[t], option]
        )

    def overrides(self, value: Any) -> dict[str, Any]:
        v = self.convert(value) if self.convert else str(value) if isinstance(value, Path) else value
        return {p: v for p in self.paths}


def _strip_none(t: Any) -> Any:
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return args[0] if typing.get_origin(t) in (typing.Union, types.UnionType) else t


@functools.cache
def _field(path: str):
    model: type[BaseModel] = PipelineConfig
    *sections, name = path.split(".")
    for s in sections:
        model = model.model_fields[s].annotation
    return model.model_fields[name]


def _flag(name: str, path: str, group: str, **kw: Any) -> Flag:
    return Flag(name, (path,), group, **kw)


FLAGS: list[Flag] = [
    _flag("model", "model.name", "model", decls=("--model",)),
    _flag("source", "model.source", "model"),
    _flag("onnx_path", "model.path", "model"),
    _flag("input_shape", "model.input_shape", "model", type=str, convert=_ints("--input-shape", "1,3,224,224")),
    _flag("pretrained", "model.pretrained", "model", decls=("--pretrained/--random-weights",)),
    _flag("target", "target", "target"),
    _flag("store", "store", "target"),
    _flag("tracker", "board.tracker", "board"),
    _flag("key", "board.key", "board"),
    _flag("local_servers", "board.local_servers", "board"),
    _flag("local_threads", "board.local_threads", "board"),
    _flag("emulate", "board.emulate", "board", decls=("--emulate",)),
    _flag("trials_per_task", "tune.trials_per_task", "tune"),
    _flag("trials_per_batch", "tune.trials_per_batch", "tune"),
    _flag("allocation", "tune.allocation", "tune"),
    _flag("cost_model", "tune.cost_model", "tune"),
    _flag("search", "tune.search", "tune"),
    _flag("early_stopping", "tune.early_stopping", "tune"),
    _flag("task_filter", "tune.task_filter", "tune"),
    _flag("retime_caches", "tune.retime_caches", "tune"),
    _flag("session", "tune.session", "tune"),
    _flag("warm_start", "tune.warm_start", "tune"),
    _flag("records_library", "tune.records_library", "tune"),
    _flag("number", "measure.number", "measure"),
    _flag("repeat", "measure.repeat", "measure"),
    _flag("timeout", "measure.timeout_s", "measure"),
    _flag("eval_repeat", "evaluate.repeat", "evaluate"),
    _flag("compare", "evaluate.compare", "evaluate"),
    _flag("max_regression_pct", "guard.max_regression_pct", "guard"),
    _flag("confirm_rounds", "guard.confirm_rounds", "guard"),
    # int8: --vta and --vta-config are handled in `overrides` (they set whole sections)
    _flag("quantize", "quantize.enabled", "int8", decls=("--quantize/--no-quantize",)),
    _flag("global_scale", "quantize.global_scale", "int8"),
    _flag(
        "skip_conv_layers",
        "quantize.skip_conv_layers",
        "int8",
        type=str,
        convert=_ints("--skip-conv-layers", "0 or 0,5; '' for none"),
    ),
    _flag("calibrate_mode", "quantize.calibrate_mode", "int8"),
    _flag("calibration_data", "quantize.calibration_data", "int8"),
    _flag(
        "quantize_dense",
        "quantize.skip_dense_layer",
        "int8",
        decls=("--quantize-dense/--float-dense",),
        convert=lambda v: not v,
        help="Quantize dense layers (the classifier) to int8 too, as ONNX Runtime's QGemm does; the config's "
        "quantize.skip_dense_layer, inverted (default: float).",
    ),
    _flag(
        "int8_activations",
        "quantize.dtype_activation",
        "int8",
        type=bool,
        decls=("--int8-activations/--int32-activations",),
        convert=lambda v: "int8" if v else "int32",
        help="Activations between layers in int8 or int32 (the config's quantize.dtype_activation): {field}",
    ),
    _flag("pack", "pack.enabled", "int8", decls=("--pack/--no-pack",)),
    _flag("pack_start", "pack.start_name", "int8"),
    _flag("pack_stop", "pack.stop_name", "int8"),
    _flag("pack_start_idx", "pack.start_name_idx", "int8"),
    _flag("pack_stop_idx", "pack.stop_name_idx", "int8"),
    _flag("bfactor", "pack.bfactor", "int8"),
    _flag("cfactor", "pack.cfactor", "int8"),
    _flag("pack_layout", "pack.layout", "int8"),
    _flag("pad_channels", "pack.pad_channels", "int8"),
    _flag("pack_stem", "pack.stem", "int8"),
    _flag("depthwise_dot", "pack.depthwise_dot", "int8"),
    # the optimization preset; --winograd sets graph pack's and the CPU layout's switch alike
    _flag("opt", "opt", "opt", convert=_opt_level),
    _flag("blocked", "layout.enabled", "opt"),
    Flag("winograd", ("pack.winograd", "layout.winograd"), "opt"),
    Flag("winograd_small_below", ("pack.winograd_small_below", "layout.winograd_small_below"), "opt", min=0),
]
_BY_NAME = {f.name: f for f in FLAGS}
# --vta and --vta-config set whole sections (`overrides` says how): name -> (type, default, declarations, help)
_SPECIAL: dict[str, tuple[Any, Any, tuple[str, ...], str]] = {
    "vta": (
        bool,
        False,
        ("--vta",),
        "Quantize + graph pack with the recipe's defaults and tune the packed convs: --quantize and --pack "
        "(an explicit --no-quantize / --no-pack still wins).",
    ),
    "vta_config": (Optional[Path], None, (), "VTA's vta_config.json (block sizes): the config's `vta` section."),
}


def _special_parameters(names: set[str]) -> list[inspect.Parameter]:
    return [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=default,
            annotation=Annotated[t, typer.Option(*decls, help=text, rich_help_panel=PANELS["int8"])],
        )
        for name, (t, default, decls, text) in _SPECIAL.items()
        if name in names
    ]


def select(groups: tuple[str, ...], exclude: tuple[str, ...] = ()) -> list[Flag]:
    """The flags of `groups` (group names, or single flag names), in the table's order."""
    unknown = [g for g in groups if g not in PANELS and g not in _BY_NAME]
    if unknown:
        raise ValueError(f"no flag group or flag {unknown}")
    return [f for f in FLAGS if (f.group in groups or f.name in groups) and f.name not in exclude]


def overrides(flags: list[Flag], values: dict[str, Any]) -> dict[str, Any]:
    """The config overrides of the flags given (`values`: parameter name -> parsed value or None)."""
    out: dict[str, Any] = {}
    for f in flags:
        if values.get(f.name) is not None:
            out.update(f.overrides(values[f.name]))
    if values.get("vta"):  # both steps on, unless a flag of their own said otherwise
        out.setdefault("quantize.enabled", True)
        out.setdefault("pack.enabled", True)
    if values.get("vta_config") is not None:
        from vta_pipeline.vta.config import VTAConfig

        out["vta"] = _guard(lambda: VTAConfig.load(values["vta_config"])).model_dump()
    return out


def config_flags(*groups: str, exclude: tuple[str, ...] = ()):
    """Give a command the config flags of `groups` (see PANELS; "int8" includes --vta and
    --vta-config); it receives the values given as `overrides` (dotted path -> value)."""
    flags = select(groups, exclude)
    specials = set(_SPECIAL) - set(exclude) if "int8" in groups else set()

    def wrap(command):
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "overrides"]
        params = own + [f.parameter() for f in flags] + _special_parameters(specials)

        @functools.wraps(command)
        def run(**kwargs: Any):
            given = {p.name: kwargs.pop(p.name) for p in params[len(own) :]}
            return command(**kwargs, overrides=overrides(flags, given))

        run.__signature__ = inspect.Signature(params)
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return wrap
