#!/bin/bash
# Unpacks every DIR/*.xz carried to this machine into /tmp/gpu_bundle (kept while the machine
# stays warm), for stage2.sh to install.
set -e
mkdir -p /tmp/gpu_bundle
for f in "$1"/*.xz; do
  python3 - "$f" <<'PY'
import lzma, shutil, sys, time
from pathlib import Path
src = Path(sys.argv[1]); dst = Path("/tmp/gpu_bundle") / src.name[:-3]; t = time.time()
with lzma.open(src) as i, open(dst, "wb") as o:
    shutil.copyfileobj(i, o, 1 << 24)
print(f"{dst}: {dst.stat().st_size} bytes in {time.time() - t:.1f} s")
PY
done
