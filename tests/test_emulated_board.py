"""Emulated boards: TVM's own aarch64 runtime under qemu-user, behind a real tracker.

What these prove is what emulation can: the code we cross-compile for an ARM board loads in
the board's TVM runtime and computes the right numbers there (bit for bit, for int8), the
whole DAG runs through it, and its timings are marked as qemu's everywhere and kept out of
the records library and the regression guard. Not speed.

They need the emulator set up once (`vta-pipeline board emulator-setup aarch64`, which
`.ci/run` runs); CI sets VTA_PIPELINE_REQUIRE_EMULATOR=1 so that a missing one fails them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import numpy as np
import psutil
import pytest
import tvm
from int8_nets import dot_kernel
from test_boards import _board_pids, _gone, start_owner

from vta_pipeline import steps
from vta_pipeline.boards import LocalBoard, remote_identity
from vta_pipeline.boards.emulator import Emulator
from vta_pipeline.config import build_config
from vta_pipeline.errors import ConfigError
from vta_pipeline.report import RunResult, render
from vta_pipeline.search import records_library
from vta_pipeline.store import history
from vta_pipeline.store.artifacts import ArtifactStore
from vta_pipeline.targets import resolve_target

EMULATOR = Emulator.of("aarch64")
REQUIRED = os.environ.get("VTA_PIPELINE_REQUIRE_EMULATOR") == "1"
if EMULATOR.problem() and REQUIRED:
    raise RuntimeError(f"VTA_PIPELINE_REQUIRE_EMULATOR=1, but {EMULATOR.problem()}")
needs_emulator = pytest.mark.skipif(EMULATOR.problem() is not None, reason=str(EMULATOR.problem()))

RK3588 = resolve_target("rk3588-cpu")  # Cortex-A76: NEON and the dot product, both emulated by qemu's cortex-a76


@pytest.fixture(scope="module")
def emulated_board(tmp_path_factory):
    """One emulated aarch64 board (a Cortex-A76, which has both of ARM's int8 forms)."""
    b = LocalBoard(
        key="emu",
        log_dir=tmp_path_factory.mktemp("emu-logs"),
        threads=2,
        server_module="vta_pipeline.boards.server",
        emulator=Emulator.of("aarch64", cpu="cortex-a76"),
    ).start()
    yield b
    b.stop()


def _session(board: LocalBoard):
    from tvm import rpc

    return rpc.connect_tracker("127.0.0.1", board.port).request(board.key, session_timeout=300)


@needs_emulator
def test_an_emulated_board_runs_tvms_aarch64_runtime_and_says_it_is_emulated(emulated_board):
    remote = _session(emulated_board)
    who = remote_identity(remote)
    assert who["emulated"].startswith("qemu-aarch64 ") and who["emulated"].endswith("-cpu cortex-a76")
    assert who["name"].endswith("(emulated aarch64)")
    assert who["tvm"] == tvm.__version__  # the registry's aarch64 wheel of this host's TVM
    assert who["threads"] == 2


@needs_emulator
def test_arms_int8_dot_products_are_exact_on_the_emulated_core(emulated_board, tmp_path):
    """NEON's smull/saddlp/addp form (ARMv8.0: RK3399) and the sdot form (ARMv8.2: RK3588),
    every lane count, uint8 data in [0, 127] and int8 data, operands at their extremes:
    compiled for aarch64, run by the board's runtime, equal to numpy in int64."""
    from tvm.support import cc

    remote = _session(emulated_board)
    cases = [
        (spec, lanes, signed)
        for spec in (resolve_target("rk3399-cpu").target_json, RK3588.target_json)
        for lanes in (16, 8, 4)
        for signed in (False, True)
    ]
    for n, (spec, lanes, signed) in enumerate(cases):
        name, lib = dot_kernel(lanes, signed, spec)
        asm = lib.mod.inspect_source("asm") if hasattr(lib, "mod") else lib.inspect_source("asm")
        assert ("sdot" if spec is RK3588.target_json else "smull") in asm, name
        assert name.endswith("_sdot" if "+dotprod" in spec["mattr"] else "_neon")
        path = tmp_path / f"dot{n}.so"
        lib.export_library(str(path), fcompile=cc.cross_compiler("aarch64-linux-gnu-g++"))
        remote.upload(str(path))
        f = remote.load_module(path.name)
        rng = np.random.default_rng(n)
        lo = -128 if signed else 0
        a = rng.integers(lo, 128, (32, 64)).astype("int8" if signed else "uint8")
        a[0], a[1] = lo, 127
        b = rng.integers(-127, 128, (16, lanes, 4)).astype("int8")
        b[:, 0], b[:, -1] = -127, 127
        ref = a.astype(np.int64) @ b.transpose(0, 2, 1).reshape(64, lanes).astype(np.int64)
        dev = remote.cpu(0)
        c = tvm.runtime.tensor(np.zeros((32, lanes), "int32"), dev)
        f(tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
        assert np.array_equal(c.numpy(), ref), name


@needs_emulator
def test_the_emulated_core_is_the_targets_so_an_instruction_it_lacks_faults_as_on_the_board(tmp_path):
    """rk3399-cpu's board emulates a Cortex-A72 (ARMv8.0): ARMv8.2's sdot is an illegal
    instruction there, as on an RK3399, and runs on rk3588-cpu's Cortex-A76."""
    src = tmp_path / "sdot.c"
    src.write_text('int main(void) { __asm__ volatile("sdot v0.4s, v1.16b, v2.16b"); return 0; }\n')
    exe = tmp_path / "sdot"
    subprocess.run(
        ["aarch64-linux-gnu-gcc", "-static", "-march=armv8.2-a+dotprod", str(src), "-o", str(exe)], check=True
    )
    codes = {}
    for preset in ("rk3399-cpu", "rk3588-cpu"):
        em = Emulator.for_target(resolve_target(preset))
        env = em.env(dict(os.environ))  # what the board's processes run under
        codes[em.cpu] = subprocess.run([em.arch.qemu, str(exe)], env=env, capture_output=True).returncode
    assert codes["cortex-a72"] in (-signal.SIGILL, 128 + signal.SIGILL) and codes["cortex-a76"] == 0


@needs_emulator
def test_an_emulated_board_never_outlives_its_owner(tmp_path):
    """SIGKILL the process that started an emulated board: its tracker, its qemu servers and
    the workers they started are gone within seconds."""
    owner = start_owner(
        f"LocalBoard(key='emu-orphan', log_dir={str(tmp_path / 'logs')!r}, registry={str(tmp_path / 'reg')!r}, "
        "server_module='vta_pipeline.boards.server', emulator=Emulator.of('aarch64'))"
    )
    try:
        pids = _board_pids(json.loads(owner.stdout.readline()))
        assert any("qemu-aarch64" in " ".join(psutil.Process(p).cmdline()) for p in pids if psutil.pid_exists(p))
        owner.kill()
        owner.wait(10)
        assert _gone(pids, timeout_s=10.0) == [], "emulated board processes outlived their owner"
    finally:
        owner.kill()


def test_emulate_is_refused_before_any_work_where_it_cannot_run(tmp_path, monkeypatch):
    """--emulate on a target of this machine, with a rack's tracker, on armv7 (no TVM
    runtime for it), or before the emulator is set up: a ConfigError naming the fix."""

    def check(target: str, **more) -> str:
        cfg = build_config(None, {"target": target, "board.emulate": True, **more})
        with pytest.raises(ConfigError) as e:
            steps.check_local_board(cfg, resolve_target(target))
        return str(e.value)

    assert "nothing to emulate" in check("host")
    assert "drop one" in check("rk3399-cpu", **{"board.tracker": "lab:9190"})
    assert "armv7" in check("pynq-arm") and "docs/boards-and-targets.md" in check("pynq-arm")
    assert "qemu does not emulate" in check("rk3399-mali")
    monkeypatch.setattr(Emulator, "for_target", classmethod(lambda cls, t: Emulator.of("aarch64", home=tmp_path)))
    assert "vta-pipeline board emulator-setup aarch64" in check("rk3399-cpu")
    # without --emulate, a cross target's local board says that emulation is the way to rehearse
    with pytest.raises(ConfigError, match="--emulate"):
        steps.check_local_board(build_config(None, {"target": "rk3399-cpu"}), resolve_target("rk3399-cpu"))


def test_an_emulated_run_takes_a_key_of_its_own_and_a_longer_measurement_timeout():
    emulated = build_config(None, {"target": "rk3399-cpu", "board.emulate": True})
    real = build_config(None, {"target": "rk3399-cpu"})
    assert (emulated.board.key, real.board.key) == ("rk3399-emulated", "rk3399")
    assert emulated.measure.timeout_s == 10 * real.measure.timeout_s  # qemu is slower than the board
    assert (
        build_config(None, {"target": "rk3399-cpu", "board.emulate": True, "measure.timeout_s": 5}).measure.timeout_s
        == 5
    )
    given = build_config(None, {"target": "rk3399-cpu", "board.emulate": True, "board.key": "lab"})
    assert given.board.key == "lab"


@pytest.mark.slow
@needs_emulator
@pytest.mark.parametrize("int8", [False, True], ids=["fp32-through-a-tracker", "int8-local-emulated-board"])
def test_the_whole_dag_runs_on_an_emulated_rk3399_and_its_times_stay_marked(
    prefect_harness, emulated_board, tmp_path, int8
):
    """micronet through fetch, (quantize,) extract, tune, pick best, cross-build, upload and
    evaluate on an emulated aarch64 board: fp32 on one behind a tracker (the run learns it is
    emulated from the board itself), int8 on the local board `--emulate` starts (qemu's
    cortex-a72, RK3399's core). The output right (int8: bit for bit, the convs tensorized
    with NEON's dot product), every time marked emulated, none of them in the records
    library or the regression guard."""
    from vta_pipeline.flows.tune_network import tune_network

    store = tmp_path / "store"
    where = (
        {"board.emulate": True} if int8 else {"board.tracker": emulated_board.tracker, "board.key": emulated_board.key}
    )
    cfg = build_config(
        None,
        {
            "model.source": "builtin",
            "model.name": "micronet",
            "target": "rk3399-cpu",
            "quantize.enabled": int8,
            "tune.trials_per_task": 2,
            "tune.task_filter": "conv2d",
            "evaluate.repeat": 3,
            "store": str(store),
            **where,
        },
    )
    result = RunResult.model_validate(tune_network(cfg.model_dump(mode="json")))
    assert result.board_key == ("rk3399-emulated" if int8 else emulated_board.key)
    cpu = "cortex-a72" if int8 else "cortex-a76"
    assert result.tuned.correct and result.untuned.correct
    if int8:
        assert result.tuned.max_abs_err == 0.0  # the board's integers are the emulation's
    assert result.emulated.startswith("qemu-aarch64 ") and result.emulated.endswith(f"-cpu {cpu}")
    assert result.tuned.board_name.endswith("(emulated aarch64)")
    table = render(result)
    assert "EMULATED" in table and any("mean ms" in line and "emulated" in line for line in table.splitlines())
    assert result.guard["skipped"] and result.guard["message"].startswith("not guarded")
    assert result.guard["current"] == {}  # an emulated build becomes no key's current build
    evals = history.read(store, history.EVALUATIONS).to_pylist()
    measured = history.read(store, history.MEASUREMENTS).to_pylist()
    assert evals and all(r["emulated"] for r in evals)
    assert measured and all(r["emulated"] for r in measured)
    with pytest.raises(records_library.LibraryError, match="emulated"):
        records_library.export(store, resolve_target("rk3399-cpu"), tmp_path / "library")
    lib = ArtifactStore(store).find_id("build", result.tuned.build_id).file("model.so")
    head = lib.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183  # EM_AARCH64
    if int8:
        asm = subprocess.run(
            ["aarch64-linux-gnu-objdump", "-d", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        assert "smull" in asm and "saddlp" in asm and "sdot" not in asm  # NEON's form: a Cortex-A72 has no sdot
