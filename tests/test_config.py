"""Options are validated up front, and errors name the key and the fix."""

import json

import pytest

from vta_pipeline.config import build_config, load_config_file, parse_hostport
from vta_pipeline.errors import ConfigError


def test_defaults_run_the_builtin_model_on_a_local_board():
    cfg = build_config(None, {})
    assert cfg.model.source == "builtin" and cfg.model.name == "tinynet"
    assert cfg.board.tracker is None and cfg.target == "host"
    assert cfg.measure.timeout_s == 60  # the old recipe's timeout, not RPCRunner's 10 s


def test_flags_override_the_config_file(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"tune": {"trials_per_task": 100}, "board": {"key": "pynq"}}))
    cfg = build_config(load_config_file(f), {"tune.trials_per_task": 7})
    assert cfg.tune.trials_per_task == 7 and cfg.board.key == "pynq"


@pytest.mark.parametrize(
    "values, needle",
    [
        ({"tune": {"trials_per_task": 0}}, "tune.trials_per_task"),
        ({"tune": {"trials_per_task": -5}}, "tune.trials_per_task"),
        ({"tune": {"trails_per_task": 5}}, "tune.trails_per_task"),  # a typo is an unknown key
        ({"measure": {"number": "five"}}, "measure.number"),
        ({"board": {"tracker": "localhost"}}, "HOST:PORT"),
        ({"model": {"source": "keras"}}, "model.source"),
        ({"model": {"source": "onnx"}}, "--onnx-path"),
        ({"tune": {"records_library": "/no/such/library"}}, "library export --out DIR"),
    ],
)
def test_bad_values_name_the_key(values, needle):
    with pytest.raises(ConfigError) as e:
        build_config(values, {}, source="nightly.json")
    assert needle in str(e.value) and "nightly.json" in str(e.value)


def test_config_file_problems(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config_file(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[tune\ntrials = 3")
    with pytest.raises(ConfigError, match="not valid toml"):
        load_config_file(bad)


def test_tracker_addresses():
    assert parse_hostport("10.0.0.5:9190") == ("10.0.0.5", 9190)
    for bad in ("9190", "host:", "host:99999", ":9190"):
        with pytest.raises(ValueError):
            parse_hostport(bad)


def test_int8_sections_of_a_config_file(tmp_path):
    from vta_pipeline.config import build_config, load_config_file

    f = tmp_path / "vta.toml"
    f.write_text(
        '[quantize]\nenabled = true\ncalibrate_mode = "percentile"\nskip_conv_layers = [0, 3]\n'
        '[pack]\nenabled = true\nstart_name = "nn.conv2d"\nstart_name_idx = 9\n[vta]\nLOG_BLOCK = 5\n'
    )
    cfg = build_config(load_config_file(f), {})
    assert cfg.quantize.enabled and cfg.quantize.skip_conv_layers == (0, 3)
    assert cfg.pack.start_name_idx == 9 and cfg.vta.BLOCK_OUT == 32
    f.write_text("[vta]\nLOG_BLOK = 5\n")
    with pytest.raises(ConfigError, match="vta.LOG_BLOK"):
        build_config(load_config_file(f), {})
