#!/bin/bash
# Builds .gpu/ (ignored by git: echo /.gpu/ >> .git/info/exclude) for a GPU machine of this
# project: Python 3.12, PyTorch (CUDA 13), cuda-bindings, no TVM, no onnxruntime-gpu, no
# package registry, and at most 64 MiB carried per call. Three calls on one warm machine
# (it goes back after 30 s idle, so make them back to back):
#   call 1: carry [".gpu/c", ".gpu/scripts"]  command: bash .gpu/scripts/stage1.sh
#           TVM's compiler library (247 MB, 59 MB as xz) into /tmp/gpu_bundle, and the machine's facts
#   call 2: carry [".gpu/o", ".gpu/scripts"]  command: bash .gpu/scripts/unpack.sh .gpu/o
#           onnxruntime-gpu's CUDA provider, sm_90 code only (prune_fatbin.py; 52 MB as xz)
#   call 3: carry [".gpu/rest", ".gpu/scripts"] command: set -o pipefail; BUDGET_S=540 DEADLINE_MIN=7 \
#           TRIALS=8 EXTRA="--retime-top 1" bash .gpu/scripts/stage2.sh 2>&1 | tee $OUT/log.txt
# Usage: bash benchmarks/gpu_device/make_bundle.sh [tvm] [ort]   (both by default; SM=90)
set -e
cd "$(git rev-parse --show-toplevel)"
HERE=benchmarks/gpu_device
PARTS="${*:-tvm ort}"
W=$(mktemp -d)
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$@"; }
mkdir -p .gpu/c .gpu/o .gpu/rest/whl .gpu/scripts
if [[ $PARTS == *tvm* ]]; then
  dl "$W" apache-tvm==0.27.0.post1
  dl .gpu/rest/whl apache-tvm-ffi==0.1.14.post1 pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 \
    typing-inspection==0.4.5 tornado==6.6.1 xgboost-cpu==2.1.4
  (cd "$W" && unzip -q apache_tvm-*.whl && rm apache_tvm-*.whl)
  xz -9e -T2 -c "$W/tvm/lib/libtvm_compiler.so" > .gpu/c/libtvm_compiler.so.xz   # about 4 minutes on 2 cores
  rm -rf "$W/tvm/lib/libtvm_compiler.so" "$W/tvm/3rdparty/cutlass" "$W/tvm/web"
  tar -C "$W" -cf - . | xz -6 -T2 > .gpu/rest/tvm_py.tar.xz
  rm -rf "$W"/*
fi
if [[ $PARTS == *ort* ]]; then
  # 1.31.1 is built for CUDA 13 (cuBLAS 13, cuDNN 9), the libraries PyTorch cu130 brings there
  dl "$W" onnxruntime-gpu==1.31.1
  mkdir -p "$W/ort" && (cd "$W/ort" && unzip -q ../onnxruntime_gpu-*.whl)
  CUDA_SO=onnxruntime/capi/libonnxruntime_providers_cuda.so
  python3 $HERE/prune_fatbin.py "$W/ort/$CUDA_SO" "$W/cuda.so" --keep "${SM:-90}"
  xz -6 -T2 -c "$W/cuda.so" > .gpu/o/libonnxruntime_providers_cuda.so.xz
  rm "$W/ort/$CUDA_SO" "$W/ort/onnxruntime/capi/libonnxruntime_providers_tensorrt.so"
  tar -C "$W/ort" -cf - . | xz -6 -T2 > .gpu/rest/ort_py.tar.xz
fi
cp $HERE/stage1.sh $HERE/unpack.sh $HERE/stage2.sh .gpu/scripts/
git rev-parse --short HEAD > .gpu/scripts/commit
rm -rf "$W"
du -sb .gpu/*/*
