"""VTA itself as a target: its configuration, its instruction set, a simulator that executes
it, the compiler of packed convs to it, and the knob tuner of those convs.

- `config`: the VTA hardware configuration (`VTAConfig`, VTA's `vta_config.json`).
- `isa`: VTA's 128-bit instructions (LOAD, STORE, GEMM, ALU, FINISH) and 32-bit micro-ops,
  encoded and decoded bit for bit as VTA's hardware spec lays them out, with field widths
  derived from the `VTAConfig`.
- `simulator`: executes an instruction stream as VTA's fetch, load, compute and store modules
  do, bit-exact, with a cycle model of its decoupled access-execute pipeline.
- `conv`: one packed conv (and its epilogue) compiled to an instruction stream for given knobs;
  `tasks`, `tuner`: the network's VTA convs as knob tasks and their search through a tracker;
  `runtime`, `network`, `remote`, `rpc_server`: the VTA calls of a built network, run on a
  board (`python -m vta_pipeline.vta.rpc_server` is one).

The facts behind them, with their sources, are in `docs/research/vta-hardware-notes.md`.
"""
