"""TopHub's measured VTA configs: what the recipe started from, and what our cycle model is fitted to.

`data/tophub_vta_v0.06.log` holds sections of tlc-pack/tophub's `tophub/vta_v0.06.log` (the file
TVM's `autotvm.tophub.context` downloaded for VTA), lines unchanged: AutoTVM-tuned knobs of
VTA's conv2d template (and group conv2d) for resnet18, resnet50 and a grouped MobileNet on a
Pynq-Z1 (1x16x16 GEMM core; resnet18 also on a 4x8x8 core), each with its latency measured on
the board in 2019. AutoTVM measured the template as VTA's tuning script builds it: the conv,
then a right shift by 8, a clip to [0, 127] and the cast to int8 (`MEASURED_EPILOGUE`).

Data, not code: the records are facts to fit and start from; their provenance is the file's
first line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .config import VTAConfig
from .conv import ConvWorkload, Epilogue, Knobs

LOG = Path(__file__).parent / "data" / "tophub_vta_v0.06.log"
# what VTA's tuning script ran after each conv it timed (vta/scripts/tune_conv2d.py, tune_relay_vta)
MEASURED_EPILOGUE = Epilogue(bias=False, shift=8, clip_min=0, clip_max=127)
# resnet18's 19 packed convs (the stem stays on the CPU): how often each workload occurs
RESNET18_COUNTS = {
    (56, 64, 64, 3, 1): 4,
    (56, 64, 128, 3, 2): 1,
    (56, 64, 128, 1, 2): 1,
    (28, 128, 128, 3, 1): 3,
    (28, 128, 256, 3, 2): 1,
    (28, 128, 256, 1, 2): 1,
    (14, 256, 256, 3, 1): 3,
    (14, 256, 512, 3, 2): 1,
    (14, 256, 512, 1, 2): 1,
    (7, 512, 512, 3, 1): 3,
}


@dataclass(frozen=True)
class TophubRecord:
    network: str  # the log's section title: "Resnet-18", "MobileNet-G", ...
    vta_model: str  # "pynq_1x16_i8w8a32_15_15_18_17": target, core, widths, log2 buffer sizes
    workload: ConvWorkload
    groups: int
    knobs: Knobs
    seconds: float  # measured on the board

    @property
    def key(self) -> tuple[int, int, int, int, int]:
        """(height, in, out, kernel, stride): how RESNET18_COUNTS names a workload."""
        w = self.workload
        return (w.height, w.in_filter, w.out_filter, w.kh, w.stride_h)


def vta_model(cfg: VTAConfig) -> str:
    """The `-model` string AutoTVM keyed a VTA config's records by (`vta.Environment.model`)."""
    return (
        f"{cfg.TARGET}_{cfg.BATCH}x{cfg.BLOCK_IN}_i{cfg.INP_WIDTH}w{cfg.WGT_WIDTH}a{cfg.ACC_WIDTH}"
        f"_{cfg.LOG_UOP_BUFF_SIZE}_{cfg.LOG_INP_BUFF_SIZE}_{cfg.LOG_WGT_BUFF_SIZE}_{cfg.LOG_ACC_BUFF_SIZE}"
    )


def config_of(model: str) -> VTAConfig:
    """The VTA config a `-model` string names (the inverse of `vta_model`)."""
    target, core, widths, *logs = model.split("_")
    batch, block = (int(x) for x in core.split("x"))
    i, rest = widths[1:].split("w")
    w, a = rest.split("a")
    log2 = {1 << n: n for n in range(8)}
    return VTAConfig(
        TARGET=target,
        LOG_BATCH=log2[batch],
        LOG_BLOCK=log2[block],
        LOG_INP_WIDTH=log2[int(i)],
        LOG_WGT_WIDTH=log2[int(w)],
        LOG_ACC_WIDTH=log2[int(a)],
        LOG_UOP_BUFF_SIZE=int(logs[0]),
        LOG_INP_BUFF_SIZE=int(logs[1]),
        LOG_WGT_BUFF_SIZE=int(logs[2]),
        LOG_ACC_BUFF_SIZE=int(logs[3]),
    )


def _knobs(entities: list) -> Knobs:
    """AutoTVM's entities: a split's last factor is the tile (the recipe's inner factor)."""
    e = {name: value for name, _kind, value in entities}
    return Knobs(
        tile_b=e["tile_b"][-1],
        tile_h=e["tile_h"][-1],
        tile_w=e["tile_w"][-1],
        tile_ci=e["tile_ci"][-1],
        tile_co=e["tile_co"][-1],
        h_nthread=e["h_nthread"],
        oc_nthread=e["oc_nthread"],
    )


def _record(network: str, line: str) -> TophubRecord:
    rec = json.loads(line)
    target, _template, _args, _kwargs, workload, config = rec["i"]
    model = target.split("-model=")[1].split()[0]
    name, data, kernel, strides, padding, _dilation, *rest = workload
    groups = rest[0] if name.startswith("group") else 1
    wl = ConvWorkload(
        batch=data[0] * data[4],
        height=data[2],
        width=data[3],
        in_filter=data[1] * data[5],
        out_filter=kernel[0] * kernel[4],
        kh=kernel[2],
        kw=kernel[3],
        pad_h=padding[0],
        pad_w=padding[1],
        stride_h=strides[0],
        stride_w=strides[1],
        groups=groups,
    )
    return TophubRecord(network, model, wl, groups, _knobs(config["e"]), float(rec["r"][0][0]))


@cache
def records() -> tuple[TophubRecord, ...]:
    """Every record of the kept sections, in the file's order."""
    out, network = [], ""
    for line in LOG.read_text().splitlines():
        if line.startswith("# tlc-pack"):
            continue
        if line.startswith("#"):
            network = line[1:].split(" - ")[0].strip()
        elif line.strip():
            out.append(_record(network, line))
    return tuple(out)


def resnet18(cfg: VTAConfig = VTAConfig()) -> list[TophubRecord]:
    """The resnet18 section for `cfg`'s VTA model: one record per workload of RESNET18_COUNTS."""
    return [r for r in records() if r.network == "Resnet-18" and r.vta_model == vta_model(cfg)]


def configs_for(wl: ConvWorkload, cfg: VTAConfig, epi: Epilogue) -> list[TophubRecord]:
    """TopHub's records of this workload on `cfg`'s VTA model whose knobs fit it with `epi` (the
    epilogue takes buffer room of its own: a residual, a bias), fastest measured first."""
    from .conv import KnobError, check

    found = []
    for r in records():
        if r.workload != wl or r.vta_model != vta_model(cfg):
            continue
        try:
            check(wl, r.knobs, epi, cfg)
        except KnobError:
            continue
        found.append(r)
    return sorted(found, key=lambda r: r.seconds)


def start_knobs(
    wl: ConvWorkload, cfg: VTAConfig, epi: Epilogue, found: list[TophubRecord] | None = None
) -> tuple[Knobs, str]:
    """Where an untuned conv starts, as AutoTVM's `tophub.context` gave the recipe: TopHub's
    fastest measured config for the workload where one fits (`found`: `configs_for`'s answer,
    where the caller has it), else the smallest legal tile (`conv.default_knobs`). With where it
    came from, for the report."""
    from .conv import default_knobs

    found = configs_for(wl, cfg, epi) if found is None else found
    if found:
        return found[0].knobs, f"TopHub vta_v0.06 {found[0].network} ({found[0].seconds * 1e3:.2f} ms measured)"
    return default_knobs(wl, cfg, epi), "untuned fallback"
