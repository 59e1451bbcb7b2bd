#!/bin/bash
# device call 1 of 3: TVM's compiler library into /tmp/gpu_bundle, and what the machine has
set -x
bash "$(dirname "$0")/unpack.sh" .gpu/c
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
command -v nvcc; nvcc --version | tail -2; python3 -V; nproc
python3 -c "import onnxruntime as o; print('ort', o.__version__, o.get_available_providers())"
python3 -c "import cuda.bindings, numpy, torch; print('cuda-bindings', cuda.bindings.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)"
python3 -c "import scipy, pyarrow, matplotlib, typer, rich, psutil, filelock, cloudpickle, ml_dtypes, torchvision, onnx, flatbuffers, sympy; print('deps ok')"
