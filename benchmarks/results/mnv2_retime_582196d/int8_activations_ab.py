"""Throwaway: two int8 builds of mobilenet_v2 (int32 vs int8 activations between layers) in turn with ORT int8."""
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import tvm
from tvm import relax

sys.path.insert(0, "/work/main/benchmarks")
from compare import ort_quantize, torch_model  # noqa: E402

a, b, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
shape = (1, 3, 224, 224)
net = torch_model("mobilenet_v2", 0)
x_np = np.random.default_rng(0).standard_normal(shape).astype("float32")
w = Path("/work/exp/ort8")
w.mkdir(exist_ok=True)
torch.onnx.export(net, (torch.from_numpy(x_np),), str(w / "m.onnx"), input_names=["data"], output_names=["out"],
                  opset_version=17, dynamo=False)
ort_quantize(w / "m.onnx", w / "m.u8s8.onnx", shape, 1)
opts = ort.SessionOptions()
opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
sess = ort.InferenceSession(str(w / "m.u8s8.onnx"), opts, providers=["CPUExecutionProvider"])
dev = tvm.cpu()
vms = {"int32 act": relax.VirtualMachine(tvm.runtime.load_module(a), dev),
       "int8 act": relax.VirtualMachine(tvm.runtime.load_module(b), dev)}
x = tvm.runtime.tensor(x_np, dev)


def ort_min():
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20):
            sess.run(None, {"data": x_np})
        ts.append((time.perf_counter() - t0) / 20)
    return min(ts) * 1e3


res = {k: [] for k in (*vms, "ORT int8")}
for _ in range(rounds):
    for k, vm in vms.items():
        res[k].append(min(vm.time_evaluator("main", dev, number=20, repeat=5)(x).results) * 1e3)
        time.sleep(0.5)
    res["ORT int8"].append(ort_min())
    time.sleep(0.5)
for k, v in res.items():
    print(f"{k:10s} median {np.median(v):.3f} min {min(v):.3f}", [round(t, 3) for t in v])
for k in vms:
    r = [t / o for t, o in zip(res[k], res["ORT int8"])]
    print(f"{k} / ORT int8 per round: median {np.median(r):.3f}", [round(t, 3) for t in r])
