"""A board whose timer lies: TVM's RPC server, with its time evaluator reporting 0 s.

    PYTHONPATH=tests python -m lying_board --tracker HOST:PORT --key liar

The kernels it is sent still run (their outputs are right); only the times it reports are
false, as a board with a broken clock or a patched runtime would report them. It registers
under its key like any other board (`LocalBoard(server_module="lying_board")`).
"""

from __future__ import annotations


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
    from vta_pipeline.boards.server import serve

    serve(_init, "liar", __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
