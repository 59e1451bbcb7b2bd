"""Target presets and raw TVM target JSON."""

import pytest

from vta_pipeline.errors import ConfigError
from vta_pipeline.targets import resolve_target


def test_host_preset_is_a_valid_llvm_target_with_cores():
    t = resolve_target("host")
    assert t.kind == "llvm" and t.target_json["num-cores"] >= 1
    assert t.tvm_target().kind.name == "llvm"


def test_raw_json_gets_num_cores_and_a_distinct_id():
    t = resolve_target('{"kind": "llvm", "mcpu": "cascadelake"}')
    assert t.target_json["num-cores"] >= 1
    assert t.id != resolve_target('{"kind": "llvm", "mcpu": "skylake-avx512"}').id


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("hots", "Did you mean host"),
        ("{kind: llvm", "valid JSON"),
        ('{"mcpu": "x"}', '"kind"'),
        ('{"kind": "nosuchkind"}', "TVM rejects"),
    ],
)
def test_bad_targets(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        resolve_target(spec)


# ---- the board presets ----------------------------------------------------------------------------
PRESETS = ["host", "pynq-arm", "pynq-vta", "vta-sim", "rk3399-cpu", "rk3588-cpu", "rk3399-mali", "cuda"]
RUNNABLE = [p for p in PRESETS if p != "pynq-vta"]


@pytest.mark.parametrize("name", RUNNABLE)
def test_every_preset_is_a_target_tvm_accepts(name):
    t = resolve_target(name)
    assert t.tvm_target().kind.name == t.kind
    if t.is_gpu:  # GPU code needs host code: both are in the target TVM builds
        assert t.host_json and t.tvm_target().host.kind.name == "llvm"
        assert t.layout == "NHWC" and t.query_device
    assert t.spec == name and resolve_target(t.spec) == t


def test_the_pynq_vta_preset_refuses_to_run_and_says_what_is_missing():
    from vta_pipeline.targets import get_preset, preset_defaults

    for attempt in (
        lambda: get_preset("pynq-vta"),
        lambda: resolve_target("pynq-vta"),
        lambda: preset_defaults("pynq-vta"),
    ):
        with pytest.raises(
            ConfigError,
            match=r"'pynq-vta' cannot run yet: it needs a Pynq-Z1 with a VTA bitstream "
            r".*a driver on its ARM core.*simulator.*--target pynq-arm",
        ):
            attempt()


def test_arm_presets_are_cross_compiled_hard_float_neon():
    pynq, rk = resolve_target("pynq-arm"), resolve_target("rk3399-cpu")
    assert pynq.target_json["mtriple"].startswith("armv7") and pynq.target_json["mfloat-abi"] == "hard"
    assert "+neon" in pynq.target_json["mattr"] and pynq.default_key == "pynq"
    assert pynq.cross_compiler == "arm-linux-gnueabihf-g++" and pynq.cross_package == "g++-arm-linux-gnueabihf"
    assert rk.target_json["mtriple"] == "aarch64-linux-gnu" and rk.cross_compiler == "aarch64-linux-gnu-g++"
    assert resolve_target("rk3399-mali").host_json["mtriple"] == "aarch64-linux-gnu"
    assert resolve_target("rk3399-mali").default_key == rk.default_key == "rk3399"


def test_cuda_architecture_is_an_option_of_the_preset():
    assert resolve_target("cuda").target_json["arch"] == "sm_80"
    t = resolve_target("cuda:sm_90")
    assert t.target_json["arch"] == "sm_90" and t.tvm_target().attrs["arch"] == "sm_90"
    assert t.id != resolve_target("cuda").id  # a database per architecture
    with pytest.raises(ConfigError, match="cuda:sm_86"):
        resolve_target("cuda:ampere")
    with pytest.raises(ConfigError, match="takes no option"):
        resolve_target("pynq-arm:fast")


def test_limits_read_off_a_board_travel_in_the_spec():
    mali = resolve_target("rk3399-mali")
    read = mali.with_device_params({"max_threads_per_block": 512, "thread_warp_size": 1})
    assert read.target_json["max_threads_per_block"] == 512 and read.id != mali.id
    again = resolve_target(read.spec)  # what the flow hands its tasks
    assert again == read and again.cross_compiler == mali.cross_compiler and again.name == "rk3399-mali"
    assert mali.with_device_params({"max_threads_per_block": 256}) is mali  # nothing new: same target


def test_preset_defaults_fill_the_board_key_and_measurement_but_never_override():
    from vta_pipeline.config import build_config

    cfg = build_config(None, {"target": "cuda"})
    assert cfg.board.key == "cuda" and cfg.measure.min_repeat_ms == 150 and cfg.measure.number == 20
    cfg = build_config({"measure": {"number": 7}}, {"target": "pynq-arm", "board.key": "pynq-lab2"})
    assert cfg.board.key == "pynq-lab2" and cfg.measure.number == 7 and cfg.measure.timeout_s == 120
    assert build_config(None, {}).board.key == "host"


def test_a_missing_cross_compiler_names_the_package(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match=r"arm-linux-gnueabihf-g\+\+.*apt-get install g\+\+-arm-linux-gnueabihf"):
        resolve_target("pynq-arm").check_toolchain()


def test_vta_packing_is_refused_for_gpu_presets_before_any_work():
    from vta_pipeline import steps
    from vta_pipeline.config import build_config

    cfg = build_config(None, {"target": "cuda", "quantize.enabled": True, "pack.enabled": True})
    with pytest.raises(ConfigError, match="without --vta"):
        steps.check_target(cfg, resolve_target("cuda"))


@pytest.mark.parametrize("preset", ["cuda", "pynq-arm"])
def test_a_flushed_retime_is_refused_where_tvm_cannot_flush_the_boards_caches(preset):
    from vta_pipeline import steps
    from vta_pipeline.config import build_config

    cfg = build_config(None, {"target": preset, "tune.retime_caches": "flushed"})
    with pytest.raises(ConfigError, match="--retime-caches warm or auto"):
        steps.check_target(cfg, resolve_target(preset))
    steps.check_target(build_config(None, {"target": preset, "tune.retime_caches": "auto"}), resolve_target(preset))


def test_targets_command_lists_target_host_key_and_cross_compiler():
    import json

    from typer.testing import CliRunner

    from vta_pipeline.cli.main import app

    out = CliRunner().invoke(app, ["targets", "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["name"]: r for r in json.loads(out.output)}
    assert list(rows) == PRESETS
    assert rows["pynq-arm"]["cross_compiler"] == "arm-linux-gnueabihf-g++" and rows["pynq-arm"]["key"] == "pynq"
    assert rows["rk3399-mali"]["host"]["mtriple"] == "aarch64-linux-gnu"
    table = CliRunner().invoke(app, ["targets"])
    assert table.exit_code == 0 and all(n in table.output for n in PRESETS)
    assert "aarch64-linux-gnu-g++" in table.output and "armv7a-linux-gnueabihf" in table.output


def test_a_cross_target_needs_a_tracker_not_the_local_board():
    from vta_pipeline import steps
    from vta_pipeline.config import build_config

    with pytest.raises(ConfigError, match="--tracker HOST:PORT.*'rk3399' boards"):
        steps.check_local_board(build_config(None, {"target": "rk3399-cpu"}), resolve_target("rk3399-cpu"))
    steps.check_local_board(
        build_config(None, {"target": "rk3399-cpu", "board.tracker": "lab:9190"}), resolve_target("rk3399-cpu")
    )
    if steps.local_device_exists("cuda"):  # a GPU machine's own board can run it
        steps.check_local_board(build_config(None, {"target": "cuda"}), resolve_target("cuda"))
    else:  # here it cannot: refused before any work (tests/test_cli.py checks the message)
        with pytest.raises(ConfigError, match="--tracker HOST:PORT.*'cuda' boards"):
            steps.check_local_board(build_config(None, {"target": "cuda"}), resolve_target("cuda"))


def test_vta_sim_runs_the_vta_path_on_the_simulator_board_and_refuses_without_it():
    from vta_pipeline import steps
    from vta_pipeline.config import build_config

    t = resolve_target("vta-sim")
    assert t.offload == "vta" and t.server_module == "vta_pipeline.vta.rpc_server" and t.kind == "llvm"
    assert t.to_dict()["offload"] == "vta" and "offload" not in resolve_target("host").to_dict()
    cfg = build_config(None, {"target": "vta-sim", "quantize.enabled": True, "pack.enabled": True})
    assert cfg.board.key == "vta-sim" and cfg.quantize.dtype_activation == "int8"  # VTA stores int8
    steps.check_target(cfg, t)
    with pytest.raises(ConfigError, match=r"target 'vta-sim' runs the network's packed int8 convs on VTA: add --vta"):
        steps.check_target(build_config(None, {"target": "vta-sim"}), t)
    x86 = build_config(
        None, {"target": "vta-sim", "quantize.enabled": True, "pack.enabled": True, "pack.layout": "x86"}
    )
    with pytest.raises(ConfigError, match=r"not --pack-layout x86"):
        steps.check_target(x86, t)
