"""Re-time the tuned builds that `unseen.py` left in its stores against ONNX Runtime fp32, in turn
(`baseline.compare`, with the rest between engines), on a fresh local board.

    uv run python -m benchmarks.retime_unseen two_conv googlenet --store /tmp/vta-unseen --out DIR

Prints each network's medians and rounds; writes retimed_with_rest_between_engines.json into
--out, with the CPU, LLVM mcpu, threads and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from vta_pipeline import baseline, fetch
from vta_pipeline.boards import LocalBoard, machine
from vta_pipeline.config import PipelineConfig

ROOT = Path(__file__).resolve().parent.parent


def tuned_build(store: Path) -> tuple[dict, Path, Path]:
    """The store's last run, its tuned model.so and its fetched model directory."""
    run = json.loads(max((store / "runs").glob("*.json"), key=os.path.getmtime).read_text())
    lib = next(
        p
        for p in (store / "steps" / "build").glob("*/model.so")
        if run["tuned"]["build_id"] in (p.parent / "manifest.json").read_text()
    )
    return run, lib, next((store / "steps" / "fetch").glob("*/"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("networks", nargs="+")
    ap.add_argument("--store", type=Path, default=Path("/tmp/vta-unseen"), help="unseen.py's --store")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    from tvm.target import codegen

    out = {
        "meta": {
            **machine.cpu(),
            "mcpu": codegen.llvm_get_system_cpu(),
            "threads": args.threads,
            "commit": machine.source_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M"),
        }
    }
    board = LocalBoard(key="retime", num_servers=1).start()
    try:
        for net in args.networks:
            run, lib, fetched = tuned_build(args.store / net)
            x, y = fetch.load_reference(fetched)
            with tempfile.TemporaryDirectory() as work:
                onnx = baseline.onnx_model(PipelineConfig.model_validate(run["config"]), fetched, Path(work))
                r = baseline.compare(lib, onnx, x, y, (board.host, board.port), board.key, args.threads, args.rounds)
            print(
                f"{net}: ours {r['ours_ms']:.3f} ms, ORT {r['ort_ms']:.3f} ms, {r['ratio']:.2f}x; rounds "
                f"{r['ours_rounds_ms']} / {r['ort_rounds_ms']}",
                flush=True,
            )
            out[net] = r
    finally:
        board.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "retimed_with_rest_between_engines.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
