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
    [("hots", "Did you mean host"), ("{kind: llvm", "valid JSON"), ('{"mcpu": "x"}', '"kind"'),
     ('{"kind": "nosuchkind"}', "TVM rejects")],
)
def test_bad_targets(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        resolve_target(spec)
