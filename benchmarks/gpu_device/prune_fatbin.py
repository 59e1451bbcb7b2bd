"""Zero the GPU code of every architecture but one in a shared library's `.nv_fatbin` section.

Why: onnxruntime-gpu's CUDA provider (`libonnxruntime_providers_cuda.so`, 284 MB, 186 MB as
xz) carries cubins for sm_75, 80, 86, 89, 90 and 120; a GPU machine of this project takes 64
MiB per call. The CUDA runtime picks one entry per fat binary by the device's architecture,
so on an H100/H200 (sm_90) the others are never read. Zeroing their payloads, with every
header, offset and size left as it was, keeps the library loadable and makes those bytes
compress to nothing: 52 MB as xz for sm_90.

A fat binary is a header (magic 0xBA55ED50, version u16, header size u16, size u64) and
entries, each a header (kind u16, version u16, header size u32, padded payload size u32, ...,
SM version u32 at byte 28) and its payload. The layout is NVIDIA's, undocumented; this
script refuses a section it cannot walk from end to end.

    python3 prune_fatbin.py IN.so OUT.so --keep 90
"""

from __future__ import annotations

import argparse
import struct
import subprocess
from collections import Counter
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50


def section(path: Path, name: str = ".nv_fatbin") -> tuple[int, int]:
    """(file offset, size) of a section, read off `readelf -S -W`."""
    for line in subprocess.run(
        ["readelf", "-S", "-W", str(path)], capture_output=True, text=True, check=True
    ).stdout.splitlines():
        fields = line.replace("[ ", "[").split()
        if name in fields:
            i = fields.index(name)
            return int(fields[i + 3], 16), int(fields[i + 4], 16)
    raise SystemExit(f"{path}: no {name} section (not a CUDA library?)")


def prune(data: bytearray, start: int, size: int, keep: set[int]) -> tuple[Counter, Counter]:
    """Zero in place the payload of each entry whose SM version is not in `keep`; returns the
    bytes kept and zeroed per SM version."""
    kept, zeroed = Counter(), Counter()
    pos, end_sec = start, start + size
    while pos + 16 <= end_sec:
        magic, _version, header, body = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:  # alignment padding between fat binaries
            if any(data[pos : pos + 8]):
                raise SystemExit(f"unexpected bytes at {pos:#x}: not a fat binary header, not padding")
            pos += 8
            continue
        entry, end = pos + header, pos + header + body
        while entry < end:
            _kind, _ver, entry_header, padded = struct.unpack_from("<HHII", data, entry)
            sm = struct.unpack_from("<I", data, entry + 28)[0]
            payload = entry + entry_header
            if payload + padded > end:
                raise SystemExit(f"entry at {entry:#x} runs past its fat binary: layout not understood")
            if sm in keep:
                kept[sm] += padded
            else:
                data[payload : payload + padded] = bytes(padded)
                zeroed[sm] += padded
            entry = payload + padded
        pos = end
    if not kept:
        raise SystemExit(f"no entry for SM {sorted(keep)}: the library has none for this GPU")
    return kept, zeroed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--keep", default="90", help="SM versions to keep, comma-separated (90: H100/H200)")
    args = p.parse_args()
    data = bytearray(args.src.read_bytes())
    kept, zeroed = prune(data, *section(args.src), {int(s) for s in args.keep.split(",")})
    args.dst.write_bytes(data)
    mb = {sm: round(n / 1e6, 1) for sm, n in sorted(kept.items())}
    print(f"{args.dst}: kept {mb} MB, zeroed { ({sm: round(n / 1e6, 1) for sm, n in sorted(zeroed.items())}) } MB")


if __name__ == "__main__":
    main()
