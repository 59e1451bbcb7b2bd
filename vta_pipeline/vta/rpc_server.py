"""A VTA board: TVM's RPC server with the VTA simulator's functions registered in it.

    python -m vta_pipeline.vta.rpc_server --tracker HOST:PORT --key vta-sim [--sim-mode fsim]

takes the arguments of `python -m tvm.exec.rpc_server` that a board needs and registers,
in the server process before it serves any session (TVM's `server_init_callback`; sessions
are forked from it), the functions of `vta_pipeline.vta.remote`. It registers with the
tracker under its key like any other board, so tuning and evaluation reach it the same way,
and outlives a tracker outage as every board does (`vta_pipeline.boards.server`).

`--sim-mode`: `strict` (the default) runs every stream under the hardware's rules
(`simulator.STRICT`), as a bitstream would; `fsim` runs what VTA's functional simulator runs,
for comparisons. Give such a board a key of its own: its timings are not a bitstream's.
"""

from __future__ import annotations

import argparse

from ..boards.server import serve


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--sim-mode", choices=("strict", "fsim"), default="strict")
    args, rest = ap.parse_known_args(argv)

    def init() -> None:
        from . import remote, runtime
        from .simulator import SIM_MODES

        runtime.set_rules(SIM_MODES[args.sim_mode])
        remote.register()

    serve(init, "vta-sim", __doc__.splitlines()[0], rest)


if __name__ == "__main__":
    main()
