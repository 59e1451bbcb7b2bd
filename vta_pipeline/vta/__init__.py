"""VTA itself as a target: its instruction set, a simulator that executes it, and (to come)
the compiler of packed convs to it.

- `isa`: VTA's 128-bit instructions (LOAD, STORE, GEMM, ALU, FINISH) and 32-bit micro-ops,
  encoded and decoded bit for bit as VTA's hardware spec lays them out, with field widths
  derived from the `VTAConfig`.
- `simulator`: executes an instruction stream as VTA's fetch, load, compute and store modules
  do, bit-exact, with a cycle model of its decoupled access-execute pipeline.

The facts behind both, with their sources, are in `docs/research/vta-hardware-notes.md`.
"""
