"""A board: TVM's RPC server registered with a tracker, that outlives a tracker outage.

    python -m vta_pipeline.boards.server --tracker HOST:PORT --key rk3399 [--host 0.0.0.0]
    vta-pipeline board serve --tracker HOST:PORT --key rk3399            (the same)

TVM's own `rpc_server --tracker` gives up when its tracker has been unreachable for 60 s
(`rpc.base.connect_with_retry` raises in the server's listening thread, which ends while its
process stays up): after a tracker restart that took longer (a host reboot, an upgrade) every
board of the rack is up but registered nowhere, until someone logs in to each and restarts
it. This front runs the same `rpc.Server` and watches the tracker every CHECK_S; after an
outage, a server the tracker has not listed under its key for UNLISTED_S (or one whose
process ended) is replaced by a new one, once the tracker answers again (however long that
takes: it logs every minute what it waits for). A server that keeps
dying while the tracker answers is not restarted for ever: after MAX_QUICK_DEATHS exits,
each within QUICK_S of its start, it stops with the reason.
"""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import socket
import time
from collections.abc import Callable

log = logging.getLogger("vta_pipeline.boards.server")

CHECK_S = 5.0
UNLISTED_S = 20.0
SAY_EVERY_S = 60.0
QUICK_S = 30.0
MAX_QUICK_DEATHS = 5


def _tracker_answers(tracker: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(tracker, timeout=2.0):
            return True
    except OSError:
        return False


def _listed(tracker: tuple[str, int], key: str, port: int) -> bool | None:
    """Whether the tracker lists a server under `key` on `port` (None: it did not answer)."""
    from tvm import rpc

    try:
        info = rpc.connect_tracker(*tracker).summary().get("server_info", [])
    except Exception:  # noqa: BLE001 - a tracker going down mid-question: ask again later
        return None
    return any(s.get("key") == f"server:{key}" and list(s.get("addr") or [None, None])[1] == port for s in info)


def _sleep(seconds: float, stopping: Callable[[], bool]) -> None:
    end = time.monotonic() + seconds
    while not stopping() and time.monotonic() < end:
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))


def _wait_for_tracker(tracker: tuple[str, int], stopping: Callable[[], bool]) -> None:
    t0 = said = time.monotonic()
    while not stopping() and not _tracker_answers(tracker):
        if time.monotonic() - said >= SAY_EVERY_S:
            said = time.monotonic()
            log.warning("the tracker %s:%d has not answered for %.0f s; still waiting for it", *tracker, said - t0)
        _sleep(CHECK_S / 2, stopping)


def _supervise(server, tracker: tuple[str, int], key: str, stopping: Callable[[], bool]) -> str:
    """Wait while `server` serves; return why it must be replaced ('' when stopping).

    The tracker's listing is asked only after an outage: a server in a long session must
    never be taken for a lost one."""
    outage_ended_at = None
    was_down = False
    while not stopping():
        _sleep(CHECK_S, stopping)
        if stopping():
            return ""
        if not server.proc.is_alive():
            return "its process ended"
        if not _tracker_answers(tracker):
            was_down, outage_ended_at = True, None
            continue
        if was_down:  # back: TVM's listening thread re-registers by itself if it had not given up yet
            was_down, outage_ended_at = False, time.monotonic()
        if outage_ended_at is None:
            continue
        if _listed(tracker, key, server.port):
            outage_ended_at = None
        elif time.monotonic() - outage_ended_at >= UNLISTED_S:
            return (
                f"the tracker has not listed it for {UNLISTED_S:.0f} s after an outage (TVM's server gives up "
                "on a tracker unreachable for 60 s)"
            )
    return ""


def _session_init(init: Callable[[], None] | None) -> None:
    """Run in the server's process before it serves: every session can ask who the board is."""
    from . import register_board_info

    register_board_info()
    if init is not None:
        init()


def serve(init: Callable[[], None] | None, default_key: str, description: str, argv: list[str] | None = None) -> None:
    """Serve sessions (each started with `init`, where given) under a key at a tracker until
    SIGTERM/SIGINT, replacing the server as the module's docstring says. Takes the LocalBoard
    command line: --host --port --port-end --tracker --key."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    ap.add_argument("--port", type=int, default=9090)
    ap.add_argument("--port-end", type=int, default=9199)
    ap.add_argument("--tracker", required=True, help="HOST:PORT of the RPC tracker")
    ap.add_argument("--key", default=default_key)
    ap.add_argument("--custom-addr", default=None, help="the address the tracker hands out for this board")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from tvm import rpc

    host, port = args.tracker.rsplit(":", 1)
    tracker = (host, int(port))
    stop = {"now": False}

    def on_signal(signum, _frame) -> None:
        stop["now"] = True

    def stopping() -> bool:
        return stop["now"]

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    quick_deaths = 0
    while not stopping():
        _wait_for_tracker(tracker, stopping)
        if stopping():
            break
        started = time.monotonic()
        server = rpc.Server(
            args.host,
            args.port,
            args.port_end,
            tracker_addr=tracker,
            key=args.key,
            custom_addr=args.custom_addr,
            server_init_callback=functools.partial(_session_init, init),
        )
        try:
            why = _supervise(server, tracker, args.key, stopping)
        finally:
            server.terminate()
        if not why:
            break
        lived = time.monotonic() - started
        quick_deaths = quick_deaths + 1 if lived < QUICK_S + UNLISTED_S and _tracker_answers(tracker) else 0
        if quick_deaths >= MAX_QUICK_DEATHS:
            raise SystemExit(
                f"the RPC server under key {args.key!r} had to be replaced {quick_deaths} times in a row "
                f"soon after its start while the tracker {args.tracker} answered ({why}): see the errors "
                "above; not starting it again"
            )
        log.warning(
            "replacing the RPC server under key %r after %.0f s: %s; it registers again once the tracker %s answers",
            args.key,
            lived,
            why,
            args.tracker,
        )


def main(argv: list[str] | None = None) -> None:
    serve(None, "host", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
