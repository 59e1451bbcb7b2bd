"""TOPI's pooling blocks are scheduled by MetaSchedule's generic rules, without a console warning."""

import tvm
from tvm import te, topi
from tvm.s_tir import meta_schedule as ms

from vta_pipeline.tir import intrin_registry, schedule_rules


def _max_pool():
    x = te.placeholder((1, 16, 32, 32), name="x")
    y = topi.nn.pool2d(
        x, kernel=(3, 3), stride=(2, 2), dilation=(1, 1), padding=(1, 1, 1, 1), pool_type="max", layout="NCHW"
    )
    return tvm.IRModule({"main": te.create_prim_func([x, y])})


def test_a_pooling_task_gets_its_design_space_without_the_unknown_rule_warning(capfd):
    mod = _max_pool()
    assert "meta_schedule.pool_max" in mod.script()  # what TOPI annotates for hand-written rules
    intrin_registry.load()  # what TuneContext imports, in seconds
    schedule_rules.register()
    schedule_rules.register()  # idempotent
    ctx = ms.TuneContext(
        mod=mod,
        target=tvm.target.Target({"kind": "llvm", "num-cores": 2}),
        space_generator="post-order-apply",
        task_name="pool",
    )
    spaces = ctx.generate_design_space()
    assert spaces  # the generic rules still schedule the block
    for sch in spaces:
        assert "schedule_rule" not in sch.mod.script()  # the annotation removed, as TVM does
    assert "Unknown schedule rule" not in capfd.readouterr().err
