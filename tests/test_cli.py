"""The command line: user errors are one clear line and exit status 2, no traceback."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from vta_pipeline.cli.main import app

runner = CliRunner()


def _with(tool: str):
    """A case whose error comes after the target's toolchain check: it needs the cross
    compiler (CI installs it and sets VTA_PIPELINE_REQUIRE_CROSS, so there it always runs)."""
    return pytest.mark.skipif(
        shutil.which(tool) is None and not os.environ.get("VTA_PIPELINE_REQUIRE_CROSS"),
        reason=f"{tool} is not installed: the toolchain error comes first",
    )


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "--model", "resnet81", "--source", "torchvision"], "Close matches: resnet18"),
        (["run", "--source", "caffe"], "model.source"),
        (["run", "--source", "onnx", "--onnx-path", "/nonexistent.onnx"], "/nonexistent.onnx does not exist"),
        (["run", "--target", "hots"], "Did you mean host"),
        (["run", "--target", '{"kind": "llvm"'], "valid JSON"),
        pytest.param(
            ["run", "--target", "pynq-arm"],
            "--tracker HOST:PORT of the tracker your 'pynq' boards",
            marks=_with("arm-linux-gnueabihf-g++"),
        ),
        (["run", "--target", "cuda:volta"], "cuda:sm_86"),
        (["run", "--target", "pynq-vta"], "cannot run yet: it needs a Pynq-Z1 with a VTA bitstream"),
        (["run", "--target", "cuda", "--vta", "--tracker", "127.0.0.1:1"], "without --vta"),
        pytest.param(
            ["build", "--target", "rk3399-mali", "--vta"], "without --vta", marks=_with("aarch64-linux-gnu-g++")
        ),
        (["run", "--tracker", "nohost"], "HOST:PORT"),
        (["run", "--trials-per-task", "0"], "tune.trials_per_task"),
        (["run", "--input-shape", "1,3,a,b"], "--input-shape"),
        (["run", "--cache", "sometimes"], "--cache"),
        (["run", "--tracker", "127.0.0.1:1"], "python -m tvm.exec.rpc_tracker"),
        (["tasks", "--model", "nope"], "unknown builtin model"),
        (["report", "--store", "/nonexistent-store"], "no finished runs"),
        (["run", "--vta", "--global-scale", "6"], "global_scale must be a power of two"),
        (["tasks", "--vta", "--skip-conv-layers", "a,b"], "--skip-conv-layers"),
        (["tasks", "--vta-config", "/nonexistent/vta_config.json"], "vta_config.json does not exist"),
        (["run", "--task-filter", "packd"], "tune.task_filter"),
        (["run", "--session", "../../etc"], "tune.session"),
        (["run", "--warm-start", "-1"], "tune.warm_start"),
        (["history", "nights", "--store", "/nonexistent-store"], "no history in /nonexistent-store"),
        (["run", "--onnx-path", "/tmp/m.onnx"], "add --source onnx"),
        (["run", "--key", "a/b"], "no '/', no spaces"),
        (["run", "--key", "my board"], "board key 'my board'"),
        (["board", "up", "--key", "a/b"], "no '/', no spaces"),
    ],
)
def test_user_errors(args, needle, tmp_path):
    if "--store" not in args and args[0] not in ("report", "history", "board"):
        args = [*args, "--store", str(tmp_path / "s")]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output
    assert not (tmp_path / "s" / "steps").exists() or not any((tmp_path / "s" / "steps").iterdir())


def test_a_store_path_that_is_a_file_is_refused_before_any_work(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    for store in (f, f / "sub"):
        r = runner.invoke(app, ["run", "--store", str(store)])
        assert r.exit_code == 2, r.output
        assert "is a file" in r.output and "--store" in r.output and "Traceback" not in r.output
    assert f.read_text() == "mine"


def test_cuda_without_a_tracker_is_refused_where_this_machine_has_no_gpu(tmp_path):
    from vta_pipeline.steps import local_device_exists

    if local_device_exists("cuda"):
        pytest.skip("this machine has a CUDA GPU: a local cuda board is valid here")
    r = runner.invoke(app, ["run", "--target", "cuda", "--store", str(tmp_path / "s")])
    assert r.exit_code == 2, r.output
    assert "--tracker HOST:PORT" in r.output and "cuda" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "s").exists()  # refused before the store or a board was made


def test_config_file_with_unknown_key(tmp_path):
    f = tmp_path / "nightly.json"
    f.write_text(json.dumps({"tune": {"trials": 5}}))
    r = runner.invoke(app, ["run", "--config", str(f), "--store", str(tmp_path / "s")])
    assert r.exit_code == 2 and "tune.trials" in r.output and "nightly.json" in r.output


def test_tracker_down_fails_within_seconds(tmp_path):
    import time

    t = time.time()
    r = runner.invoke(app, ["run", "--tracker", "127.0.0.1:9", "--store", str(tmp_path / "s")])
    assert r.exit_code == 2 and "127.0.0.1:9" in r.output
    assert time.time() - t < 30


def test_board_up_status_down(tmp_path):
    env = {"VTA_PIPELINE_BOARD_STATE": str(tmp_path / "board.json")}
    import os

    full = dict(os.environ, **env)
    cli = [sys.executable, "-m", "vta_pipeline.cli", "board"]
    from vta_pipeline.boards import free_port

    port = free_port()
    up = subprocess.run(
        [*cli, "up", "--key", "cli", "--servers", "1", "--port", str(port)],
        env=full,
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        assert up.returncode == 0, up.stderr
        status = subprocess.run([*cli, "status"], env=full, capture_output=True, text=True, timeout=60)
        assert "server:cli" in status.stdout and "Queue Status" in status.stdout
    finally:
        down = subprocess.run([*cli, "down"], env=full, capture_output=True, text=True, timeout=60)
    assert "stopped the board" in down.stdout
    import time

    from vta_pipeline.boards import port_open

    time.sleep(1)
    assert not port_open("127.0.0.1", port)


def test_board_up_vta_sim_starts_servers_that_run_vtas_simulator(tmp_path):
    import os

    from vta_pipeline.boards import free_port
    from vta_pipeline.vta.config import VTAConfig
    from vta_pipeline.vta.conv import ConvWorkload, Epilogue, Knobs
    from vta_pipeline.vta.remote import board_measure

    full = dict(os.environ, VTA_PIPELINE_BOARD_STATE=str(tmp_path / "board.json"))
    cli = [sys.executable, "-m", "vta_pipeline.cli", "board"]
    port = free_port()
    up = subprocess.run(
        [*cli, "up", "--vta-sim", "--port", str(port)], env=full, capture_output=True, text=True, timeout=180
    )
    try:
        assert up.returncode == 0, up.stderr
        assert "VTA simulator server(s) under key 'vta-sim'" in up.stdout
        wl = ConvWorkload(1, 14, 14, 32, 32, 3, 3, 1, 1, 1, 1)
        legal, one_accumulator = Knobs(tile_w=14), Knobs()
        m, refused = board_measure(f"127.0.0.1:{port}", "vta-sim", wl, Epilogue(), VTAConfig())(
            [legal, one_accumulator]
        )
        assert m.cycles and m.error is None
        assert refused.cycles is None and "VerifyDep" in refused.error  # a failed config, not a crashed session
    finally:
        subprocess.run([*cli, "down"], env=full, capture_output=True, text=True, timeout=60)
    bad = subprocess.run([*cli, "up", "--vta-sim", "--sim-mode", "hls"], env=full, capture_output=True, text=True)
    assert bad.returncode != 0 and "--sim-mode 'hls': strict" in bad.stdout + bad.stderr


def test_targets_and_models_listings():
    r = runner.invoke(app, ["targets"])
    assert r.exit_code == 0 and '"kind": "llvm"' in r.stdout
    r = runner.invoke(app, ["models", "--source", "torchvision"])
    assert "resnet18" in r.stdout.split() and "mobilenet_v2" in r.stdout.split()


def _flag_overrides(**given):
    """The config overrides of command-line flags, as a command receives them."""
    from vta_pipeline.cli.flags import FLAGS, overrides

    return overrides(FLAGS, given)


def test_int8_activation_flags_choose_the_type_of_activations_between_layers():
    """--int8-activations / --int32-activations set quantize.dtype_activation; unset, the
    default (int32) or the target preset's (vta-sim: int8) stands."""
    from vta_pipeline.config import build_config

    def dtype(flag, target="host"):
        given = _flag_overrides(vta=True, int8_activations=flag)
        return build_config(None, {**given, "target": target}).quantize.dtype_activation

    assert (dtype(None), dtype(True), dtype(False)) == ("int32", "int8", "int32")
    assert (dtype(None, "vta-sim"), dtype(False, "vta-sim")) == ("int8", "int32")


def test_the_depthwise_dot_flag_reaches_graph_pack_and_keeps_older_stores_keys(tmp_path):
    """--depthwise-dot sets pack.depthwise_dot, which graph pack's parameters carry; off (the
    default), the pack step's key is the one it had before the option existed."""
    from vta_pipeline.config import build_config
    from vta_pipeline.pack import pack_params
    from vta_pipeline.steps import _pack_config

    def cfg(flag):
        return build_config(None, _flag_overrides(vta=True, pack_layout="x86", depthwise_dot=flag))

    on, off = cfg(True), cfg(None)
    assert pack_params(on.pack, on.vta).depthwise_dot and not pack_params(off.pack, off.vta).depthwise_dot
    assert "depthwise_dot" in _pack_config(on.pack, on.vta)["pack"]
    assert "depthwise_dot" not in _pack_config(off.pack, off.vta)["pack"]


def test_the_winograd_tile_setting_keys_the_pack_step_only_with_winograd_on():
    """--winograd-small-below (pack.winograd_small_below) changes what a --winograd pack holds
    (F(2x2) convs below it), so it is in that pack's key; without --winograd the key is the one
    it had before it existed."""
    from vta_pipeline.config import build_config
    from vta_pipeline.steps import _pack_config

    def key(winograd=None, winograd_small_below=None):
        cfg = build_config(
            None, _flag_overrides(vta=True, winograd=winograd, winograd_small_below=winograd_small_below)
        )
        return _pack_config(cfg.pack, cfg.vta)["pack"]

    assert "winograd_small_below" not in key() and "winograd_small_below" not in key(winograd_small_below=0)
    assert key(winograd=True)["winograd_small_below"] == 28
    assert key(winograd=True) != key(winograd=True, winograd_small_below=0)
