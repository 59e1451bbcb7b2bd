"""A VTA board: TVM's RPC server with the VTA simulator's functions registered in it.

    python -m vta_pipeline.vta.rpc_server --tracker HOST:PORT --key vta-sim

takes the arguments of `python -m tvm.exec.rpc_server` that a board needs and registers,
in the server process before it serves any session (TVM's `server_init_callback`; sessions
are forked from it), the functions of `vta_pipeline.vta.remote`. It registers with the
tracker under its key like any other board, so tuning and evaluation reach it the same way.
"""

from __future__ import annotations

import argparse
import time


def _init() -> None:
    from vta_pipeline.vta import remote

    remote.register()


def main(argv: list[str] | None = None) -> None:
    serve(_init, "vta-sim", __doc__.splitlines()[0], argv)


def serve(init, default_key: str, description: str, argv: list[str] | None = None) -> None:
    """An RPC server registered with a tracker whose sessions start with `init` (the LocalBoard
    command line: --host --port --port-end --tracker --key), until its server process ends."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9090)
    ap.add_argument("--port-end", type=int, default=9199)
    ap.add_argument("--tracker", required=True, help="HOST:PORT of the RPC tracker")
    ap.add_argument("--key", default=default_key)
    args = ap.parse_args(argv)
    from tvm import rpc

    host, port = args.tracker.rsplit(":", 1)
    server = rpc.Server(args.host, args.port, args.port_end, tracker_addr=(host, int(port)), key=args.key,
                        server_init_callback=init)
    try:
        while server.proc.is_alive():
            time.sleep(1)
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
