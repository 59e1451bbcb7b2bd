"""A board whose timer lies: TVM's RPC server, with its time evaluator reporting 0 s.

    PYTHONPATH=tests python -m lying_board --tracker HOST:PORT --key liar

The kernels it is sent still run (their outputs are right); only the times it reports are
false, as a board with a broken clock or a patched runtime would report them. It registers
under its key like any other board (`LocalBoard(server_module="lying_board")`).
"""

from __future__ import annotations

import argparse
import time


def _init() -> None:
    import tvm
    import tvm_ffi

    real = tvm.get_global_func("runtime.RPCTimeEvaluator")

    def lying(mod, name, device_type, device_id, number, repeat, *rest):
        timer = real(mod, name, device_type, device_id, number, repeat, *rest)

        def run(*args):
            timer(*args)  # the code runs; its time is not what is reported
            return bytes(8 * repeat)  # `repeat` doubles, each 0.0

        return run

    tvm_ffi.register_global_func("runtime.RPCTimeEvaluator", lying, override=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9090)
    ap.add_argument("--port-end", type=int, default=9199)
    ap.add_argument("--tracker", required=True)
    ap.add_argument("--key", default="liar")
    args = ap.parse_args()
    from tvm import rpc

    host, port = args.tracker.rsplit(":", 1)
    server = rpc.Server(args.host, args.port, args.port_end, tracker_addr=(host, int(port)), key=args.key,
                        server_init_callback=_init)
    try:
        while server.proc.is_alive():
            time.sleep(1)
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
