"""A VTA board: TVM's RPC server with the VTA simulator's functions registered in it.

    python -m vta_pipeline.vta.rpc_server --tracker HOST:PORT --key vta-sim

takes the arguments of `python -m tvm.exec.rpc_server` that a board needs and registers,
in the server process before it serves any session (TVM's `server_init_callback`; sessions
are forked from it), the functions of `vta_pipeline.vta.remote`. It registers with the
tracker under its key like any other board, so tuning and evaluation reach it the same way,
and outlives a tracker outage as every board does (`vta_pipeline.boards.server`).
"""

from __future__ import annotations

from ..boards.server import serve


def _init() -> None:
    from . import remote

    remote.register()


def main(argv: list[str] | None = None) -> None:
    serve(_init, "vta-sim", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
