"""resnet18 fp32 tuned for an NVIDIA GPU by this pipeline, side by side with PyTorch eager,
torch.compile and ONNX Runtime's CUDA provider, in one run on that GPU.

The pipeline part is the library's steps in the nightly flow's order (vta_pipeline.steps,
no Prefect): a local board on this machine (tracker + rpc server with the GPU), its CUDA
limits read off the board, fetch, extract (NHWC, the GPU presets' layout), tune every task
through the board, pick best, build, and evaluate on the board with its reference check.
It tunes in rounds (`--trials 16,32`: to 16 trials per task, build and measure, then on to
32 from the same records), so the run leaves measured points of latency against tuning
time, and it starts no round that the deadline (`--deadline-min`) would cut.

The frameworks are timed before the tuning and again after it (the GPU's clocks and the
host move), each as the median of `--runs` batch-1 inferences of the same random-weight
model (seed 0), synchronised per run. ONNX Runtime's CUDA provider needs the onnxruntime-gpu
package; where the installed onnxruntime has no CUDA provider, its row says so.

    python -m benchmarks.gpu_compare --out benchmarks/results/gpu_<commit>    # on a GPU machine

Results: compare.json and compare.md in `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.lib import timing
from benchmarks.lib.references import torch_model
from vta_pipeline import boards, fetch, steps
from vta_pipeline import build as build_mod
from vta_pipeline.boards import machine
from vta_pipeline.config import EvalConfig, build_config, parse_hostport
from vta_pipeline.extract import load_tasks, select_tasks
from vta_pipeline.store.artifacts import ArtifactStore
from vta_pipeline.targets import resolve_target

ROOT = Path(__file__).resolve().parent.parent

SHAPE = (1, 3, 224, 224)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the machine ------------------------------------------------------------------------------
def gpu_facts() -> dict[str, Any]:
    """The GPU as nvidia-smi and PyTorch name it: name, driver, memory, compute capability."""
    import torch

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    )
    major, minor = torch.cuda.get_device_capability(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "nvidia_smi": smi.stdout.strip(),
        "compute_capability": f"{major}.{minor}",
        "arch": f"sm_{major}{minor}",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
    }


def cuda_smoke(target_json: dict[str, Any]) -> str:
    """Compile y = x + 1 for the target and run it on this GPU, in-process; returns the CUDA
    compiler that worked. TVM compiles with NVRTC (the cuda-bindings package) unless
    TVM_CUDA_COMPILE_MODE=nvcc; where NVRTC fails, the run goes on with nvcc (the builder's
    processes start later and inherit the setting)."""
    import tvm
    from tvm import te

    a = te.placeholder((1024,), "float32", name="a")
    b = te.compute((1024,), lambda i: a[i] + 1.0, name="b")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([a, b])}))
    bx, tx = sch.split(sch.get_loops(sch.get_sblock("b"))[0], [None, 256])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    errors = []
    for mode in (os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc"), "nvcc"):
        os.environ["TVM_CUDA_COMPILE_MODE"] = mode
        try:
            lib = tvm.compile(sch.mod, target=tvm.target.Target(target_json))
            dev = tvm.cuda(0)
            x = tvm.runtime.tensor(np.arange(1024, dtype="float32"), dev)
            y = tvm.runtime.empty((1024,), "float32", dev)
            lib["main"](x, y)
            if not np.array_equal(y.numpy(), np.arange(1024, dtype="float32") + 1):
                raise RuntimeError("wrong result")
            return mode
        except Exception as e:  # the next compiler
            errors.append(f"{mode}: {type(e).__name__}: {e}")
            log(f"CUDA smoke test with {mode} failed: {str(e)[-2000:]}")
    raise RuntimeError("no CUDA compiler works here: " + " | ".join(errors))


# ---- the frameworks ---------------------------------------------------------------------------
def gpu_timed(fn: Callable[[], Any], runs: int, warmup: int = 10) -> list[float]:
    """Wall-clock ms of `runs` calls, each synchronised: batch-1 latency as a caller sees it."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


@contextlib.contextmanager
def tf32(allow: bool | None):
    """PyTorch's cuDNN convolutions with TF32 allowed or not (None: left as it is)."""
    import torch

    before = torch.backends.cudnn.allow_tf32
    if allow is not None:
        torch.backends.cudnn.allow_tf32 = allow
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = before


def stats(ms: list[float]) -> dict[str, float]:
    """compare.py's statistics, and the fastest run."""
    return {**timing.stats(ms), "min_ms": float(np.min(ms))}


class Frameworks:
    """resnet18 (random weights, seed) on the GPU in PyTorch eager (NCHW and channels-last),
    torch.compile (inductor) and ONNX Runtime (CUDA provider, where installed); kept loaded
    so that they can be timed again after the tuning."""

    def __init__(self, name: str, seed: int, work: Path):
        import copy

        import torch

        self.model = torch_model(name, seed).cuda()
        self.x_cpu = np.random.default_rng(seed).standard_normal(SHAPE).astype("float32")
        self.x = torch.from_numpy(self.x_cpu).cuda()
        self.model_cl = copy.deepcopy(self.model).to(memory_format=torch.channels_last)
        self.x_cl = self.x.contiguous(memory_format=torch.channels_last)
        t0 = time.time()
        self.compiled = torch.compile(self.model)
        with torch.inference_mode():
            self.compiled(self.x)  # compiles here, not in the timed runs
        self.compile_s = time.time() - t0
        self.ort_check: dict[str, Any] = {}
        self.ort_strict = None
        self.ort, self.ort_note = self._ort(work)

    def _ort(self, work: Path):
        """An ONNX Runtime session on the CUDA provider, or None and why not. It reads its input
        from and writes its output to GPU memory (I/O binding), as the PyTorch rows do; the
        numpy-in, numpy-out call is timed beside it."""
        import copy

        import torch

        try:
            import onnxruntime as ort
        except ImportError as e:
            return None, f"onnxruntime is not installed: {e}"
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return None, (
                f"onnxruntime {ort.__version__} here has no CUDAExecutionProvider "
                f"(providers: {', '.join(ort.get_available_providers())}): it needs the onnxruntime-gpu "
                "package built for this machine's CUDA"
            )
        try:  # any failure here costs the ORT row only, not the run
            if hasattr(ort, "preload_dlls"):  # cuDNN / cuBLAS from the nvidia-* packages PyTorch brought
                ort.preload_dlls()
            path = work / "model.onnx"
            torch.onnx.export(
                copy.deepcopy(self.model).cpu(),
                (torch.from_numpy(self.x_cpu),),
                str(path),
                input_names=["data"],
                output_names=["out"],
                opset_version=17,
                dynamo=False,
            )
            sess = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider"])
            if sess.get_providers()[0] != "CUDAExecutionProvider":
                return None, f"ONNX Runtime fell back to {sess.get_providers()}"
            y_torch = torch.from_numpy(self.reference())
            self.ort_io, ort_y = self._bind(sess, y_torch.shape)
            self.ort_check = {"version": ort.__version__, "max_abs_vs_torch_gpu": float((ort_y - y_torch).abs().max())}
            try:  # strict fp32 beside it: the CUDA provider may run convolutions on TF32 tensor cores
                self.ort_strict = ort.InferenceSession(
                    str(path), providers=[("CUDAExecutionProvider", {"use_tf32": "0"})]
                )
                self.ort_strict_io, y = self._bind(self.ort_strict, y_torch.shape)
                self.ort_check["tf32_off_max_abs_vs_torch_gpu_tf32_off"] = float(
                    (y - torch.from_numpy(self.reference(allow_tf32=False))).abs().max()
                )
            except Exception as e:
                self.ort_strict, self.ort_check["tf32_off"] = None, f"{type(e).__name__}: {str(e)[-300:]}"
            log(f"ONNX Runtime {ort.__version__} on the CUDA provider: {self.ort_check}")
            return sess, ""
        except Exception as e:
            log(f"ONNX Runtime's CUDA provider failed: {type(e).__name__}: {str(e)[-2000:]}")
            return None, f"{type(e).__name__}: {str(e)[-600:]}"

    def _bind(self, sess, out_shape):
        """The session's I/O bound to GPU tensors (input: the PyTorch rows' tensor), run once (the
        first run picks cuDNN's algorithms); returns the binding and that run's output."""
        import torch

        y = torch.empty(tuple(out_shape), device="cuda")
        io = sess.io_binding()
        io.bind_input("data", "cuda", 0, np.float32, list(SHAPE), self.x.data_ptr())
        io.bind_output("out", "cuda", 0, np.float32, list(y.shape), y.data_ptr())
        torch.cuda.synchronize()
        sess.run_with_iobinding(io)
        torch.cuda.synchronize()
        return io, y.cpu()

    def time(self, runs: int) -> dict[str, dict[str, float]]:
        import torch

        res = {}
        with torch.inference_mode():
            res["PyTorch eager fp32 (NCHW)"] = stats(gpu_timed(lambda: self.model(self.x), runs))
            res["PyTorch eager fp32 (channels-last)"] = stats(gpu_timed(lambda: self.model_cl(self.x_cl), runs))
            res["torch.compile fp32 (inductor)"] = stats(gpu_timed(lambda: self.compiled(self.x), runs))
        if self.ort is not None:
            feed = {"data": self.x_cpu}
            res["ONNX Runtime fp32 (CUDA provider)"] = stats(
                gpu_timed(lambda: self.ort.run_with_iobinding(self.ort_io), runs)
            )
            res["ONNX Runtime fp32 (CUDA provider, numpy in and out)"] = stats(
                gpu_timed(lambda: self.ort.run(None, feed), runs)
            )
        # Strict fp32, as TVM's kernels are: PyTorch's cuDNN convolutions may use TF32 by default
        with torch.inference_mode(), tf32(False):
            res["PyTorch eager fp32 (NCHW, TF32 off)"] = stats(gpu_timed(lambda: self.model(self.x), runs))
            res["torch.compile fp32 (inductor, TF32 off)"] = stats(gpu_timed(lambda: self.compiled(self.x), runs))
        if self.ort is not None and self.ort_strict is not None:
            res["ONNX Runtime fp32 (CUDA provider, TF32 off)"] = stats(
                gpu_timed(lambda: self.ort_strict.run_with_iobinding(self.ort_strict_io), runs)
            )
        return res

    def reference(self, allow_tf32: bool = True) -> np.ndarray:
        """PyTorch's output on the GPU, with its default TF32 setting or with TF32 off."""
        import torch

        with torch.inference_mode(), tf32(None if allow_tf32 else False):
            return self.model(self.x).float().cpu().numpy()


# ---- our pipeline -----------------------------------------------------------------------------
def tvm_rounds(
    args,
    facts: dict[str, Any],
    res: dict[str, Any],
    save: Callable[[], None],
    t_start: float,
    y_torch: np.ndarray | None = None,
) -> None:
    """Tune, build and evaluate in rounds of `args.trials`, on a local board with this GPU.

    Tuning stops at the deadline (`args.deadline_min` after `t_start`), between tasks: the
    network is then built and measured with the tasks tuned so far (the others keep TVM's
    default GPU schedules), so a run cut short still leaves a measured point."""
    deadline = t_start + args.deadline_min * 60
    target_name, key = args.target or f"cuda:{facts['arch']}", args.key
    cfg = build_config(
        None,
        {
            "model.source": args.source,
            "model.name": args.model,
            "model.seed": args.seed,
            "target": target_name,
            "board.key": key,
            "store": str(args.store),
            "tune.trials_per_batch": args.batch,
            "tune.task_filter": args.tasks,
            "measure.min_repeat_ms": args.min_repeat_ms,
            "tune.retime_top": args.retime_top,
        },
    )
    target = resolve_target(cfg.target)
    steps.check_target(cfg, target)
    store = ArtifactStore(cfg.store)
    res["tvm"] = {"target": target_name, "store": str(args.store), "points": []}
    with boards.LocalBoard(key=key, log_dir=store.root / "logs", server_module=target.server_module) as local:
        host, port = parse_hostport(local.tracker)
        n = boards.preflight(host, port, key)
        health_ms = boards.health_check(host, port, key, dict(target.target_json))
        params = boards.device_params(host, port, key, target.device) if target.query_device else {}
        target = target.with_device_params(params) if params else target
        log(f"local board {local.tracker}: {n} server(s), health check {health_ms:.4f} ms, limits {params}")
        res["tvm"].update(board_params=params, target_json=target.full_json, board_threads=local.threads)
        if target.device == "cuda":
            res["tvm"]["cuda_compiler"] = cuda_smoke(target.full_json)
            log(f"CUDA kernels compile with {res['tvm']['cuda_compiler']}")
        fetched = steps.fetch_step(store, cfg.model)
        extracted = steps.extract_step(store, fetched, target)
        tasks = select_tasks(load_tasks(extracted.path), cfg.tune.task_filter)
        log(f"{len(tasks)} tuning task(s): {', '.join(t.name for t in tasks)}")
        res["tvm"]["tasks"] = [t.name for t in tasks]
        board = boards.BoardSpec(host, port, key, 1)
        ev_cfg = EvalConfig(repeat=args.eval_repeat)
        tracker = (host, port)

        t0 = time.time()
        untuned = steps.build_step(store, extracted, None, target)
        ev = steps.evaluate_step(store, untuned, fetched, target, tracker, key, ev_cfg).meta
        res["tvm"]["untuned"] = {
            **_ev_row(ev),
            "build_s": time.time() - t0,
            "cross_check": cross_check(untuned, fetched, y_torch, target.device, args.runs),
        }
        log(f"untuned: {ev['mean_ms']:.3f} ms, output check {'passed' if ev['correct'] else 'FAILED'}")
        save()

        tuning_s = 0.0
        for budget in args.trials:
            left = deadline - time.time()
            last = res["tvm"]["points"][-1] if res["tvm"]["points"] else None
            if last is not None:  # the last round's pace, per trial, decides whether this one fits
                prev = res["tvm"]["points"][-2]["trials_per_task"] if len(res["tvm"]["points"]) > 1 else 0
                need = last["round_s"] / max(1, last["trials_per_task"] - prev) * (budget - last["trials_per_task"])
                if need > left:
                    res["tvm"]["stopped"] = f"{budget} trials/task would need ~{need:.0f} s, {left:.0f} s left"
                    log(f"stop: {res['tvm']['stopped']}")
                    break
            t_round = time.time()
            tune_cfg = cfg.tune.model_copy(update={"trials_per_task": budget})
            tuned = []
            for i, task in enumerate(tasks):
                if time.time() > deadline:
                    res["tvm"]["stopped"] = (
                        f"the deadline came after {i} of {len(tasks)} tasks of the "
                        f"{budget}-trial round; the rest keep TVM's default GPU schedules"
                    )
                    log(f"stop: {res['tvm']['stopped']}")
                    break
                t_task = time.time()
                try:  # a task that fails is reported, and the network builds with the others' records
                    art = steps.tune_step(store, extracted, task, target, board, tune_cfg, cfg.measure)
                except Exception as e:
                    err = f"{type(e).__name__}: {e}"
                    res["tvm"].setdefault("task_errors", {})[f"{task.name}@{budget}"] = err[-3000:]
                    log(f"  [{i + 1}/{len(tasks)}] {task.name}: FAILED {type(e).__name__}: {str(e)[-1500:]}")
                    continue
                tuned.append((task, art))
                seconds = time.time() - t_task
                res["tvm"].setdefault("task_seconds", {})[f"{task.name}@{budget}"] = seconds
                res["tvm"]["in_progress"] = {
                    "trials_per_task": budget,
                    "best_ms": {t.name: a.meta.get("best_latency_ms") for t, a in tuned},
                }
                log(
                    f"  [{i + 1}/{len(tasks)}] {task.name}: best {art.meta.get('best_latency_ms')} ms, TVM's default "
                    f"GPU schedule {art.meta.get('default_ms')} ms ({art.meta.get('trials')} trials, {seconds:.0f} s)"
                )
                save()
            if not tuned and res["tvm"].get("stopped"):
                break
            if not tuned:
                raise RuntimeError(f"every task failed to tune: {res['tvm'].get('task_errors')}")
            best = steps.pick_best_step(store, [a for _, a in tuned], target)
            tuning_s += time.time() - t_round
            lib = steps.build_step(store, extracted, best, target)
            ev = steps.evaluate_step(store, lib, fetched, target, tracker, key, ev_cfg).meta
            point = {
                "trials_per_task": budget,
                **_ev_row(ev),
                "tuning_s": tuning_s,
                "round_s": time.time() - t_round,
                "tasks_tuned": len(tuned),
                "tasks": {t.name: a.meta for t, a in tuned},
                "cross_check": cross_check(lib, fetched, y_torch, target.device, args.runs),
            }
            res["tvm"]["points"].append(point)
            log(
                f"{budget} trials/task: {ev['mean_ms']:.3f} ms (median {ev.get('median_ms')}), output check "
                f"{'passed' if ev['correct'] else 'FAILED'}, tuning so far {tuning_s:.0f} s"
            )
            res["tvm"].pop("in_progress", None)
            save()
            if res["tvm"].get("stopped"):
                break


def cross_check(built, fetched, y_torch: np.ndarray | None, device: str, runs: int = 200) -> dict[str, float]:
    """The built network run in this process against the reference (PyTorch on the CPU, at
    fetch) and against PyTorch on this GPU: an output check that does not go through the
    board's (which reported an error of exactly 0.0 for GPU builds on an H200). On a GPU it
    is also timed as the frameworks are (wall clock of synchronised calls), beside the
    board's time_evaluator."""
    import tvm
    from tvm import relax

    x, y_ref = fetch.load_reference(fetched.path)
    dev = tvm.device(device)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(built.file(build_mod.LIB))), dev)
    xd = tvm.runtime.tensor(x, dev)
    out = vm["main"](xd)
    y = (out[0] if not isinstance(out, tvm.runtime.Tensor) else out).numpy().reshape(y_ref.shape)
    row = {"max_abs_vs_reference": float(np.max(np.abs(y - y_ref))), "output_std": float(y.std())}
    if y_torch is not None:
        row["max_abs_vs_torch_gpu"] = float(np.max(np.abs(y - y_torch.reshape(y.shape))))
        row["reference_vs_torch_gpu"] = float(np.max(np.abs(y_ref - y_torch.reshape(y.shape))))
    if device == "cuda":
        row.update({f"wall_{k}": v for k, v in stats(gpu_timed(lambda: vm["main"](xd), runs)).items()})
    log(f"in-process output check: {row}")
    return row


def _ev_row(ev: dict[str, Any]) -> dict[str, Any]:
    keys = ("mean_ms", "median_ms", "min_ms", "std_ms", "correct", "max_abs_err", "cosine")
    return {k: ev.get(k) for k in keys}


# ---- the report -------------------------------------------------------------------------------
def markdown(res: dict[str, Any]) -> str:
    facts = res.get("facts", {})
    lines = [
        f"# resnet18 fp32 on {facts.get('gpu')}: tuned TVM vs PyTorch and ONNX Runtime",
        "",
        f"- GPU: {facts.get('nvidia_smi')} (compute capability {facts.get('compute_capability')})",
        f"- host: {res['cpu']['cpu']} ({res['cpu']['logical_cpus']} logical CPUs); torch "
        f"{facts.get('torch')} (CUDA {facts.get('torch_cuda')}); TVM {res.get('tvm_version')}; "
        f"commit {res['commit']}; host threads: PyTorch {facts.get('torch_threads')}, the board's rpc_server "
        f"{res.get('tvm', {}).get('board_threads')}",
        f"- batch 1, {SHAPE[1]}x{SHAPE[2]}x{SHAPE[3]}, random weights (seed {res['seed']}); frameworks: "
        f"median of {res['runs']} synchronised runs; TVM: the board's evaluation (median of its timed "
        "repeats)",
        "",
    ]
    lines += ["| engine | ms (median) | p90 | measured | vs torch.compile |", "|---|---|---|---|---|"]
    fw = {**res.get("frameworks_before", {}), **res.get("frameworks_after", {})}  # after the tuning, where run
    ref = fw.get("torch.compile fp32 (inductor)", {}).get("median_ms")

    def ratio(ms):
        return f"{ms / ref:.2f}x" if ref and ms else "-"

    for name, row in fw.items():
        when = "after the tuning" if name in res.get("frameworks_after", {}) else "before the tuning"
        lines.append(
            f"| {name} | {row['median_ms']:.3f} | {row['p90_ms']:.3f} | {row['runs']} runs {when} | "
            f"{ratio(row['median_ms'])} |"
        )
    if res.get("ort_check"):
        c = res["ort_check"]
        lines.append(
            f"| (ONNX Runtime {c['version']}: input and output bound in GPU memory; largest difference "
            f"from PyTorch on the GPU {c['max_abs_vs_torch_gpu']:.2e}"
            + (
                f"; with TF32 off in both, {c['tf32_off_max_abs_vs_torch_gpu_tf32_off']:.2e}"
                if "tf32_off_max_abs_vs_torch_gpu_tf32_off" in c
                else ""
            )
            + ") | | | | |"
        )
    if res.get("ort_note"):
        lines.append(f"| ONNX Runtime fp32 (CUDA provider) | - | - | not run: {res['ort_note']} | - |")
    tvm = res.get("tvm", {})
    if "untuned" in tvm:
        u = tvm["untuned"]
        lines.append(
            f"| TVM untuned (default GPU schedules) | {u['median_ms']:.3f} | - | on the board | "
            f"{ratio(u['median_ms'])} |"
        )
        _wall_row(lines, "TVM untuned", u.get("cross_check", {}), ratio)
    for p in tvm.get("points", []):
        of = f", {p['tasks_tuned']} of {len(tvm['tasks'])} tasks" if p["tasks_tuned"] < len(tvm["tasks"]) else ""
        lines.append(
            f"| TVM tuned, {p['trials_per_task']} trials/task{of} ({p['tuning_s'] / 60:.1f} min) | "
            f"{p['median_ms']:.3f} | - | on the board, output check {'passed' if p['correct'] else 'FAILED'}"
            f" | {ratio(p['median_ms'])} |"
        )
        _wall_row(lines, f"TVM tuned, {p['trials_per_task']} trials/task", p.get("cross_check", {}), ratio)
    if tvm.get("in_progress"):
        prog = tvm["in_progress"]
        lines += [
            "",
            f"Tasks tuned in the unfinished {prog['trials_per_task']}-trial round (best ms): "
            + ", ".join(f"{k} {v:.4f}" for k, v in prog["best_ms"].items() if v is not None),
        ]
    if tvm.get("stopped"):
        lines += ["", f"Tuning stopped at the deadline: {tvm['stopped']}."]
    if "compile_s" in res:
        lines += ["", f"torch.compile took {res['compile_s']:.0f} s to compile."]
    if res.get("error"):
        lines += ["", f"**The run failed:** `{res['error']}`"]
    return "\n".join(lines) + "\n"


def _wall_row(lines: list[str], name: str, check: dict[str, Any], ratio: Callable[[float], str]) -> None:
    if "wall_median_ms" in check:
        lines.append(
            f"| {name}, in-process | {check['wall_median_ms']:.3f} | {check['wall_p90_ms']:.3f} | "
            f"{check['wall_runs']} runs as the frameworks' | {ratio(check['wall_median_ms'])} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--source", default="torchvision", help="where the model comes from (builtin: a tiny test net)")
    p.add_argument("--key", default="cuda", help="the local board's key")
    p.add_argument("--target", default=None, help="a CUDA preset (default: cuda:sm_XX of this GPU)")
    p.add_argument("--trials", default="16,32", help="budgets per task, in rounds (comma-separated)")
    p.add_argument("--batch", type=int, default=16, help="candidates per search round")
    p.add_argument(
        "--tasks",
        default="conv2d",
        choices=["conv2d", "all"],
        help="which tasks to tune (conv2d: the rest keeps TVM's default GPU schedules)",
    )
    p.add_argument(
        "--deadline-min",
        type=float,
        default=30.0,
        help="minutes after the start by which tuning stops (between tasks; the network is then built "
        "with what was tuned), and no round starts that its pace says would pass it",
    )
    p.add_argument(
        "--min-repeat-ms",
        type=int,
        default=20,
        help="a candidate's shortest timed repeat (GPU kernels take microseconds; the CPU default is 150)",
    )
    p.add_argument("--retime-top", type=int, default=8, help="each task's best records re-timed in turn (1: off)")
    p.add_argument("--runs", type=int, default=200, help="timed runs per framework")
    p.add_argument("--eval-repeat", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--store", type=Path, default=None)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu")
    args = p.parse_args()
    args.trials = [int(t) for t in args.trials.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp())
    args.store = args.store or work / "store"  # a kept --store resumes the tuning
    import tvm

    res: dict[str, Any] = {
        "model": args.model,
        "seed": args.seed,
        "runs": args.runs,
        "trials": args.trials,
        "cpu": machine.cpu(),
        "commit": os.environ.get("VTA_PIPELINE_COMMIT") or machine.source_commit(),
        "tvm_version": tvm.__version__,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    t0 = time.time()

    def save() -> None:
        res["seconds"] = time.time() - t0
        (args.out / "compare.json").write_text(json.dumps(res, indent=1, default=str))
        (args.out / "compare.md").write_text(markdown(res))

    try:
        res["facts"] = gpu_facts()
        log(f"GPU: {res['facts']}")
        fw = Frameworks(args.model, args.seed, work)
        res["compile_s"], res["ort_note"], res["ort_check"] = fw.compile_s, fw.ort_note, fw.ort_check
        res["frameworks_before"] = fw.time(args.runs)
        log(f"frameworks: {json.dumps(res['frameworks_before'])}")
        save()
        tvm_rounds(args, res["facts"], res, save, t0, y_torch=fw.reference())
        res["frameworks_after"] = fw.time(args.runs)
        log(f"frameworks after tuning: {json.dumps(res['frameworks_after'])}")
    except Exception as e:  # keep what was measured
        import traceback

        res["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        save()
        print(markdown(res))


if __name__ == "__main__":
    main()
