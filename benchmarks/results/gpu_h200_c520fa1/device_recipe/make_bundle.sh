#!/bin/bash
# Builds .gpu/ (ignored by git: echo /.gpu/ >> .git/info/exclude) for a GPU machine that has
# Python 3.12, PyTorch, CUDA 13 and cuda-bindings but no TVM and no package registry, and takes
# at most 64 MiB per call. TVM's compiler library alone is 247 MiB (56.7 MiB as xz), so it
# travels in a call of its own (stage1.sh unpacks it to /tmp), and the next call, made while
# the machine is still warm (30 s), brings the rest and runs the benchmark (stage2.sh):
#   call 1: carry [".gpu/c", ".gpu/scripts"]    command: bash .gpu/scripts/stage1.sh
#   call 2: carry [".gpu/rest", ".gpu/scripts"] command: set -o pipefail; BUDGET_S=500 DEADLINE_MIN=7 \
#           TRIALS=8,16 EXTRA="--retime-top 1" bash .gpu/scripts/stage2.sh 2>&1 | tee $OUT/log.txt
set -e
cd "$(git rev-parse --show-toplevel)"
W=$(mktemp -d)
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$@"; }
mkdir -p .gpu/c .gpu/rest/whl .gpu/scripts
dl "$W" apache-tvm==0.27.0.post1
dl .gpu/rest/whl apache-tvm-ffi==0.1.14.post1 pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 \
  typing-inspection==0.4.5 tornado==6.6.1 xgboost-cpu==2.1.4
(cd "$W" && unzip -q apache_tvm-*.whl && rm apache_tvm-*.whl)
xz -9e -T2 -c "$W/tvm/lib/libtvm_compiler.so" > .gpu/c/c.so.xz   # about 4 minutes on 2 cores
rm -rf "$W/tvm/lib/libtvm_compiler.so" "$W/tvm/3rdparty/cutlass" "$W/tvm/web"
tar -C "$W" -cf - . | xz -6 -T2 > .gpu/rest/tvm_py.tar.xz
cp benchmarks/results/gpu_h200_c520fa1/device_recipe/stage*.sh .gpu/scripts/
git rev-parse --short HEAD > .gpu/scripts/commit
rm -rf "$W"
du -sb .gpu/*
