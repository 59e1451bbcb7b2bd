"""Re-time the tuned builds that `unseen.py` left in its stores against ONNX Runtime fp32, in turn
(`baseline.compare`, with the rest between engines), on a fresh local board.

    uv run python benchmarks/retime_unseen.py two_conv googlenet   # stores under /work/store-unseen

Prints each network's medians and rounds; writes /work/retime.json.
"""
import glob, json, os, sys, tempfile
from pathlib import Path
from vta_pipeline import baseline, importers
from vta_pipeline.boards import LocalBoard
from vta_pipeline.config import PipelineConfig
out = {}
b = LocalBoard(key="retime", num_servers=1).start()
try:
    for net in sys.argv[1:]:
        st = Path(f"/work/store-unseen/{net}")
        run = json.load(open(max(glob.glob(str(st / "runs/*.json")), key=os.path.getmtime)))
        lib = next(p for p in glob.glob(str(st / "steps/build/*/model.so")) if run["tuned"]["build_id"] in open(Path(p).parent / "manifest.json").read())
        fetched = Path(glob.glob(str(st / "steps/fetch/*/"))[0])
        cfg = PipelineConfig.model_validate(run["config"])
        x, y = importers.load_reference(fetched)
        with tempfile.TemporaryDirectory() as w:
            onnx = baseline.onnx_model(cfg, fetched, Path(w))
            r = baseline.compare(Path(lib), onnx, x, y, (b.host, b.port), b.key, 2, 7)
        print(net, "ours", r["ours_ms"], "ort", r["ort_ms"], "ratio", r["ratio"], r["ours_rounds_ms"], r["ort_rounds_ms"], flush=True)
        out[net] = r
finally:
    b.stop()
json.dump(out, open("/work/retime.json", "w"), indent=1)
