"""`vta-pipeline board up | status | down`: a local board, an RPC tracker and rpc_server
processes on this machine, started in the background and recorded in BOARD_STATE
($VTA_PIPELINE_BOARD_STATE, default ~/.vta-pipeline/board.json) for `status` and `down`;
`board serve`: this machine as one board of a rack, registered with a remote tracker."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from vta_pipeline.cli.common import _fail, _guard
from vta_pipeline.cli.options import TrackerOpt

board_app = typer.Typer(no_args_is_help=True, help="A local board: RPC tracker + rpc_server processes on 127.0.0.1.")

BOARD_STATE = Path(os.environ.get("VTA_PIPELINE_BOARD_STATE", "~/.vta-pipeline/board.json")).expanduser()


@board_app.command("up")
def board_up(
    key: Annotated[
        Optional[str], typer.Option(help="Key the servers register under (default: host, or vta-sim with --vta-sim).")
    ] = None,
    vta_sim: Annotated[
        bool,
        typer.Option(
            "--vta-sim",
            help="VTA simulator boards (for --target vta-sim): TVM's rpc_server with VTA's simulator "
            "registered, which runs the offloaded convs and times them in simulated cycles.",
        ),
    ] = False,
    sim_mode: Annotated[
        str,
        typer.Option(
            help="With --vta-sim: strict runs every stream under VTA's hardware rules (in-order command queues, "
            "VerifyDep, no ACC_8BIT, the shift range, the micro-op memory); fsim runs what VTA's functional "
            "simulator runs, for comparisons (give it a key of its own).",
        ),
    ] = "strict",
    servers: Annotated[
        int,
        typer.Option(
            help="Number of rpc_server processes (more than 1 time candidates against each other on these cores)."
        ),
    ] = 1,
    threads: Annotated[
        Optional[int],
        typer.Option(
            help="Threads each server runs kernels with (TVM_NUM_THREADS; default: this machine's logical CPUs)."
        ),
    ] = None,
    port: Annotated[int, typer.Option(help="Tracker port.")] = 9190,
    host: Annotated[str, typer.Option(help="Bind address (keep 127.0.0.1 unless boards are remote).")] = "127.0.0.1",
    emulate: Annotated[
        Optional[str],
        typer.Option(
            help="Emulated boards of this CPU (aarch64): its own TVM runtime under qemu-user, for cross-compiled "
            "targets (rk3399-cpu); timings are qemu's. Set up once with `board emulator-setup ARCH`.",
        ),
    ] = None,
    qemu_cpu: Annotated[
        Optional[str],
        typer.Option(
            help="With --emulate: the core qemu emulates (e.g. cortex-a72 for RK3399: code using an instruction "
            "the core lacks faults as on the board); default max, every instruction qemu knows.",
        ),
    ] = None,
):
    """Start a tracker and N servers in the background; `board down` stops them."""
    from vta_pipeline.boards import LocalBoard
    from vta_pipeline.boards.emulator import Emulator
    from vta_pipeline.config import board_key_problem

    if key is not None and board_key_problem(key):
        _fail(board_key_problem(key))
    if sim_mode not in ("strict", "fsim"):
        _fail(f"--sim-mode {sim_mode!r}: strict (VTA's hardware rules) or fsim (VTA's functional simulator)")
    if vta_sim and emulate:
        _fail("--vta-sim and --emulate: a VTA simulator board runs on this machine's CPU; give one of them")
    if qemu_cpu and not emulate:
        _fail("--qemu-cpu is for an emulated board: add --emulate aarch64")
    emulator = _guard(lambda: Emulator.of(emulate, cpu=qemu_cpu)) if emulate else None
    if BOARD_STATE.exists():
        _fail(f"a local board is already recorded in {BOARD_STATE}: run `vta-pipeline board down` first")
    key = key or ("vta-sim" if vta_sim else f"{emulator.arch.name}-emulated" if emulator else "host")
    module = "vta_pipeline.vta.rpc_server" if vta_sim else "vta_pipeline.boards.server"
    b = _guard(
        lambda: LocalBoard(
            key=key,
            num_servers=servers,
            host=host,
            port=port,
            state_file=BOARD_STATE,
            detached=True,
            threads=threads,
            server_module=module,
            server_args=("--sim-mode", sim_mode) if vta_sim else (),
            emulator=emulator,
        ).start()
    )
    kind = "VTA simulator " if vta_sim else f"emulated {emulator.arch.name} " if emulator else ""
    typer.echo(
        f"tracker {b.tracker}, {servers} {kind}server(s) under key {key!r}, {b.threads} thread(s) each; "
        f"use --tracker {b.tracker} --key {key}"
    )


@board_app.command("emulator-setup")
def board_emulator_setup(
    arch: Annotated[str, typer.Argument(help="The CPU to emulate: aarch64 (rk3399-cpu's).")] = "aarch64",
):
    """Set up an emulated board's CPU once (idempotent): an aarch64 Python from Debian's archive and
    TVM's aarch64 wheels at this host's versions, under ~/.cache/vta-pipeline/emulators
    ($VTA_PIPELINE_EMULATORS). Needs qemu-user, apt (with the arm64 architecture added) and uv."""
    from vta_pipeline.boards.emulator import setup

    em = _guard(lambda: setup(arch, say=typer.echo))
    typer.echo(f"emulated {em.arch.name} Python: {em.python}")


@board_app.command("serve")
def board_serve(
    tracker: Annotated[str, typer.Option(help="HOST:PORT of the rack's RPC tracker.")],
    key: Annotated[str, typer.Option(help="Key this board registers under (the boards of one kind share one).")],
    host: Annotated[
        str, typer.Option(help="Address to listen on for sessions (0.0.0.0: every interface).")
    ] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="First port to try for sessions.")] = 9090,
    custom_addr: Annotated[
        Optional[str],
        typer.Option(
            help="The address the tracker hands out for this board (where clients cannot reach the one it sees)."
        ),
    ] = None,
):
    """Serve this machine as a board of the rack, in the foreground, until Ctrl-C or SIGTERM;
    re-registers by itself after a tracker outage of any length (vta_pipeline.boards.server)."""
    from vta_pipeline.boards.server import main
    from vta_pipeline.config import board_key_problem, parse_hostport

    if board_key_problem(key):
        _fail(board_key_problem(key))
    try:
        parse_hostport(tracker)
    except ValueError as e:
        _fail(str(e))
    main(
        [
            "--tracker",
            tracker,
            "--key",
            key,
            "--host",
            host,
            "--port",
            str(port),
            "--port-end",
            str(port + 100),
            *(["--custom-addr", custom_addr] if custom_addr else []),
        ]
    )


@board_app.command("status")
def board_status(tracker: TrackerOpt = None):
    """Show the tracker's servers and queue (like tvm.exec.query_rpc_tracker)."""
    from vta_pipeline.boards import format_summary, tracker_summary
    from vta_pipeline.config import parse_hostport

    if tracker is None:
        if not BOARD_STATE.exists():
            _fail("no local board is running and no --tracker was given")
        tracker = json.loads(BOARD_STATE.read_text())["tracker"]
    try:
        addr = parse_hostport(tracker)
    except ValueError as e:
        _fail(str(e))
    typer.echo(_guard(lambda: format_summary(tracker_summary(*addr))))


@board_app.command("down")
def board_down():
    """Stop the local board started by `board up`."""
    from vta_pipeline.boards import stop_from_state

    state = stop_from_state(BOARD_STATE)
    typer.echo("no local board was running" if state is None else f"stopped the board at {state['tracker']}")
