"""Emulated boards: TVM's own runtime for another CPU, run under qemu-user on this machine.

A rack of RK3399s runs TVM's aarch64 runtime; an emulated board runs the same runtime (the
registry's aarch64 wheel of the TVM version this host runs) in an aarch64 Python under
`qemu-aarch64`, registered with a tracker like any board. What the pipeline cross-compiles
for the board is then loaded, run and checked by an ARM runtime before anyone owns a board:
the ELF loads, the RPC session works with the board's TVM, the numbers are right.

What it does not tell is speed: qemu translates every ARM instruction into several of this
machine's, so a timing on an emulated board says how fast qemu is. Every such timing is
marked "emulated" where it is shown and kept out of the records library and the
regression guard (the board says it is emulated when asked who it is: `probes.BOARD_INFO`).

Setting one up is one idempotent command, run once (CI runs it), after which nothing is
downloaded at run time:

    vta-pipeline board emulator-setup aarch64

It fetches an aarch64 Python from Debian's archive (`apt-get download` of the `:arm64`
packages, unpacked with `dpkg -x` into a sysroot: the machine's own Python is not touched)
and the aarch64 wheels of TVM and what its RPC server imports (`uv pip install --target
--python-platform`, the versions this host runs), then starts the emulated Python once to
check that TVM imports. `-0` makes a wrapper script the emulated Python's argv[0], so that
`sys.executable` (which TVM's server starts its workers with) re-enters qemu.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError, UserError

log = logging.getLogger(__name__)

HOME = Path(os.environ.get("VTA_PIPELINE_EMULATORS", "~/.cache/vta-pipeline/emulators")).expanduser()
"""Where emulated boards' sysroots live, one directory per architecture."""

PYTHON = "3.11"
"""The emulated Python: Debian bookworm's, the version TVM's aarch64 wheels are built for here."""

DEBS = (
    "libc6",
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "libexpat1",
    "zlib1g",
    "libffi8",
    "libssl3",
    "libgcc-s1",
    "libstdc++6",
    "libbz2-1.0",
    "liblzma5",
    "libsqlite3-0",
    "libuuid1",
    "libtinfo6",
    "libncursesw6",
    "libreadline8",
    "libdb5.3",
    "libgdbm6",
    "libnsl2",
    "libtirpc3",
    "libcrypt1",
)
"""Debian packages of the emulated Python and the C libraries its standard library loads."""

WHEELS = ("apache-tvm", "apache-tvm-ffi", "numpy", "ml_dtypes", "psutil", "cloudpickle", "typing_extensions")
"""What a board's server imports (TVM's runtime and RPC, our server front), at this host's versions."""

SETUP_COMMAND = "vta-pipeline board emulator-setup {arch}"


@dataclass(frozen=True)
class Arch:
    """A CPU architecture an emulated board can run."""

    name: str  # as `--emulate` takes it
    qemu: str  # the qemu-user program
    deb_arch: str  # Debian's name for it
    wheel_platform: str  # uv's --python-platform for its wheels
    triple: str  # the mtriple prefix of the targets it runs


ARCHES = {"aarch64": Arch("aarch64", "qemu-aarch64", "arm64", "aarch64-manylinux_2_28", "aarch64")}

ARMV7_MISSING = (
    "32-bit ARM (armv7, Pynq's Cortex-A9) cannot be emulated yet: no TVM runtime for armv7 is to be had "
    "from the registries (no armv7 wheel of apache-tvm or apache-tvm-ffi, and no source distribution to "
    "cross-build one from): docs/boards-and-targets.md says what is missing"
)


def arch_of(name: str) -> Arch:
    if name in ARCHES:
        return ARCHES[name]
    if name.startswith("arm") and name != "arm64":
        raise ConfigError(ARMV7_MISSING)
    raise ConfigError(f"--emulate {name!r}: the emulated boards are {', '.join(ARCHES)}")


def arch_for_target(target) -> Arch:
    """The architecture a cross-compiled target runs on, for a run's `--emulate`."""
    triple = str(target.full_json.get("mtriple") or (target.host_json or {}).get("mtriple") or "")
    if not target.cross_compiler or not triple:
        raise ConfigError(
            f"--emulate: target {target.name!r} runs on this machine's CPU, there is nothing to emulate; "
            "drop --emulate (it is for cross-compiled targets such as rk3399-cpu)"
        )
    if target.device != "cpu":
        raise ConfigError(
            f"--emulate: target {target.name!r} runs on a {target.device} device, which qemu does not emulate; "
            "an emulated board runs CPU targets (rk3399-cpu)"
        )
    for a in ARCHES.values():
        if triple.startswith(a.triple):
            return a
    if triple.startswith("arm"):
        raise ConfigError(ARMV7_MISSING)
    raise ConfigError(f"--emulate: no emulated board runs {triple} (target {target.name!r}); they run {list(ARCHES)}")


def _host_versions() -> dict[str, str]:
    out = {}
    for w in WHEELS:
        try:
            out[w] = version(w)
        except PackageNotFoundError:
            raise UserError(f"this environment has no {w}; install vta-pipeline with its lock (`uv sync --frozen`)")
    return out


@functools.lru_cache(maxsize=None)
def qemu_cpus(qemu: str) -> tuple[str, ...]:
    """The CPU models `qemu` emulates (`-cpu help`), () where it cannot say; asked once a process."""
    try:
        out = subprocess.run([qemu, "-cpu", "help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(w for line in out.splitlines()[1:] for w in line.split()[:1])


@functools.lru_cache(maxsize=None)
def qemu_version(qemu: str) -> str:
    """ "qemu-aarch64 7.2.22": what a board started by `qemu` says emulates it; asked once a process."""
    try:
        out = subprocess.run([qemu, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return qemu
    words = (out.splitlines()[0] if out else "").split()  # "qemu-aarch64 version 7.2.22 (Debian ...)"
    return f"{qemu} {words[2]}" if len(words) > 2 else qemu


@dataclass(frozen=True)
class Emulator:
    """One architecture's emulated Python, set up under `root`, emulating the CPU model `cpu`
    (qemu's `-cpu`, through QEMU_CPU): the target's own core where qemu has it, so that code
    using an instruction that core lacks (the dot product on a Cortex-A72) faults as it would
    on the board; "max" (every instruction qemu knows) otherwise."""

    arch: Arch
    root: Path
    cpu: str = "max"

    @classmethod
    def of(cls, arch: str | Arch, home: Path | None = None, cpu: str | None = None) -> Emulator:
        a = arch if isinstance(arch, Arch) else arch_of(arch)
        if cpu and cpu != "max" and shutil.which(a.qemu) and cpu not in qemu_cpus(a.qemu):
            raise ConfigError(f"{a.qemu} does not emulate the CPU {cpu!r}; it emulates {', '.join(qemu_cpus(a.qemu))}")
        return cls(a, Path(home or HOME) / a.name, cpu or "max")

    @classmethod
    def for_target(cls, target, home: Path | None = None) -> Emulator:
        """The emulator of a cross-compiled target: its architecture, its core (mcpu) where qemu has it."""
        a = arch_for_target(target)
        mcpu = str(target.full_json.get("mcpu") or "")
        cpu = mcpu if mcpu and shutil.which(a.qemu) and mcpu in qemu_cpus(a.qemu) else "max"
        return cls(a, Path(home or HOME) / a.name, cpu)

    @property
    def sysroot(self) -> Path:
        return self.root / "sysroot"

    @property
    def site(self) -> Path:
        return self.root / "site"

    @property
    def python(self) -> Path:
        """The wrapper that runs the emulated Python (what a board's processes are started with)."""
        return self.root / "bin" / "python"

    @property
    def manifest(self) -> Path:
        return self.root / "setup.json"

    def wanted(self) -> dict[str, Any]:
        return {"arch": self.arch.name, "python": PYTHON, "wheels": _host_versions()}

    def problem(self) -> str | None:
        """Why this emulator cannot start a board now (with the fix), or None."""
        fix = f"run `{SETUP_COMMAND.format(arch=self.arch.name)}` once (docs/boards-and-targets.md)"
        if shutil.which(self.arch.qemu) is None:
            return (
                f"{self.arch.qemu} is not on PATH: install qemu-user (Debian: `apt-get install qemu-user`), then {fix}"
            )
        try:
            have = json.loads(self.manifest.read_text())
        except (OSError, ValueError):
            return f"no emulated {self.arch.name} board is set up in {self.root}: {fix}"
        want = self.wanted()
        if {k: have.get(k) for k in want} != want:
            return (
                f"the emulated {self.arch.name} board in {self.root} was set up for "
                f"TVM {have.get('wheels', {}).get('apache-tvm')}, this host runs {want['wheels']['apache-tvm']}: {fix}"
            )
        if not self.python.exists():
            return f"the emulated {self.arch.name} board in {self.root} is incomplete: {fix}"
        return None

    def check(self) -> None:
        p = self.problem()
        if p:
            raise ConfigError(p)

    def qemu_version(self) -> str:
        return qemu_version(self.arch.qemu)

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """The environment of a board process: the emulated Python finds the aarch64 site
        first, then this package (pure Python), never the host's environment; the board
        says it is emulated (VTA_PIPELINE_EMULATED, read by `probes.register_board_info`)."""
        package_parent = Path(__file__).resolve().parents[2]
        env = {k: v for k, v in base.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
        env.update(
            PYTHONPATH=os.pathsep.join([str(self.site), str(package_parent)]),
            PYTHONNOUSERSITE="1",
            PYTHONDONTWRITEBYTECODE="1",  # the checkout's __pycache__ stays the host's
            VTA_PIPELINE_EMULATED=f"{self.qemu_version()} -cpu {self.cpu}",
            QEMU_CPU=self.cpu,
        )
        return env


def _run(cmd: list[str], what: str, fix: str, **kw) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    except OSError as e:
        raise UserError(f"{what}: {e}; {fix}") from None
    if p.returncode != 0:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-8:])
        raise UserError(f"{what} failed (exit {p.returncode}):\n{tail}\n{fix}")
    return p


def _wrapper(root: Path, arch: Arch) -> str:
    return (
        "#!/bin/sh\n"
        f"# The emulated {arch.name} Python of vta-pipeline's emulated boards (written by "
        f"`{SETUP_COMMAND.format(arch=arch.name)}`).\n"
        "# -0 makes this script argv[0], so sys.executable (TVM's server starts its workers with it) re-enters qemu.\n"
        f'exec {arch.qemu} -L "{root}/sysroot" -0 "$0" "{root}/sysroot/usr/bin/python{PYTHON}" "$@"\n'
    )


def setup(arch: str, home: Path | None = None, say: Callable[[str], None] = log.info) -> Emulator:
    """Set up (or find set up) the emulated board of `arch` under `home`; idempotent.

    Built in a staging directory beside the final one and moved into place only once the
    emulated Python imports TVM: an interrupted set-up leaves the previous one (or none),
    never half of one."""
    em = Emulator.of(arch, home)
    a = em.arch
    if shutil.which(a.qemu) is None:
        raise UserError(f"{a.qemu} is not on PATH: install qemu-user (Debian: `sudo apt-get install qemu-user`)")
    if em.problem() is None:
        say(f"the emulated {a.name} board in {em.root} is already set up")
        return em
    for tool, pkg in (("apt-get", "apt"), ("dpkg", "dpkg"), ("uv", "uv (python3 -m pip install uv)")):
        if shutil.which(tool) is None:
            raise UserError(f"setting up an emulated board needs {tool}, which is not on PATH: install {pkg}")
    want = em.wanted()
    em.root.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{a.name}.staging-", dir=em.root.parent))
    try:
        debs = stage / "debs"
        debs.mkdir()
        say(f"fetching an {a.name} Python {PYTHON} from Debian's archive ({len(DEBS)} :{a.deb_arch} packages)")
        foreign = subprocess.run(["dpkg", "--print-foreign-architectures"], capture_output=True, text=True).stdout
        add_arch = (
            ""
            if a.deb_arch in foreign.split()
            else f" (apt knows no {a.deb_arch} packages yet: `sudo dpkg --add-architecture {a.deb_arch} && "
            "sudo apt-get update`)"
        )
        _run(
            ["apt-get", "download", *(f"{d}:{a.deb_arch}" for d in DEBS), "media-types"],
            "apt-get download",
            f"fix apt{add_arch or ''} and rerun `{SETUP_COMMAND.format(arch=a.name)}`",
            cwd=debs,
            timeout=900,
        )
        sysroot = stage / "sysroot"
        for deb in sorted(debs.glob("*.deb")):
            _run(["dpkg", "-x", str(deb), str(sysroot)], f"dpkg -x {deb.name}", "rerun the set-up", timeout=300)
        fetched = sorted(p.name for p in debs.glob("*.deb"))
        shutil.rmtree(debs)
        pins = [f"{w}=={v}" for w, v in want["wheels"].items()]
        say(f"fetching the {a.name} wheels of {', '.join(pins)}")
        _run(
            [
                "uv",
                "pip",
                "install",
                "--quiet",
                "--target",
                str(stage / "site"),
                "--python-platform",
                a.wheel_platform,
                "--python-version",
                PYTHON,
                "--no-deps",
                "--only-binary",
                ":all:",
                *pins,
            ],
            "uv pip install (the board's wheels)",
            f"check that the package registry serves {a.wheel_platform} wheels of these versions",
            timeout=1800,
        )
        (stage / "bin").mkdir()
        if em.root.exists():
            shutil.rmtree(em.root)
        os.replace(stage, em.root)
        em.python.write_text(_wrapper(em.root, a))
        em.python.chmod(0o755)
        say("starting the emulated Python once to check that TVM imports (qemu: about 15 s)")
        probe = _run(
            [str(em.python), "-c", "import tvm, tvm.rpc, numpy; print(tvm.__version__)"],
            f"the emulated {a.name} Python",
            f"see the error above; rerun `{SETUP_COMMAND.format(arch=a.name)}`",
            env=em.env(dict(os.environ)),
            timeout=600,
        )
        got = probe.stdout.strip().splitlines()[-1] if probe.stdout.strip() else "?"
        manifest = dict(want, debs=fetched, tvm_imports=got, qemu=em.qemu_version())
        tmp = em.manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, em.manifest)
        say(f"emulated {a.name} board set up in {em.root} (TVM {got} under {manifest['qemu']})")
        return em
    finally:
        shutil.rmtree(stage, ignore_errors=True)
