"""The int8 VTA path from the command line: `tasks --vta`, `pack-points`, errors before tuning."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from vta_pipeline.cli.main import app

runner = CliRunner()


def _invoke(args):
    r = runner.invoke(app, args)
    return r.exit_code, r.output


def test_tasks_vta_prints_only_the_packed_conv2d_tasks_with_vta_workloads(session_store):
    code, out = _invoke(["tasks", "--vta", "--json", "--store", str(session_store.root)])
    assert code == 0, out
    tasks = json.loads(out[out.index("[") :])
    assert {t["op"] for t in tasks} == {"packed_conv2d"}
    # tinynet after the stem: two 32->32 3x3 convs and the strided 32->64 one; batch = N/b * b,
    # in_filter = C/c * c
    assert sorted(t["workload"] for t in tasks) == sorted([
        [1, 32, 32, 32, 32, 3, 3, 1, 1, 1, 1], [1, 32, 32, 32, 32, 3, 3, 1, 1, 1, 1],
        [1, 32, 32, 32, 64, 3, 3, 1, 1, 2, 2],
    ])  # fmt: skip
    code, out = _invoke(["tasks", "--vta", "--task-filter", "all", "--json", "--store", str(session_store.root)])
    assert code == 0 and len(json.loads(out[out.index("[") :])) > len(tasks)


def test_pack_points_lists_operators_and_marks_the_default_region(session_store):
    code, out = _invoke(["pack-points", "tinynet", "--quantize", "--json", "--store", str(session_store.root)])
    assert code == 0, out
    res = json.loads(out[out.index("{") :])
    ops = {o["index"]: o for o in res["operators"]}
    assert ops[res["start"]]["name"] == "nn.max_pool2d" and ops[res["start"]]["occurrence"] == 0
    assert ops[res["stop"]]["name"] == "mean" and "nn.global_avg_pool2d" in ops[res["stop"]]["aliases"]
    assert res["packable"] and res["error"] is None and res["packed_ops"] > 10
    assert any(o["name"] == "right_shift" for o in res["operators"])  # the quantized graph is listed

    code, out = _invoke(["pack-points", "tinynet", "--store", str(session_store.root)])
    assert code == 0 and "START (packed after)" in out and "STOP (unpacked before)" in out
    assert "region #3 -> #14 packs" in out


def test_pack_points_says_which_operator_stops_a_region(session_store):
    code, out = _invoke(["pack-points", "tinynet", "--cfactor", "64", "--json", "--store", str(session_store.root)])
    res = json.loads(out[out.index("{") :])
    assert code == 0 and not res["packable"]
    assert "cannot pack #4 nn.conv2d[1] (1x32x32x32, 32x32x3x3)" in res["error"] and "cfactor=64" in res["error"]
    assert "--pad-channels" in res["error"]  # the fix is named
    code, out = _invoke(
        ["pack-points", "tinynet", "--cfactor", "64", "--pad-channels", "--json", "--store", str(session_store.root)]
    )
    assert code == 0 and json.loads(out[out.index("{") :])["packable"], out  # 32 channels run as 64


def test_an_unpackable_region_fails_before_tuning_and_keeps_the_finished_steps(tmp_path):
    store = tmp_path / "s"
    code, out = _invoke(["tasks", "--vta", "--cfactor", "64", "--store", str(store)])
    assert code == 2 and "cannot pack #" in out and "Traceback" not in out
    done = {p.parent.parent.name for p in (store / "steps").glob("*/*/manifest.json")}
    assert done == {"fetch", "quantize"}


def test_a_one_conv_onnx_model_names_its_file_and_the_skip_fix(tmp_path):
    from test_fetch import _tiny_onnx

    onnx_file = _tiny_onnx(tmp_path / "oneconv.onnx")
    model = [
        "--source",
        "onnx",
        "--onnx-path",
        str(onnx_file),
        "--input-shape",
        "1,3,8,8",
        "--store",
        str(tmp_path / "s"),
    ]
    code, out = _invoke(["pack-points", *model])
    assert code == 0 and "operators of oneconv" in out and "tinynet" not in out
    code, out = _invoke(["tasks", "--vta", *model])  # the default keeps conv 0 (the only one) in float
    assert code == 2 and "has 1 conv2d layer(s)" in out and "--skip-conv-layers ''" in out
    code, out = _invoke(["tasks", "--quantize", "--skip-conv-layers", "", "--json", *model])
    assert code == 0, out
