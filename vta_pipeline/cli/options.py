"""The option types the commands share: one `Annotated[...]` per flag, so that a flag has the same
name and help text in every command that takes it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

ConfigOpt = Annotated[
    Optional[Path], typer.Option("--config", help="JSON/TOML file with the same fields as the flags.")
]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Model name (default: built-in tinynet).")]
SourceOpt = Annotated[Optional[str], typer.Option("--source", help="builtin | torchvision | gluon | onnx")]
OnnxOpt = Annotated[Optional[Path], typer.Option("--onnx-path", help="The .onnx file (source onnx).")]
ShapeOpt = Annotated[Optional[str], typer.Option("--input-shape", help="N,C,H,W (default by model).")]
TargetOpt = Annotated[Optional[str], typer.Option("--target", help="Preset name or TVM target JSON (default: host).")]
TrackerOpt = Annotated[
    Optional[str], typer.Option("--tracker", help="HOST:PORT of an RPC tracker (default: local board).")
]
KeyOpt = Annotated[Optional[str], typer.Option("--key", help="Board key under the tracker.")]
StoreOpt = Annotated[Optional[Path], typer.Option("--store", help="Artifact store directory.")]
# the int8 VTA path: quantize + graph pack
VtaOpt = Annotated[
    bool, typer.Option("--vta", help="Quantize + pack with the recipe's defaults; tune the packed convs.")
]
VtaConfigOpt = Annotated[Optional[Path], typer.Option("--vta-config", help="VTA's vta_config.json (block sizes).")]
QuantizeOpt = Annotated[Optional[bool], typer.Option("--quantize/--no-quantize", help="int8 quantization.")]
GlobalScaleOpt = Annotated[Optional[float], typer.Option(help="Activation bound (power of two).")]
SkipConvOpt = Annotated[
    Optional[str],
    typer.Option(
        help="conv2d indices kept float, e.g. 0 or 0,5 ('' = none). Default: the stem for VTA and graph pack, none on the CPU's blocked layout."
    ),
]
CalibModeOpt = Annotated[Optional[str], typer.Option(help="global_scale | max | percentile")]
CalibDataOpt = Annotated[Optional[Path], typer.Option(help=".npy/.npz calibration inputs (B,C,H,W).")]
PackOpt = Annotated[Optional[bool], typer.Option("--pack/--no-pack", help="VTA graph pack.")]
PackStartOpt = Annotated[Optional[str], typer.Option(help="Operator packing starts after (nn.max_pool2d).")]
PackStopOpt = Annotated[Optional[str], typer.Option(help="Operator packing stops before (nn.global_avg_pool2d).")]
PackStartIdxOpt = Annotated[Optional[int], typer.Option(help="Which occurrence of --pack-start (0 = first).")]
PackStopIdxOpt = Annotated[Optional[int], typer.Option(help="Which occurrence of --pack-stop.")]
BfactorOpt = Annotated[Optional[int], typer.Option(help="Batch block (default: VTA BATCH).")]
CfactorOpt = Annotated[Optional[int], typer.Option(help="Channel block (default: VTA BLOCK_OUT).")]
PackLayoutOpt = Annotated[
    Optional[str],
    typer.Option(
        help="Packed weights: vta (OIHW16o16i, VTA's) | x86 (OIHW16o4i + uint8 activations: the CPU's int8 dot product)."
    ),
]
QuantizeDenseOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--quantize-dense/--float-dense",
        help="Quantize dense layers (the classifier) to int8 too, as ONNX Runtime's QGemm does (default: float).",
    ),
]
Int8ActivationsOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--int8-activations/--int32-activations",
        help="Activations between layers in int8 (residual adds read int8, as ONNX Runtime's QLinearAdd; each conv "
        "writes int8: half the bytes) or int32 (relay's default, except --target vta-sim).",
    ),
]
PadChannelsOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--pad-channels/--no-pad-channels",
        help="Zero-pad channel counts --cfactor does not divide (values unchanged) instead of refusing them.",
    ),
]
PackStemOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--pack-stem/--no-pack-stem",
        help="Pack the start conv too (its image as one channel block; int8: padded to 4, on the CPU's dot product).",
    ),
]
DepthwiseDotOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--depthwise-dot/--no-depthwise-dot",
        help="x86 layout: int8 depthwise convs on the CPU's dot product too (kernel rows padded to 4 taps; "
        "vpermb + vpdpbusd with AVX512-VNNI and VBMI).",
    ),
]
WinogradOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--winograd/--no-winograd",
        help="Float packed 3x3 stride-1 convs (output at least 14 wide) as Winograd F(4x4, 3x3): a fourth of the "
        "multiplies; F(2x2, 3x3) below 28 wide (--winograd-small-below).",
    ),
]
WinogradSmallBelowOpt = Annotated[
    Optional[int],
    typer.Option(
        "--winograd-small-below",
        min=0,
        help="With --winograd: convs whose output is narrower than this run as F(2x2, 3x3), whose transformed weights "
        "are 16/9 of the direct conv's, not 36/9 (default 28; 0: F(4x4, 3x3) everywhere).",
    ),
]
# the optimization preset of CPU targets (vta_pipeline.cpu_layout)
OptLevelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--opt",
        help="O0 (TVM's generic spaces, plain NCHW) | O1 (every conv blocked NCHW[x]c in our packed spaces; "
        "int8 on the CPU's dot product) | O2 (O1 and Winograd for float 3x3 convs; the default).",
    ),
]
BlockedOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--blocked/--no-blocked", help="Override the preset: every conv in the CPU's blocked layout, or none."
    ),
]
# the history sub-commands' --json
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON rows instead of a table.")]
