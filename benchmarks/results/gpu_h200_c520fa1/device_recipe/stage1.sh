#!/bin/bash
# device call 1 of 2: unpack TVM's compiler library (too big to travel with the rest) into /tmp
set -x
mkdir -p /tmp/tvmlib
python3 - <<'PY'
import lzma, shutil, time
t = time.time()
with lzma.open(".gpu/c/c.so.xz") as src, open("/tmp/tvmlib/libtvm_compiler.so", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 24)
print("unpacked in", round(time.time() - t, 1), "s")
PY
ls -la /tmp/tvmlib
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
command -v nvcc; nvcc --version | tail -2; python3 -V; nproc
find /usr/local/cuda*/ /opt/torch/.venv -name 'libcudart.so.13*' 2>/dev/null | head -3
python3 -c "import onnxruntime as o; print('ort', o.__version__, o.get_available_providers())"
python3 -c "import cuda.bindings, numpy, torch; print('cuda-bindings', cuda.bindings.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)"
python3 -c "import scipy, pyarrow, matplotlib, typer, rich, psutil, filelock, cloudpickle, ml_dtypes, torchvision, onnx; print('deps ok')"
