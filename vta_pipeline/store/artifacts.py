"""The artifact store: where every step's outputs live, keyed by content.

Layout under the store root::

    steps/<step>/<key>/manifest.json   what the step produced: file hashes, inputs, config
    steps/<step>/<key>/<files...>      the artifacts themselves
    steps/<step>/.tmp/                 half-written outputs (never read)
    quarantine/                        artifacts that failed verification, kept for inspection
    work/                              in-progress state that must survive a kill (tuning)
    runs/<run-id>.json                 results of evaluated runs (read by `report`)
    locks/                             one file lock per (step, key)
    events.jsonl                       append-only log: which step was computed or reused

A step's key is the hash of (step name, step version, package and TVM version, the
artifact ids of its inputs, its config). An artifact id is the hash of its manifest's file
hashes, so a recomputed upstream artifact with identical content does not invalidate what
depends on it. Outputs are written to a temporary directory and renamed into place, so a
killed process never leaves a half-written artifact that looks finished. A lookup re-hashes
the files: an artifact deleted or edited behind the store's back is quarantined and
recomputed, never trusted.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from .. import __version__
from ..errors import ConfigError
from .hashing import canonical_json, sha256_file, sha256_json

MANIFEST = "manifest.json"


class CachePolicy(str, enum.Enum):
    """How a step uses the store (the same four modes as mlc-llm's build cache)."""

    ON = "on"  # reuse a verified artifact, compute and store otherwise
    OFF = "off"  # always compute into the store, never reuse
    REDO = "redo"  # recompute and overwrite what is there
    READONLY = "readonly"  # reuse only; a missing artifact is an error


@dataclass(frozen=True)
class Artifact:
    """A finished, verified step output."""

    step: str
    key: str
    path: Path
    manifest: dict[str, Any]

    @property
    def id(self) -> str:
        """Content id: changes exactly when some output file's bytes change."""
        return self.manifest["artifact_id"]

    @property
    def meta(self) -> dict[str, Any]:
        return self.manifest.get("meta", {})

    def file(self, name: str) -> Path:
        if name not in self.manifest["files"]:
            raise KeyError(f"artifact {self.step}/{self.key} has no file {name!r}")
        return self.path / name

    def ref(self) -> dict[str, str]:
        """What a Prefect result holds: a small, JSON-able pointer, never the data."""
        return {"step": self.step, "key": self.key, "path": str(self.path), "artifact_id": self.id}


def check_store_path(root: Path | str) -> Path:
    """The store's directory, resolved; a ConfigError naming the fix if it cannot be one.

    Checked before anything is computed: a store path that names a file (or sits under one),
    or a directory we may not write, would otherwise fail at the first step's mkdir.
    """
    path = Path(root).expanduser().resolve()
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                what = "is a file" if p == path else f"is under {p}, which is a file"
                raise ConfigError(
                    f"the store {path} {what}, not a directory: pass --store with a directory "
                    "(created if missing), e.g. --store ./vta-store"
                )
            if not os.access(p, os.W_OK | os.X_OK):
                raise ConfigError(
                    f"the store {path} cannot be created or written: {p} is not writable by this "
                    "user; pass --store with a directory you can write"
                )
            break
    return path


class ArtifactStore:
    def __init__(self, root: Path | str, policy: CachePolicy = CachePolicy.ON):
        self.root = check_store_path(root)
        self.policy = CachePolicy(policy)
        for sub in ("steps", "work", "runs", "locks", "quarantine"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    # ---- keys ---------------------------------------------------------------------------------
    def key(self, step: str, *, version: int, inputs: dict[str, str], config: Any) -> str:
        """Cache key of a step: inputs are artifact ids (or other content hashes)."""
        import tvm  # the compiler version is part of every key

        return sha256_json(
            {
                "step": step,
                "step_version": version,
                "package": __version__,
                "tvm": tvm.__version__,
                "inputs": inputs,
                "config": config,
            }
        )[:24]

    def step_dir(self, step: str, key: str) -> Path:
        return self.root / "steps" / step / key

    def work_dir(self, *parts: str) -> Path:
        d = self.root.joinpath("work", *parts)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def lock(self, step: str, key: str, timeout: float = -1) -> FileLock:
        """Exclusive lock so two runs never compute the same step at the same time."""
        return FileLock(str(self.root / "locks" / f"{step}-{key}.lock"), timeout=timeout)

    # ---- lookup -------------------------------------------------------------------------------
    def lookup(self, step: str, key: str) -> Artifact | None:
        """The verified artifact for (step, key), or None. Corrupt ones are quarantined."""
        d = self.step_dir(step, key)
        mpath = d / MANIFEST
        if not mpath.exists():
            return None
        try:
            manifest = json.loads(mpath.read_text())
            problems = []
            for name, entry in manifest["files"].items():
                f = d / name
                if not f.is_file():
                    problems.append(f"{name}: missing")
                elif f.stat().st_size != entry["size"] or sha256_file(f) != entry["sha256"]:
                    problems.append(f"{name}: content does not match its hash")
        except (ValueError, KeyError, TypeError) as e:
            problems = [f"{MANIFEST}: unreadable ({e})"]
        if problems:
            self._quarantine(d, step, key, problems)
            return None
        return Artifact(step, key, d, manifest)

    def meta_of(self, ref: dict[str, str]) -> dict[str, Any]:
        """The meta of the artifact a step's ref points at, as its manifest recorded it."""
        return json.loads((self.step_dir(ref["step"], ref["key"]) / "manifest.json").read_text())["meta"]

    def find(self, step: str) -> list[Artifact]:
        """All verified artifacts of a step (newest first), e.g. for reports."""
        base = self.root / "steps" / step
        out = []
        if base.exists():
            for d in base.iterdir():
                if d.name.startswith(".") or not (d / MANIFEST).exists():
                    continue
                a = self.lookup(step, d.name)
                if a:
                    out.append(a)
        return sorted(out, key=lambda a: a.manifest.get("created", 0), reverse=True)

    def find_id(self, step: str, artifact_id: str) -> Artifact | None:
        """The newest verified artifact of a step with this content id, or None. Only the
        matches are verified (hashed): `find` hashes every file of every artifact of the step,
        and a store's builds are tens of MB each."""
        matches = []
        base = self.root / "steps" / step
        for m in base.glob(f"*/{MANIFEST}") if base.exists() else ():
            if m.parent.name.startswith("."):
                continue
            try:
                manifest = json.loads(m.read_text())
            except ValueError:
                continue  # lookup would quarantine it; it is not the one asked for either way
            if manifest.get("artifact_id") == artifact_id:
                matches.append((manifest.get("created", 0), m.parent.name))
        for _, key in sorted(matches, reverse=True):
            a = self.lookup(step, key)
            if a:
                return a
        return None

    # ---- produce ------------------------------------------------------------------------------
    def produce(
        self,
        step: str,
        key: str,
        compute: Callable[[Path], dict[str, Any] | None],
        *,
        inputs: dict[str, str] | None = None,
        config: Any = None,
    ) -> Artifact:
        """Return the artifact for (step, key), computing it with `compute(out_dir)` if needed.

        `compute` writes its files into `out_dir` and may return a small JSON-able `meta`
        dict stored in the manifest. Every file it leaves there becomes part of the artifact.
        """
        with self.lock(step, key):
            if self.policy in (CachePolicy.ON, CachePolicy.READONLY):
                hit = self.lookup(step, key)
                if hit is not None:
                    self.log_event("reused", step=step, key=key)
                    return hit
            if self.policy is CachePolicy.READONLY:
                raise FileNotFoundError(
                    f"step {step!r} has no artifact for key {key} in {self.root} and the cache "
                    "policy is readonly: rerun with --cache on to compute it"
                )
            tmp_base = self.root / "steps" / step / ".tmp"
            tmp_base.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=tmp_base))
            t0 = time.time()
            self.log_event("started", step=step, key=key)
            try:
                meta = compute(tmp) or {}
                manifest = self._write_manifest(tmp, step, key, inputs or {}, config, meta, time.time() - t0)
                final = self.step_dir(step, key)
                if final.exists():  # REDO/OFF, or a quarantined leftover
                    shutil.rmtree(final)
                os.replace(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                self.log_event("failed", step=step, key=key)
                raise
            self.log_event("computed", step=step, key=key, seconds=round(time.time() - t0, 3))
            return Artifact(step, key, final, manifest)

    def _write_manifest(self, d: Path, step, key, inputs, config, meta, seconds) -> dict[str, Any]:
        files = {}
        for f in sorted(p for p in d.rglob("*") if p.is_file()):
            rel = f.relative_to(d).as_posix()
            files[rel] = {"sha256": sha256_file(f), "size": f.stat().st_size}
        manifest = {
            "step": step,
            "key": key,
            "artifact_id": sha256_json({n: e["sha256"] for n, e in files.items()})[:24],
            "inputs": inputs,
            "config": json.loads(canonical_json(config)),
            "meta": meta,
            "files": files,
            "created": time.time(),
            "seconds": round(seconds, 3),
            "host": socket.gethostname(),
        }
        atomic_write_text(d / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        return manifest

    def _quarantine(self, d: Path, step: str, key: str, problems: list[str]) -> None:
        dest = self.root / "quarantine" / f"{step}-{key}-{int(time.time() * 1000)}"
        try:
            os.replace(d, dest)
        except OSError:
            shutil.rmtree(d, ignore_errors=True)
            dest = None
        self.log_event("quarantined", step=step, key=key, problems=problems, moved_to=str(dest))

    # ---- events -------------------------------------------------------------------------------
    def log_event(self, event: str, **fields: Any) -> None:
        """Append one line to events.jsonl (O_APPEND writes of one line do not interleave).

        A log that does not end in a newline was torn (a power cut, a full disk, a kill
        mid-write: every whole write ends in one): the new line starts on a line of its own,
        so it is never glued onto the fragment and lost with it (`events` skips the fragment)."""
        rec = {"t": round(time.time(), 3), "event": event, "pid": os.getpid(), **fields}
        line = json.dumps(rec, default=str) + "\n"
        fd = os.open(self.root / "events.jsonl", os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            os.write(fd, (("\n" if torn else "") + line).encode())
        finally:
            os.close(fd)

    def events(self) -> list[dict[str, Any]]:
        p = self.root / "events.jsonl"
        if not p.exists():
            return []
        out = []
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line torn by a kill: ignore it
        return out


def read_json(path: Path, default: Any = None) -> Any:
    """A JSON file the store keeps, or `default` where there is none. One that does not parse
    (torn by a power cut, edited, a full disk) is moved aside to `<name>.corrupt` with a warning
    naming it, and `default` is returned: every such file (a work dir's state, default, warm
    start and re-time notes) holds what its reader can derive again from the trial log or
    the board, so the night goes on instead of failing over it."""
    import logging

    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default
    except (ValueError, UnicodeDecodeError) as e:
        aside = path.with_name(path.name + ".corrupt")
        try:
            os.replace(path, aside)
        except FileNotFoundError:  # another reader moved it first
            pass
        logging.getLogger(__name__).warning(
            "%s does not parse (%s): moved to %s; what it held is derived again",
            path,
            str(e).splitlines()[0][:120],
            aside,
        )
        return default


def fsync_dir(d: Path) -> None:
    """A new or renamed file's directory entry on disk too (a power cut can lose an unsynced one)."""
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_replace(src: Path, dst: Path) -> None:
    """Rename a whole file into place so that a power cut leaves the old name or the new file
    with its bytes, never a name without its data: the data is on disk before the rename, the
    rename before this returns."""
    with open(src, "rb") as f:
        os.fsync(f.fileno())
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file so readers see the old or the new content, never a mix, even across a
    power cut (the data is on disk before the rename, the rename before this returns)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
