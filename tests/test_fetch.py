"""Step 1: networks come in from each source with a reference output to check builds against."""

import json

import numpy as np
import pytest

from vta_pipeline import steps
from vta_pipeline.config import ModelConfig
from vta_pipeline.errors import ModelError
from vta_pipeline.fetch import check_model, load_module, load_reference


def _run_untuned(mod, x):
    import tvm
    from tvm import relax

    ex = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm", "num-cores": 1}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    return (out if isinstance(out, tvm.runtime.Tensor) else out[0]).numpy()


def test_builtin_import_reproduces_the_framework_output(micronet):
    fetched, _ = micronet
    x, y = load_reference(fetched.path)
    assert x.shape == (1, 3, 16, 16) and y.shape == (1, 4)
    np.testing.assert_allclose(_run_untuned(load_module(fetched.path), x), y, rtol=1e-4, atol=1e-5)
    assert fetched.meta["param_names"] and fetched.meta["num_input"] == 1


def _tiny_onnx(path, shape=(1, 3, 8, 8), external=False, poison=None):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    wv = rng.standard_normal((8, shape[1], 3, 3)).astype("float32")
    if poison is not None:
        wv.flat[:3] = poison
    w = numpy_helper.from_array(wv, "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype("float32"), "b")
    nodes = [
        helper.make_node("Conv", ["data", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [shape[0], 8, 1, 1])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    if external:
        onnx.save(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=0,
        )
    else:
        onnx.save(model, str(path))
    return path


def test_onnx_import_checks_against_onnxruntime(store, tmp_path):
    p = _tiny_onnx(tmp_path / "tiny.onnx")
    fetched = steps.fetch_step(store, ModelConfig(source="onnx", path=p, input_shape=(1, 3, 8, 8)))
    x, y = load_reference(fetched.path)
    np.testing.assert_allclose(_run_untuned(load_module(fetched.path), x), y, rtol=1e-4, atol=1e-5)


def test_onnx_file_content_is_part_of_the_key(store, tmp_path):
    p = _tiny_onnx(tmp_path / "tiny.onnx")
    cfg = ModelConfig(source="onnx", path=p, input_shape=(1, 3, 8, 8))
    k1 = steps.fetch_key(store, cfg)
    _tiny_onnx(p, shape=(1, 3, 8, 8))  # same bytes: same key
    assert steps.fetch_key(store, cfg) == k1
    p.write_bytes(p.read_bytes().replace(b"tiny", b"tinx"))  # same name, new content
    assert steps.fetch_key(store, cfg) != k1


def test_onnx_external_data_is_imported_and_its_bytes_are_part_of_the_key(store, tmp_path):
    p = _tiny_onnx(tmp_path / "tiny.onnx", external=True)
    data = tmp_path / "tiny.onnx.data"
    assert data.stat().st_size >= 8 * 3 * 3 * 3 * 4  # the weights live beside the graph
    cfg = ModelConfig(source="onnx", path=p, input_shape=(1, 3, 8, 8))
    fetched = steps.fetch_step(store, cfg)
    x, y = load_reference(fetched.path)
    np.testing.assert_allclose(_run_untuned(load_module(fetched.path), x), y, rtol=1e-4, atol=1e-5)
    k1 = steps.fetch_key(store, cfg)
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0x40  # new weights, the .onnx file untouched
    data.write_bytes(bytes(raw))
    assert steps.fetch_key(store, cfg) != k1


def test_onnx_external_data_file_missing_is_refused_before_any_work(store, tmp_path):
    p = _tiny_onnx(tmp_path / "tiny.onnx", external=True)
    (tmp_path / "tiny.onnx.data").unlink()
    with pytest.raises(ModelError, match=r"tiny\.onnx\.data.*beside the \.onnx file"):
        check_model(ModelConfig(source="onnx", path=p, input_shape=(1, 3, 8, 8)))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_weights_holding_nan_or_infinity_are_refused_at_fetch(store, tmp_path, bad):
    p = _tiny_onnx(tmp_path / "tiny.onnx", poison=bad)
    with pytest.raises(ModelError, match=r"1 weight tensor\(s\) hold NaN or infinity: w \(3 of 216 values\)"):
        steps.fetch_step(store, ModelConfig(source="onnx", path=p, input_shape=(1, 3, 8, 8)))
    assert not list((store.root / "steps").glob("fetch/*/manifest.json"))


def test_onnx_wrong_input_shape_names_both_shapes(store, tmp_path):
    p = _tiny_onnx(tmp_path / "tiny.onnx")
    with pytest.raises(ModelError, match=r"\[1, 3, 8, 8\].*--input-shape is \[1, 3, 224, 224\]"):
        steps.fetch_step(store, ModelConfig(source="onnx", path=p))
    assert not list((store.root / "steps").glob("fetch/*/manifest.json"))


def test_unreadable_onnx_file(store, tmp_path):
    p = tmp_path / "broken.onnx"
    p.write_bytes(b"not a protobuf")
    with pytest.raises(ModelError, match="not a readable ONNX model"):
        steps.fetch_step(store, ModelConfig(source="onnx", path=p))


@pytest.mark.parametrize(
    "cfg, needle",
    [
        (ModelConfig(source="torchvision", name="resnet81"), "resnet18"),
        (ModelConfig(source="builtin", name="tinynett"), "tinynet"),
        (ModelConfig(source="onnx", path="/nonexistent/model.onnx"), "does not exist"),
    ],
)
def test_unknown_models_list_close_matches(cfg, needle):
    with pytest.raises(ModelError, match=needle):
        check_model(cfg)


@pytest.mark.slow
def test_gluon_model_zoo_through_onnx(store):
    fetched = steps.fetch_step(store, ModelConfig(source="gluon", name="resnet18_v1", input_shape=(1, 3, 32, 32)))
    assert fetched.meta["output_shape"] == [1, 1000]
    assert (fetched.path / "model.onnx").stat().st_size > 1e6
    manifest = json.loads((fetched.path / "manifest.json").read_text())
    assert manifest["config"]["source"] == "gluon"
