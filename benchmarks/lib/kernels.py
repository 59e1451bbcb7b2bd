"""Single convs and their kernels inside a network: ours (from a store's tuned tasks) and ONNX
Runtime's, timed alternately or profiled, and matched to each other by conv shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.lib.timing import stats, timed

# Both engines' thread pools spin-wait for the next job after each one; timed alternately in
# one process, each engine's spinning threads took the cores from the other (our kernels
# measured 3-4x slower than in tuning). Neither spins here.
SPIN = {"TVM_THREAD_POOL_SPIN_COUNT": "0"}


def ort_session(model, threads: int, profile: Path | None = None):
    """An ONNX Runtime session of `model` (an ONNX ModelProto or a file path) on `threads`
    threads, all graph optimizations on, its thread pool not spinning (see SPIN); with ORT's
    profiler writing to files named `profile`* when given."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile is not None:
        opts.enable_profiling, opts.profile_file_prefix = True, str(profile)
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def conv_model(n: int, h: int, w: int, c: int, oc: int, kh: int, kw: int, ph: int, pw: int, sh: int, sw: int):
    """A one-conv ONNX model (bias, ReLU) of a task's workload, and its input."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((oc, c, kh, kw)) * 0.05).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(oc).astype(np.float32), "b")
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    graph = helper.make_graph(
        [
            helper.make_node(
                "Conv", ["x", "w", "b"], ["y"], kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, ph, pw]
            ),
            helper.make_node("Relu", ["y"], ["z"]),
        ],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [n, oc, oh, ow])],
        [weight, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, rng.standard_normal((n, c, h, w)).astype(np.float32), 2.0 * n * oc * oh * ow * c * kh * kw


def tuned_tasks(run: Path, store: Path, what: str) -> list[dict[str, Any]]:
    """The run's conv tasks of `what` (a key of its where_the_time_goes), each with its conv
    workload, its TIR file and its tuning work dir, read from the store that tuned them."""
    res = json.loads((run / "compare.json").read_text())
    tasks = res["where_the_time_goes"][what]
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((store / "pipeline" / "steps" / "extract").glob("*/tasks.json")):
        for t in json.loads(path.read_text()):
            if t.get("workload") and t["op"] in ("packed_conv2d", "packed_conv2d_winograd", "conv2d"):
                dirs = sorted((store / "pipeline" / "work" / "tune").glob(f"*/{t['workload_hash']}"))
                if dirs:
                    found.setdefault(
                        t["name"],
                        {"workload": t["workload"], "tir": str(path.parent / t["file"]), "work_dir": str(dirs[0])},
                    )
    return [{**t, **found[t["task"]]} for t in tasks if t["task"] in found]


class Kernel:
    """One schedule of a conv task built for `target`, with its arguments (weights in the tuned
    layout, as the network's build pre-packs them): call it to run it once."""

    def __init__(self, sch, target) -> None:
        import tvm
        from tvm.s_tir import meta_schedule as ms

        from vta_pipeline.boards.builder import fast_build

        self.lib = fast_build(sch.mod, target, None)
        self.name = sch.mod.get_global_vars()[0].name_hint
        rewritten = tvm.s_tir.transform.RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(sch.mod)
        rng = np.random.default_rng(0)
        self.args = [
            tvm.runtime.tensor(rng.random([int(d) for d in a.shape]).astype(str(a.dtype)), tvm.cpu())
            for a in ms.arg_info.ArgInfo.from_prim_func(rewritten[self.name])
        ]
        self.fn = self.lib[self.name]

    def __call__(self) -> Any:
        return self.fn(*self.args)

    def hot_ms(self) -> float:
        """As the tuner times a candidate: back to back, best of 3 x 10 runs."""
        import tvm

        return self.lib.time_evaluator(self.name, tvm.cpu(), number=10, repeat=3)(*self.args).min * 1e3

    def cold_ms(self) -> float:
        """Each run with its weights and output flushed from every cache level first (the
        input stays: in a network the layer before just wrote it); median of 40."""
        import tvm

        return (
            self.lib.time_evaluator(
                self.name, tvm.cpu(), number=1, repeat=40, f_preproc="cache_flush_cpu_non_first_arg"
            )(*self.args).median
            * 1e3
        )


def kept_record(task: dict[str, Any]):
    """The task's workload, its tuning database, and the best record the search kept there
    applied to the workload (a Schedule): what the tuner measured and the build used."""
    import tvm
    from tvm.s_tir import Schedule

    from vta_pipeline.search.database import open_database

    workload = tvm.ir.load_json(Path(task["tir"]).read_text())
    db = open_database(task["work_dir"])
    (best,) = db.get_top_k(db.commit_workload(workload), 1)
    sch = Schedule(workload)
    best.trace.apply_to_schedule(sch, remove_postproc=False)
    return workload, db, best, sch


def alternating(fns: dict[str, Callable[[], Any]], runs: int) -> dict[str, float]:
    """Median ms of each function over `runs` runs, the functions run in turn (one run each,
    then again): on this host a block of runs of one engine and then a block of the other
    measured the same pair from 0.72x to 1.60x apart within minutes."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        timed(fn, 0)  # timed's 3 warm-up runs, nothing timed
    for _ in range(runs):
        for k, fn in fns.items():
            times[k] += timed(fn, 1, warmup=0)
    return {k: stats(v)["median_ms"] for k, v in times.items()}


class InstrumentedVM:
    """Our built network in a Relax VM whose instrument hook times each function it calls
    (kernels and VM builtins) around the call: `run()` runs the network once and returns
    {function: (seconds, calls)} of that run. The hook's own Python round trip adds a few
    microseconds to every call, so the sum is a little above the network's latency."""

    def __init__(self, lib: Path) -> None:
        import time

        import tvm
        from tvm import relax

        self.vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
        self.x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))
        self.calls: dict[str, tuple[float, int]] = {}
        started = [0.0]

        def hook(func, name, before_run, ret, *args):
            if before_run:
                started[0] = time.perf_counter()
            else:
                sec, n = self.calls.get(name, (0.0, 0))
                self.calls[name] = (sec + time.perf_counter() - started[0], n + 1)
            return 0  # relax.VMInstrumentReturnKind.NO_OP

        for _ in range(3):
            self.vm["main"](self.x)
        self.vm.set_instrument(hook)

    def run(self) -> dict[str, tuple[float, int]]:
        self.calls = {}
        self.vm["main"](self.x)
        return self.calls


def conv_key(h: int, w: int, c: int, oc: int, kh: int, kw: int, sh: int, residual: bool) -> str:
    """A conv's identity across both engines: its input size, channels, window, stride and
    whether a residual add is fused into it (ORT's Sum input, our task's second add)."""
    return f"{h}x{w}x{c}->{oc} {kh}x{kw}/{sh}{'+res' if residual else ''}"


def ort_conv_key(args: dict[str, Any]) -> str | None:
    """`conv_key` of a profiled ORT Conv node (its ONNX shapes: input, weight, bias[, sum])."""
    if args.get("op_name") != "Conv":
        return None
    shapes = [next(iter(s.values())) for s in args["input_type_shape"]]
    (_, c, h, w), (oc, _, kh, kw) = shapes[0][:4], shapes[1]
    oh = next(iter(args["output_type_shape"][0].values()))[2]
    return conv_key(h, w, c, oc, kh, kw, round(h / oh), len(shapes) > 3)


def task_conv_key(task: dict[str, Any]) -> str:
    """`conv_key` of one of our conv tasks (its workload, and a second add in its fused name)."""
    _, h, w, c, oc, kh, kw, _, _, sh, _ = task["workload"]
    return conv_key(h, w, c, oc, kh, kw, sh, task["task"].count("_add") > 1)
