"""A local board comes up however slow the machine, says why when it does not, and never
outlives the process that started it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from vta_pipeline import boards
from vta_pipeline.boards import LocalBoard, reap_orphans
from vta_pipeline.boards.liveness import identity
from vta_pipeline.errors import BoardError


def _gone(pids, timeout_s=5.0) -> list[int]:
    """The pids (and their children) still running after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _board_pids(root_pids) -> list[int]:
    out = []
    for pid in root_pids:
        try:
            p = psutil.Process(pid)
            out += [pid, *(c.pid for c in p.children(recursive=True))]
        except psutil.Error:
            pass
    return out


def start_owner(board: str) -> subprocess.Popen:
    """A process that starts the LocalBoard `board` (the Python expression, with `LocalBoard`
    and `Emulator` in scope), prints its processes' pids as a JSON line, and sleeps."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import json, time
        from vta_pipeline.boards import LocalBoard
        from vta_pipeline.boards.emulator import Emulator
        b = ({board}).start()
        print(json.dumps([p.pid for p in b.procs]), flush=True)
        time.sleep(600)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_board_dies_with_its_owner_when_the_owner_is_sigkilled(tmp_path):
    """The owner's whole board (tracker, servers and the workers they forked) is gone within
    seconds of a SIGKILL that gave the owner no chance to stop it."""
    owner = start_owner(
        f"LocalBoard(key='orphan', num_servers=2, log_dir={str(tmp_path / 'logs')!r}, "
        f"registry={str(tmp_path / 'registry')!r})"
    )
    try:
        pids = _board_pids(json.loads(owner.stdout.readline()))
        assert len(pids) >= 6  # tracker + 2 servers, each with its popen worker
        owner.kill()
        owner.wait(10)
        assert _gone(pids) == [], "board processes outlived their owner"
    finally:
        owner.kill()
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == [f"board-orphan-{logs[0].split('-')[2]}-{r}.log" for r in ("server1", "server2", "tracker")]


def test_reap_orphans_stops_a_recorded_board_whose_owner_died_and_leaves_live_owners_alone(tmp_path):
    registry = tmp_path / "registry"
    registry.mkdir()
    dead_owner = subprocess.Popen(["sleep", "60"])
    dead_ident = identity(dead_owner.pid)
    dead_owner.kill()
    dead_owner.wait()
    orphan = subprocess.Popen(["sleep", "600"], start_new_session=True)
    kept = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        (registry / "127.0.0.1-1.json").write_text(
            json.dumps({"tracker": "127.0.0.1:1", "key": "a", "owner": dead_ident, "procs": [identity(orphan.pid)]})
        )
        (registry / "127.0.0.1-2.json").write_text(
            json.dumps({"tracker": "127.0.0.1:2", "key": "b", "owner": identity(), "procs": [identity(kept.pid)]})
        )
        assert reap_orphans(registry) == ["127.0.0.1:1"]
        assert orphan.wait(10) == -signal.SIGKILL
        assert kept.poll() is None
        assert sorted(p.name for p in registry.iterdir()) == ["127.0.0.1-2.json"]
    finally:
        orphan.kill()
        kept.kill()


def test_a_recorded_pid_now_naming_another_process_is_not_signalled(tmp_path):
    registry = tmp_path / "registry"
    registry.mkdir()
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        stale = dict(identity(bystander.pid), start=identity(bystander.pid)["start"] - 3600)  # pid reused
        (registry / "127.0.0.1-3.json").write_text(
            json.dumps(
                {"tracker": "127.0.0.1:3", "key": "c", "owner": {"pid": 2**22 + 1, "start": 0}, "procs": [stale]}
            )
        )
        assert reap_orphans(registry) == []
        assert bystander.poll() is None and not (registry / "127.0.0.1-3.json").exists()
    finally:
        bystander.kill()


def test_a_server_that_exits_while_starting_is_named_with_the_tail_of_its_log(tmp_path, monkeypatch):
    def broken_server(self, record=True):
        return self._spawn(["tvm.exec.rpc_server", "--tracker", self.tracker, "--no-such-option"], "server1")

    monkeypatch.setattr(LocalBoard, "add_server", broken_server)
    b = LocalBoard(key="broken", num_servers=1, log_dir=tmp_path / "logs", registry=tmp_path / "registry")
    t0 = time.monotonic()
    with pytest.raises(BoardError) as e:
        b.start(timeout=300)
    msg = str(e.value)
    assert "rpc server 1 of 1" in msg and "exited with status 2" in msg
    assert "unrecognized arguments: --no-such-option" in msg  # the tail of its own output
    assert str(tmp_path / "logs") in msg
    assert time.monotonic() - t0 < 120  # failed when it exited, not at the deadline
    assert b.procs == [] and list((tmp_path / "registry").iterdir()) == []  # the tracker was stopped


def test_a_server_that_never_registers_is_named_when_the_start_times_out(tmp_path, monkeypatch, caplog):
    def lost_server(self, record=True):  # registers with a tracker nobody runs
        return self._spawn(
            [
                "tvm.exec.rpc_server",
                "--tracker",
                f"127.0.0.1:{boards.free_port()}",
                "--key",
                self.key,
                "--host",
                self.host,
            ],
            "server1",
        )

    monkeypatch.setattr(LocalBoard, "add_server", lost_server)
    monkeypatch.setattr(boards.local, "PROGRESS_EVERY_S", 2.0)
    b = LocalBoard(key="lost", num_servers=1, log_dir=tmp_path / "logs", registry=tmp_path / "registry")
    with caplog.at_level("INFO", logger="vta_pipeline.boards"), pytest.raises(BoardError) as e:
        b.start(timeout=25)
    msg = str(e.value)
    assert "rpc server 1 of 1" in msg and "was not up after 25 s" in msg
    assert "1 rpc server(s) to register under key 'lost' (0 of 1 so far)" in msg
    assert any("waiting for 1 rpc server(s)" in r.getMessage() for r in caplog.records)  # said while waiting


def test_a_board_started_detached_outlives_the_command_until_board_down(tmp_path):
    env = dict(
        os.environ,
        VTA_PIPELINE_BOARD_STATE=str(tmp_path / "board.json"),
        VTA_PIPELINE_BOARD_REGISTRY=str(tmp_path / "registry"),
    )
    cli = [sys.executable, "-m", "vta_pipeline.cli", "board"]
    port = boards.free_port()
    up = subprocess.run(
        [*cli, "up", "--key", "detached", "--servers", "1", "--port", str(port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert up.returncode == 0, up.stderr
    pids = _board_pids(json.loads((tmp_path / "board.json").read_text())["pids"])
    try:
        time.sleep(3)  # longer than a watchdog takes to notice a dead parent
        assert boards.count_servers("127.0.0.1", port, "detached") == 1
    finally:
        down = subprocess.run([*cli, "down"], env=env, capture_output=True, text=True, timeout=60)
    assert "stopped the board" in down.stdout
    assert _gone(pids) == []


def test_board_servers_start_without_tvm_ffis_pytorch_hook(tmp_path):
    """tvm_ffi's import asks torch.cuda.is_available() where PyTorch is installed, which
    initializes CUDA in the rpc_server before it forks a process per session; on a GPU board
    (an H200) every session then failed with cudaErrorInitializationError. The board's
    processes are started with the hook off."""
    with LocalBoard(key="nohook", num_servers=1, log_dir=tmp_path / "logs", registry=tmp_path / "registry") as b:
        for p in b.procs:
            for proc in [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]:
                assert proc.environ().get("TVM_FFI_DISABLE_TORCH_C_DLPACK") == "1", proc.cmdline()


def test_servers_started_together_search_for_their_ports_from_different_first_ports(tmp_path):
    """TVM's rpc_server binds with SO_REUSEADDR: two started at once from the same first port
    could both bind it, and the second died in `listen` ("Address already in use"; a CI run
    lost a 2-server board that way). Each of our servers starts its search at its own free
    port, and all of them register."""
    with LocalBoard(key="ports", num_servers=3, log_dir=tmp_path / "logs", registry=tmp_path / "registry") as b:
        firsts = []
        for p in b.procs[1:]:
            cmd = psutil.Process(p.pid).cmdline()
            firsts.append(int(cmd[cmd.index("--port") + 1]))
            assert int(cmd[cmd.index("--port-end") + 1]) > firsts[-1]
        assert len(set(firsts)) == 3, firsts
        assert boards.count_servers("127.0.0.1", b.port, "ports") == 3


def test_board_down_never_signals_a_process_that_took_a_recorded_pid(tmp_path):
    """A state file outlives a reboot; its pids may name other programs since. `board down`
    signals a recorded pid only while it is the process recorded (pid and start time), and in
    an older state file without start times only one that runs a board program."""
    from vta_pipeline.boards import stop_from_state
    from vta_pipeline.boards.liveness import identity

    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        other_start = dict(identity(bystander.pid), start=identity(bystander.pid)["start"] - 1000.0)
        for state in (
            {"tracker": "127.0.0.1:1", "key": "k", "pids": [bystander.pid], "procs": [other_start]},
            {"tracker": "127.0.0.1:1", "key": "k", "pids": [bystander.pid]},
        ):
            f = tmp_path / "board.json"
            f.write_text(json.dumps(state))
            assert stop_from_state(f)["key"] == "k" and not f.exists()
            assert bystander.poll() is None  # still running: not ours to stop
        f.write_text(
            json.dumps(
                {"tracker": "127.0.0.1:1", "key": "k", "pids": [bystander.pid], "procs": [identity(bystander.pid)]}
            )
        )
        stop_from_state(f)  # the very process recorded: stopped
        assert bystander.wait(10) is not None
    finally:
        bystander.kill()
