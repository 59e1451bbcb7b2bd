"""The VTA hardware configuration, equal in content to VTA's `vta_config.json`.

Graph packing reads its block sizes from here (BATCH, BLOCK_IN, BLOCK_OUT, the weight
width), so a user with a differently sized VTA points `--vta-config` at their
`vta_config.json` and gets matching packed tasks. Everything is stored as log2, as VTA
does; the derived sizes are properties.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError


class VTAConfig(BaseModel):
    """VTA's hardware parameters (defaults: the Pynq-Z1 configuration, 1x16x16 GEMM core)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    TARGET: str = Field("pynq", description="VTA target: pynq, de10nano, ultra96, sim, tsim, ...")
    HW_VER: str = Field("0.0.2", description="Hardware version.")
    LOG_INP_WIDTH: int = Field(3, ge=0, le=5, description="log2 of the input (activation) width in bits.")
    LOG_WGT_WIDTH: int = Field(3, ge=0, le=5, description="log2 of the weight width in bits.")
    LOG_ACC_WIDTH: int = Field(5, ge=0, le=6, description="log2 of the accumulator width in bits.")
    LOG_BATCH: int = Field(0, ge=0, le=4, description="log2 of the GEMM core's batch.")
    LOG_BLOCK: int = Field(4, ge=0, le=6, description="log2 of the GEMM core's block (BLOCK_IN = BLOCK_OUT).")
    LOG_UOP_BUFF_SIZE: int = Field(15, ge=0, description="log2 of the micro-op buffer size in bytes.")
    LOG_INP_BUFF_SIZE: int = Field(15, ge=0, description="log2 of the input buffer size in bytes.")
    LOG_WGT_BUFF_SIZE: int = Field(18, ge=0, description="log2 of the weight buffer size in bytes.")
    LOG_ACC_BUFF_SIZE: int = Field(17, ge=0, description="log2 of the accumulator buffer size in bytes.")

    @property
    def BATCH(self) -> int:  # noqa: N802  (VTA's names)
        return 1 << self.LOG_BATCH

    @property
    def BLOCK_IN(self) -> int:  # noqa: N802
        return 1 << self.LOG_BLOCK

    @property
    def BLOCK_OUT(self) -> int:  # noqa: N802
        return 1 << self.LOG_BLOCK

    @property
    def INP_WIDTH(self) -> int:  # noqa: N802
        return 1 << self.LOG_INP_WIDTH

    @property
    def WGT_WIDTH(self) -> int:  # noqa: N802
        return 1 << self.LOG_WGT_WIDTH

    @property
    def ACC_WIDTH(self) -> int:  # noqa: N802
        return 1 << self.LOG_ACC_WIDTH

    @property
    def UOP_BUFF_SIZE(self) -> int:  # noqa: N802
        return 1 << self.LOG_UOP_BUFF_SIZE

    @property
    def INP_BUFF_SIZE(self) -> int:  # noqa: N802
        return 1 << self.LOG_INP_BUFF_SIZE

    @property
    def WGT_BUFF_SIZE(self) -> int:  # noqa: N802
        return 1 << self.LOG_WGT_BUFF_SIZE

    @property
    def ACC_BUFF_SIZE(self) -> int:  # noqa: N802
        return 1 << self.LOG_ACC_BUFF_SIZE

    def derived(self) -> dict[str, int]:
        names = ("BATCH", "BLOCK_IN", "BLOCK_OUT", "INP_WIDTH", "WGT_WIDTH", "ACC_WIDTH",
                 "UOP_BUFF_SIZE", "INP_BUFF_SIZE", "WGT_BUFF_SIZE", "ACC_BUFF_SIZE")  # fmt: skip
        return {n: getattr(self, n) for n in names}

    @classmethod
    def load(cls, path: Path) -> "VTAConfig":
        """Read a `vta_config.json`; errors name the file and the offending key."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"VTA config file {path} does not exist")
        try:
            data = json.loads(path.read_text())
        except ValueError as e:
            raise ConfigError(f"VTA config file {path} is not valid JSON: {e}") from None
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            lines = [f"  {'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
            raise ConfigError(f"invalid VTA config {path}:\n" + "\n".join(lines)) from None
