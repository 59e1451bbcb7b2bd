"""TIR-level pieces the design spaces and the build use: our tensor intrinsics (the CPU's int8
dot product), the fast import of MetaSchedule's intrinsic registry, software prefetch of a
conv's next weights, and the schedule-rule warning TOPI's pooling blocks need silenced."""
