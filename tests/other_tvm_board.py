"""A board that runs another TVM: the project's board server, its sessions reporting TVM 0.19.0.

    PYTHONPATH=tests python -m other_tvm_board --tracker HOST:PORT --key oldtvm

What a rack board left on an older TVM looks like to a run: it registers and answers like
any other (`LocalBoard(server_module="other_tvm_board")`), and says which TVM it runs.
"""

from __future__ import annotations

OTHER_VERSION = "0.19.0"


def _init() -> None:
    import tvm

    tvm.__version__ = OTHER_VERSION  # what `vta_pipeline.board_info` reports


def main() -> None:
    from vta_pipeline.boards.server import serve

    serve(_init, "oldtvm", __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
