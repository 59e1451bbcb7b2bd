"""Step 1, fetch model: a network from its framework into a Relax module plus params.

The artifact is framework-neutral and small to reload:
  module.json    the Relax IRModule (tvm.ir.save_json) with weights as function inputs
  params.npz     the weights, in the order of the function's parameters after the inputs
  reference.npz  a seeded input and the source framework's output for it; the evaluate
                 step checks the tuned build on the board against this
Keeping the weights out of the JSON keeps it small; later steps bind them as constants
(the deployed form, which is also the form we tune: weights passed as inputs change the
kernels).
"""

from __future__ import annotations

import difflib
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from .config import ModelConfig
from .errors import ModelError
from .models import BUILTIN, build_builtin

STEP = "fetch"
VERSION = 2


def default_input_shape(cfg: ModelConfig) -> tuple[int, ...]:
    if cfg.input_shape:
        return tuple(cfg.input_shape)
    if cfg.source == "builtin":
        return build_builtin(cfg.name)[1]
    return (1, 3, 299, 299) if "inception" in cfg.name.lower() else (1, 3, 224, 224)


def _no_such_model(kind: str, name: str, choices: list[str]) -> ModelError:
    close = difflib.get_close_matches(name, choices, n=4, cutoff=0.5)
    hint = f" Close matches: {', '.join(close)}." if close else ""
    return ModelError(f"unknown {kind} model {name!r}.{hint} `vta-pipeline models --source {kind}` lists them all.")


def list_models(source: str) -> list[str]:
    if source == "builtin":
        return sorted(BUILTIN)
    if source == "torchvision":
        import torchvision

        return sorted(torchvision.models.list_models(module=torchvision.models))
    if source == "gluon":
        from mxnet.gluon.model_zoo import vision

        # The zoo keeps its name table inside get_model(); its error for an unknown name
        # is the only public way to read it.
        try:
            vision.get_model("\0")
        except ValueError as e:
            return sorted(n.strip() for n in str(e).split("\n\t")[1:] if n.strip())
        return []
    return []


def onnx_external_files(path: Path) -> list[Path]:
    """The external-data files an ONNX model's tensors live in (models over 2 GB, or saved with
    `save_as_external_data`), sorted, each checked to exist. Their bytes are the model's
    weights as much as the .onnx file's are, so the fetch key hashes them too: a re-exported
    weights file next to an unchanged graph is a new model."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - _from_onnx reports an unreadable file with its reason
        raise ModelError(f"{path} is not a readable ONNX model: {e}") from None
    files = set()
    for t in _onnx_tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            location = {e.key: e.value for e in t.external_data}.get("location", "")
            f = (path.parent / location).resolve()
            if not location or not f.is_file():
                raise ModelError(
                    f"{path}: tensor {t.name!r} keeps its data in the external file {location!r}, "
                    f"which is not in {path.parent}: put the model's data files beside the .onnx file "
                    "(as onnx.save_model(..., save_as_external_data=True) wrote them)"
                )
            files.add(f)
    return sorted(files)


def _onnx_tensors(graph):
    """Every tensor a graph holds: initializers and node attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _onnx_tensors(a.g)
            for g in a.graphs:
                yield from _onnx_tensors(g)


def check_model(cfg: ModelConfig) -> None:
    """Cheap validation before any expensive work: the model exists, the file and its external
    data files are there."""
    if cfg.source == "onnx":
        p = Path(cfg.path)
        if not p.is_file():
            raise ModelError(f"ONNX file {p} does not exist: pass an existing file with --onnx-path")
        onnx_external_files(p)
        return
    names = list_models(cfg.source)
    if cfg.name not in names:
        raise _no_such_model(cfg.source, cfg.name, names)


def _input(cfg: ModelConfig, shape) -> np.ndarray:
    return np.random.default_rng(cfg.seed).standard_normal(shape).astype("float32")


def fetch_model(cfg: ModelConfig, out_dir: Path) -> dict[str, Any]:
    """Import the model and write the artifact files into out_dir; returns the meta dict."""
    check_model(cfg)
    shape = default_input_shape(cfg)
    x = _input(cfg, shape)
    if cfg.source in ("builtin", "torchvision"):
        mod, params, y = _from_torch(cfg, x)
    elif cfg.source == "gluon":
        mod, params, y = _from_gluon(cfg, x, out_dir)
    else:
        mod, params, y = _from_onnx(cfg, x, Path(cfg.path))
    _check_finite(mod, params, cfg)
    return _write(mod, params, x, y, out_dir, cfg, shape)


def _check_finite(mod, params: list[np.ndarray], cfg: ModelConfig) -> None:
    """Refuse weights holding NaN or infinity before anything is tuned: every output computed
    from them is NaN too, so the build's output check would fail only after the whole budget
    (and a NaN output compared with a NaN reference cannot tell a right kernel from a wrong one)."""
    func = mod["main"]
    n_in = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else len(func.params) - len(params)
    names = [str(p.name) for p in func.params][n_in:]
    bad = [
        (name, int(p.size - np.isfinite(p).sum()), p.size)
        for name, p in zip(names, params)
        if np.issubdtype(p.dtype, np.floating) and not np.isfinite(p).all()
    ]
    if bad:
        what = ", ".join(f"{name} ({n} of {size} values)" for name, n, size in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        model = cfg.path if cfg.source == "onnx" else f"{cfg.source} {cfg.name}"
        raise ModelError(
            f"{model}: {len(bad)} weight tensor(s) hold NaN or infinity: {what}{more}. "
            "Re-export the model from a checkpoint whose weights are finite"
        )


def _write(mod, params: list[np.ndarray], x, y, out_dir: Path, cfg: ModelConfig, shape) -> dict[str, Any]:
    import tvm

    func = mod["main"]
    names = [str(p.name) for p in func.params]
    num_input = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else len(names) - len(params)
    (out_dir / "module.json").write_text(tvm.ir.save_json(mod))
    np.savez(out_dir / "params.npz", **{f"p{i}": p for i, p in enumerate(params)})
    np.savez(out_dir / "reference.npz", input=x, output=y)
    return {
        "source": cfg.source,
        "model": cfg.name if cfg.source != "onnx" else str(cfg.path),
        "input_name": names[0],
        "input_shape": list(shape),
        "output_shape": list(y.shape),
        "num_input": num_input,
        "param_names": names[num_input:],
        "num_params": int(sum(p.size for p in params)),
    }


def torch_model(cfg: ModelConfig):
    """The seeded PyTorch model of a builtin or torchvision `cfg`, in eval mode: what fetch
    imports, and what the run's ONNX Runtime baseline exports (`baseline`)."""
    import torch

    torch.manual_seed(cfg.seed)
    if cfg.source == "builtin":
        model, _ = build_builtin(cfg.name)
    else:
        import torchvision

        kwargs: dict[str, Any] = {"weights": "DEFAULT" if cfg.pretrained else None}
        if cfg.name.startswith("inception"):
            kwargs["aux_logits"] = cfg.pretrained  # aux head only exists to load pretrained weights
            kwargs["init_weights"] = not cfg.pretrained
        try:
            model = torchvision.models.get_model(cfg.name, **kwargs)
        except (OSError, RuntimeError) as e:  # urllib errors are OSErrors
            raise ModelError(
                f"could not load pretrained weights of torchvision {cfg.name!r}: {e}. "
                "Without network access, drop --pretrained (random weights)."
            ) from None
    return model.eval()


def _from_torch(cfg: ModelConfig, x: np.ndarray):
    import torch
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.torch import from_exported_program

    model = torch_model(cfg)
    xt = torch.from_numpy(x)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.export's own deprecations
        y = model(xt).numpy()
        try:
            ep = torch.export.export(model, (xt,))
        except Exception as e:
            raise ModelError(f"torch.export failed for {cfg.source} model {cfg.name!r}: {e}") from None
    try:
        mod = from_exported_program(ep, keep_params_as_input=True, unwrap_unit_return_tuple=True)
    except Exception as e:
        raise ModelError(f"TVM's PyTorch frontend cannot import {cfg.name!r}: {e}") from None
    mod, params = detach_params(mod)
    return mod, [p.numpy() for p in params.get("main", [])], y


def _from_onnx(cfg: ModelConfig, x: np.ndarray, path: Path):
    import onnx
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.onnx import from_onnx

    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as e:
        raise ModelError(f"{path} is not a readable ONNX model: {e}") from None
    init_names = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in init_names]
    if len(inputs) != 1:
        raise ModelError(f"{path}: expected one graph input, found {[i.name for i in inputs]}")
    inp = inputs[0]
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inp.type.tensor_type.shape.dim]
    if len(dims) != len(x.shape) or any(d is not None and d != s for d, s in zip(dims, x.shape)):
        raise ModelError(
            f"{path}: input {inp.name!r} has shape {dims} but --input-shape is {list(x.shape)}; "
            "pass the model's shape with --input-shape"
        )
    if len(model.graph.input) > 1:
        # Older exporters (MXNet's among them) also list every initializer as a graph input;
        # the Relax frontend would then make each weight a parameter twice.
        keep = [i for i in model.graph.input if i.name not in init_names]
        del model.graph.input[:]
        model.graph.input.extend(keep)
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y = sess.run(None, {inp.name: x})[0]
    try:
        mod = from_onnx(model, shape_dict={inp.name: list(x.shape)}, keep_params_in_input=True)
    except Exception as e:
        raise ModelError(f"TVM's ONNX frontend cannot import {path}: {e}") from None
    mod, params = detach_params(mod)
    return mod, [p.numpy() for p in params.get("main", [])], y


def _from_gluon(cfg: ModelConfig, x: np.ndarray, out_dir: Path):
    """Gluon model zoo -> ONNX (MXNet's exporter) -> Relax. The ONNX file is kept."""
    import mxnet as mx
    from mxnet.gluon.model_zoo import vision

    mx.random.seed(cfg.seed)
    net = vision.get_model(cfg.name, pretrained=cfg.pretrained)
    if not cfg.pretrained:
        net.initialize(mx.init.Xavier())
    net.hybridize()
    y = net(mx.nd.array(x)).asnumpy()
    tmp = out_dir / "_export"
    tmp.mkdir()
    net.export(str(tmp / "model"))
    onnx_path = out_dir / "model.onnx"
    mx.onnx.export_model(
        str(tmp / "model-symbol.json"),
        str(tmp / "model-0000.params"),
        [x.shape],
        np.float32,
        str(onnx_path),
    )
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    mod, params, _ = _from_onnx(cfg, x, onnx_path)
    return mod, params, y


# ---- reading the artifact back ---------------------------------------------------------------
def load_module(art_dir: Path, bind_params: bool = True):
    """The imported module, with weights bound as constants (the deployed form)."""
    import tvm
    from tvm import relax

    art_dir = Path(art_dir)
    mod = tvm.ir.load_json((art_dir / "module.json").read_text())
    if not bind_params or not (art_dir / "params.npz").exists():  # later steps store bound modules
        return mod
    meta = json.loads((art_dir / "manifest.json").read_text())["meta"]
    with np.load(art_dir / "params.npz") as npz:
        params = [npz[f"p{i}"] for i in range(len(npz.files))]
    # Bind by variable, not by name: ONNX exports (MXNet's among them) may list an
    # initializer among the graph inputs too, which gives two parameters the same name.
    func = mod["main"]
    weights = list(func.params)[int(meta["num_input"]) :]
    if len(weights) != len(params):
        raise ModelError(f"{art_dir}: the module takes {len(weights)} weights but params.npz holds {len(params)}")
    binding = {var: tvm.runtime.tensor(p) for var, p in zip(weights, params)}
    return relax.transform.BindParams("main", binding)(mod)


def load_reference(art_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(Path(art_dir) / "reference.npz") as npz:
        return npz["input"], npz["output"]


def load_float_reference(art_dir: Path) -> np.ndarray | None:
    """The float model's output, kept next to an int8 network's (exact) reference."""
    with np.load(Path(art_dir) / "reference.npz") as npz:
        return npz["float_output"] if "float_output" in npz.files else None
