"""Throwaway: a tuned build with each task's recorded best vs with its re-timed winner, timed
in turn with ONNX Runtime fp32 in this process."""
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torchvision
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from vta_pipeline import int8_dot
from vta_pipeline.records import keeps_default, open_db
from vta_pipeline.relax_pipeline import prepack_weights

steps = Path(sys.argv[1]) / "pipeline" / "steps"
build_dir, model, rounds = Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
by_id = {json.loads(m.read_text())["artifact_id"]: m.parent for m in steps.glob("*/*/manifest.json")}
man = json.loads((build_dir / "manifest.json").read_text())
ext, best = by_id[man["inputs"]["tasks"]], by_id[man["inputs"]["best"]]
target = tvm.target.Target(man["config"]["target"])
tune_dirs = [by_id[i] for i in json.loads((best / "manifest.json").read_text())["inputs"]["tuned"]]
plain = Path("/work/exp/db_recorded")
shutil.rmtree(plain, ignore_errors=True)
plain.mkdir()
int8_dot.register()
merged = ms.database.JSONDatabase(work_dir=str(plain))
for d in tune_dirs:
    if not keeps_default(json.loads((d / "summary.json").read_text())):
        open_db(d).dump_pruned(merged)
int8_dot.register()
dev = tvm.cpu()
vms = {}
for name, db_dir in (("recorded", plain), ("retimed", best)):
    mod = tvm.ir.load_json((ext / "lowered.json").read_text())
    with target, open_db(db_dir):
        mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
    mod = prepack_weights(mod)
    p = f"/work/exp/ab_{name}.so"
    relax.build(mod, target=target).export_library(p)
    vms[name] = relax.VirtualMachine(tvm.runtime.load_module(p), dev)
torch.manual_seed(0)
net = getattr(torchvision.models, model)(weights=None).eval()
x_np = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("float32")
torch.onnx.export(net, (torch.from_numpy(x_np),), "/work/exp/ab.onnx", input_names=["data"], output_names=["out"],
                  opset_version=17, dynamo=False)
opts = ort.SessionOptions()
opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
sess = ort.InferenceSession("/work/exp/ab.onnx", opts, providers=["CPUExecutionProvider"])
x = tvm.runtime.tensor(x_np, dev)


def ort_min():
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20):
            sess.run(None, {"data": x_np})
        ts.append((time.perf_counter() - t0) / 20)
    return min(ts) * 1e3


res = {"recorded": [], "retimed": [], "ort": []}
for _ in range(rounds):
    for name, vm in vms.items():
        res[name].append(min(vm.time_evaluator("main", dev, number=20, repeat=5)(x).results) * 1e3)
        time.sleep(0.5)
    res["ort"].append(ort_min())
    time.sleep(0.5)
for k, v in res.items():
    print(f"{k:9s} median {np.median(v):.3f} min {min(v):.3f}", [round(a, 3) for a in v])
for k in ("recorded", "retimed"):
    r = [a / o for a, o in zip(res[k], res["ort"])]
    print(f"{k} / ORT per round: median {np.median(r):.3f}", [round(a, 3) for a in r])
w = sum(a < b for a, b in zip(res["retimed"], res["recorded"]))
print(f"retimed faster than recorded in {w} of {rounds} rounds")
