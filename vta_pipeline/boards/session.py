"""A run's boards, brought up and checked before any work: `open_session`.

Without a tracker in the config the run starts a local board (a tracker and rpc servers on
127.0.0.1, stopped when the session ends); with one, it uses that tracker's boards. Either
way, before anything is fetched or tuned: the key has boards (preflight), one of them
builds and runs a kernel of the target (health check), each says who it is (its name, TVM
version and threads: a board on another TVM or with other threads than the target is
scheduled for is refused, or with `board.mismatch: warn` named and used), and a GPU target
reads its limits off a board, not a typical board's.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..config import PipelineConfig, parse_hostport
from ..targets import ResolvedTarget
from .emulator import Emulator
from .local import LocalBoard
from .probes import check_boards, describe_boards, device_params, health_check
from .tracker import preflight


@dataclass
class BoardSession:
    """The boards a run measures and evaluates on, as checked when the session opened."""

    tracker: str  # HOST:PORT
    host: str
    port: int
    key: str
    boards: int  # free boards under the key (at most `board.max_boards`)
    target: ResolvedTarget  # the run's target, with the limits read off a board where it reads them
    threads: int | None  # what the boards reported (CPU targets)
    identities: list[dict[str, Any]] = field(default_factory=list)
    health_ms: float | None = None

    def board_spec(self, in_flight: int) -> dict[str, Any]:
        """Where one of `in_flight` concurrent tuning tasks measures (`boards.BoardSpec` as JSON):
        the boards shared out among the tasks in flight, and who they are."""
        return {
            "tracker_host": self.host,
            "tracker_port": self.port,
            "key": self.key,
            "num_boards": max(1, self.boards // in_flight),
            "threads": self.threads,
            **describe_boards(self.identities),
        }


@contextmanager
def open_session(
    cfg: PipelineConfig, target: ResolvedTarget, log_dir: Path, log: logging.Logger | logging.LoggerAdapter
) -> Iterator[BoardSession]:
    """The run's boards, checked (module docstring); a local board stops when the session ends."""
    key = cfg.board.key
    local = None
    if cfg.board.tracker is None:
        emulator = Emulator.for_target(target) if cfg.board.emulate else None
        local = LocalBoard(
            key=key,
            num_servers=cfg.board.local_servers,
            log_dir=log_dir,
            threads=cfg.board.local_threads or target.cpu_threads,
            # an emulated board says who it is (that it is emulated): our server front registers it
            server_module="vta_pipeline.boards.server" if emulator else target.server_module,
            emulator=emulator,
        )
        log.info(
            "starting a local board: tracker + %d rpc server(s) on 127.0.0.1, key %r, %d thread(s)%s",
            local.num_servers,
            key,
            local.threads,
            f", emulated: {emulator.arch.name} ({emulator.cpu}) under qemu (timings are qemu's, not the board's)"
            if emulator
            else "",
        )
        local.start()
    try:
        if local is not None:
            tracker, want_threads = local.tracker, local.threads  # --local-threads: the user's choice
        else:
            tracker, want_threads = cfg.board.tracker, target.cpu_threads
        host, port = parse_hostport(tracker)
        n_boards = preflight(host, port, key)
        if cfg.board.max_boards:
            n_boards = min(n_boards, cfg.board.max_boards)
        health_ms = health_check(host, port, key, dict(target.target_json), cross_compiler=target.cross_compiler)
        log.info(
            "tracker %s: %d board(s) under key %r; health check passed (%.4f ms)", tracker, n_boards, key, health_ms
        )
        identities, problems = check_boards(
            host, port, key, n_boards, want_threads if target.cpu_threads else None, cfg.board.mismatch
        )
        for p in problems:
            log.warning("board.mismatch warn: %s", p)
        log.info(
            "boards under key %r: %s",
            key,
            "; ".join(
                f"{b.get('name') or 'a stock rpc_server'} (TVM {b.get('tvm') or '?'}, {b.get('threads') or '?'} "
                "thread(s))"
                for b in identities
            ),
        )
        if target.query_device:  # the board's own GPU limits, not a typical board's
            params = device_params(host, port, key, target.device)
            target = target.with_device_params(params)
            log.info("%s limits read from a board under key %r: %s", target.device, key, params)
        yield BoardSession(
            tracker=tracker,
            host=host,
            port=port,
            key=key,
            boards=n_boards,
            target=target,
            threads=(identities[0].get("threads") if target.cpu_threads else None) or None,
            identities=identities,
            health_ms=health_ms,
        )
    finally:
        if local is not None:
            local.stop()
