"""Silence MetaSchedule's "Unknown schedule rule" warning for TOPI's pooling blocks.

TOPI annotates its pooling blocks with `schedule_rule = "meta_schedule.pool_max"` (and
pool_avg, adaptive_pool_max, adaptive_pool_avg) for targets that bring a hand-written rule.
No CPU rule is registered in TVM 0.27, so MetaSchedule's ApplyCustomRule logs a WARNING on
the console for every pooling task, removes the annotation and lets the generic rules
schedule the block. That message is about TVM's own packaging and nobody running a tuning
job can act on it.

We register, for the target keys we tune on, a rule that does exactly what ApplyCustomRule
does when it finds none (remove the annotation, return the schedule unchanged; see
src/s_tir/meta_schedule/schedule_rule/apply_custom_rule.cc), so the search space, and the
tuned schedules, are the same as before, without the warning.
"""

from __future__ import annotations

POOL_RULES = ("pool_max", "pool_avg", "adaptive_pool_max", "adaptive_pool_avg")
TARGET_KEYS = ("cpu", "arm_cpu")


def _leave_to_generic_rules(sch, block):
    sch.unannotate(block, "schedule_rule")
    return [sch]


def register() -> None:
    """Register the pass-through rules in this process (idempotent; a rule TVM or a user
    registered first is kept)."""
    import tvm_ffi

    for key in TARGET_KEYS:
        for rule in POOL_RULES:
            name = f"s_tir.meta_schedule.{key}.meta_schedule.{rule}"
            if tvm_ffi.get_global_func(name, allow_missing=True) is None:
                tvm_ffi.register_global_func(name, _leave_to_generic_rules)
