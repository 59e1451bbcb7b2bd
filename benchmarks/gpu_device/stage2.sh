#!/bin/bash
# device call 3 of 3: TVM and onnxruntime-gpu from /tmp/gpu_bundle (calls 1 and 2) + the carried
# rest into /tmp/site, then the benchmark. Exits 3 on a fresh machine (the bundle is gone).
R=$PWD
B=/tmp/gpu_bundle
if [ ! -s $B/libtvm_compiler.so ]; then echo "FRESH MACHINE: $B is gone"; exit 3; fi
mkdir -p /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .gpu/rest/whl/*.whl || exit 4
python3 -c "import tarfile; tarfile.open('.gpu/rest/tvm_py.tar.xz').extractall('/tmp/site')" || exit 4
cp $B/libtvm_compiler.so /tmp/site/tvm/lib/ || exit 4
if [ -s .gpu/rest/ort_py.tar.xz ] && [ -s $B/libonnxruntime_providers_cuda.so ]; then
  python3 -c "import tarfile; tarfile.open('.gpu/rest/ort_py.tar.xz').extractall('/tmp/site')" || exit 4
  cp $B/libonnxruntime_providers_cuda.so /tmp/site/onnxruntime/capi/ || exit 4
fi
export PYTHONPATH=/tmp/site:$R
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc)
export CUDA_PATH=$(dirname $(dirname $NVCC))
CUDART=$(find $CUDA_PATH/ /usr/local/cuda*/ /opt/torch/.venv -name 'libcudart.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$(dirname $CUDART):$LD_LIBRARY_PATH
export PATH=$CUDA_PATH/bin:$PATH
export VTA_PIPELINE_COMMIT=$(cat .gpu/scripts/commit)
export PYTHONUNBUFFERED=1 TVM_FFI_DISABLE_TORCH_C_DLPACK=1
echo "CUDA_PATH=$CUDA_PATH CUDART=$CUDART"
python3 -c "import tvm; d = tvm.cuda(0); print('tvm', tvm.__version__, d.exist, d.compute_version)"
python3 -c "import onnxruntime as o; print('ort', o.__version__, o.__file__, o.get_available_providers())"
timeout ${BUDGET_S:-480} python3 -m benchmarks.gpu_compare --trials ${TRIALS:-8,16,32} --deadline-min ${DEADLINE_MIN:-5} \
  --runs 200 --store /tmp/store --out $OUT/res $EXTRA
rc=$?
tar czf $OUT/logs.tgz -C /tmp/store logs work 2>/dev/null  # the board's logs and the trial logs
exit $rc
