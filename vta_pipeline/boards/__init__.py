"""Boards: where tasks are measured and networks run.

- `tracker`: the tracker from a client's side (`BoardSpec`, free boards per key, preflight);
- `local`: `LocalBoard`, a tracker and rpc_server processes on 127.0.0.1 that the run owns
  (started, recorded, reaped);
- `probes`: calls on the boards themselves, each with a deadline (health check, identity,
  threads, device limits);
- `watchdog`: processes that die with the process that started them;
- `pools`, `builder`: the candidate builder and board runner pools every tuning task shares.

A board's own side (what runs on it, `python -m vta_pipeline.boards.server`) stays at the top
of the package: its module path is in our users' systemd units.
"""

from .local import REGISTRY, LocalBoard, log_tail, reap_orphans, stop_from_state
from .probes import (
    BOARD_INFO,
    BoardHung,
    board_identities,
    board_threads,
    check_boards,
    describe_boards,
    device_params,
    health_check,
    identity_problems,
    register_board_info,
    remote_identity,
    remote_threads,
    within,
)
from .tracker import (
    BoardSpec,
    count_servers,
    format_summary,
    free_and_registered,
    free_port,
    port_open,
    preflight,
    tracker_down_message,
    tracker_summary,
)

__all__ = [
    "BOARD_INFO",
    "REGISTRY",
    "BoardHung",
    "BoardSpec",
    "LocalBoard",
    "board_identities",
    "board_threads",
    "check_boards",
    "count_servers",
    "describe_boards",
    "device_params",
    "format_summary",
    "free_and_registered",
    "free_port",
    "health_check",
    "identity_problems",
    "log_tail",
    "port_open",
    "preflight",
    "reap_orphans",
    "register_board_info",
    "remote_identity",
    "remote_threads",
    "stop_from_state",
    "tracker_down_message",
    "tracker_summary",
    "within",
]
