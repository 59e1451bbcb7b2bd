"""The records library: tuned records shipped with the package, the warm start of a store
that has none.

What `autotvm.tophub.context` was to the recipe: a fresh machine's first night should not
start every workload of the built-in models from random schedules. The library holds, per
CPU class, the best few records of each workload that this pipeline tuned (its resumable
tuning is made for building it: `vta-pipeline library export` after a night), and each row
says where it came from: CPU model, ISA flags, commit, trials measured, night.

A library record is never trusted for its latency, which was measured on another machine.
Its schedules are the first candidates the search measures on this board
(`tune.WarmStart(library=...)`), so the trial log, the database and pick best hold only
this board's timings, and a library that is wrong for this machine costs a few trials, not
a slow build. The store's own history always wins: the library is asked only for
workloads the store has no records of.

A CPU class is the TVM target (and host) without "num-cores": a schedule replays on any
core count and its rank carries over within one microarchitecture (-mcpu), not across
them (a VNNI int8 kernel does not even run on an AVX2 CPU). A class the library has no
records of a workload for borrows them from a class whose instruction sets are a subset of
its own (`compatible_classes`: an AVX2-only class's records on an AVX-512 CPU, never the
reverse), nearest first: they run here, and, measured on the board like every library
record, cost a few trials where they are slow.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..boards import machine
from ..errors import UserError
from ..store import history, workload_keys
from ..store.hashing import sha256_json

BUILTIN = Path(__file__).parent.parent / "library"  # vta_pipeline/library, shipped with the package
"""The library shipped with the package: one Parquet file per CPU class."""

PER_WORKLOAD = 4
"""Records kept per workload: the search measures them first, so they cost trials."""

SCHEMA = pa.schema(
    [
        ("cpu_class", pa.string()),  # JSON of the target (and host) without num-cores
        ("workload_key", pa.string()),
        ("task", pa.string()),  # the task name it was tuned under
        ("model", pa.string()),
        ("rank", pa.int32()),  # 1 = the workload's fastest record where it was measured
        ("record", pa.string()),  # MetaSchedule TuningRecord JSON
        ("latency_ms", pa.float64()),  # where it was measured (provenance, never used as this board's time)
        ("measured", pa.int32()),  # valid measurements of the workload behind the pick
        ("cpu", pa.string()),
        ("isa", pa.string()),
        ("threads", pa.int32()),
        ("commit", pa.string()),
        ("night", pa.string()),
    ]
)


class LibraryError(UserError):
    """A library directory or file that cannot be used (says which and why)."""


def cpu_class(target_json: dict[str, Any], host_json: dict[str, Any] | None = None) -> dict[str, Any]:
    """The target (and host) as a library keys it: everything but "num-cores"."""

    def strip(t: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if t is None else {k: v for k, v in sorted(t.items()) if k != "num-cores"}

    return {"target": strip(target_json), "host": strip(host_json)}


def class_json(target) -> str:
    """`target` (a ResolvedTarget) as the library's cpu_class column."""
    return json.dumps(cpu_class(target.target_json, target.host_json), sort_keys=True)


def class_file(target) -> str:
    """The library file of a target's CPU class: `<mcpu or kind>-<hash>.parquet`."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(target.target_json.get("mcpu") or target.kind))
    return f"{name}-{sha256_json(cpu_class(target.target_json, target.host_json))[:12]}.parquet"


def resolve(spec: str) -> Path | None:
    """`TuneConfig.records_library` as a directory: "builtin" = the package's, "off" = none."""
    if spec == "off":
        return None
    if spec == "builtin":
        return BUILTIN
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise LibraryError(
            f"records library {spec!r} is not a directory: pass one written by "
            f"`vta-pipeline library export --out DIR`, 'builtin' or 'off'"
        )
    return path


def read(library_dir: Path | None, target=None) -> pa.Table:
    """The library's rows (of one target's CPU class when given); empty when it has none."""
    if library_dir is None:
        return SCHEMA.empty_table()
    files = [library_dir / class_file(target)] if target is not None else sorted(library_dir.glob("*.parquet"))
    tables = []
    for f in files:
        if not f.exists():
            continue
        try:
            tables.append(pq.read_table(f, schema=SCHEMA))
        except Exception as e:  # a torn or foreign file: say which, never guess
            raise LibraryError(
                f"records library file {f} does not read as a library ({e}); "
                f"delete it or export it again with `vta-pipeline library export`"
            ) from None
    t = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
    if target is not None:  # a file name is a hash prefix: the column decides
        t = t.filter(pc.field("cpu_class") == class_json(target))
    return t


# the LLVM features that are instruction sets (the rest are tuning hints: fast-gather, prefer-256-bit ...)
_ISA = re.compile(
    r"^(avx|sse|ssse|fma|f16c|amx|bmi|popcnt|lzcnt|aes|vaes|sha|gfni|pclmul|vpclmulqdq|movbe|adx|"
    r"neon|dotprod|i8mm|sve|fullfp16|fp16|bf16|mmx|cx16|xsave|crc)"
)


def isa_features(target_json: dict[str, Any]) -> frozenset[str]:
    """The instruction sets LLVM gives a CPU target's -mcpu (and -mattr)."""
    import tvm
    from tvm.target import codegen

    try:
        feats = codegen.llvm_get_cpu_features(tvm.target.Target(dict(target_json)))
    except Exception:  # noqa: BLE001 - a target LLVM cannot read has no features to compare
        return frozenset()
    return frozenset(str(f) for f in feats if _ISA.match(str(f)))


def compatible_classes(library_dir: Path, target) -> list[str]:
    """The library's other CPU classes whose records run on `target`: the same target but for
    -mcpu, their instruction sets a subset of the target's; the nearest (most sets) first."""
    own = cpu_class(target.target_json, target.host_json)
    mine = isa_features({**own["target"], "kind": target.kind})
    found = []
    for cls in sorted(set(read(library_dir).column("cpu_class").to_pylist())):
        c = json.loads(cls)
        if c == own or c.get("host") != own["host"]:
            continue
        theirs_t = {k: v for k, v in c["target"].items() if k not in ("mcpu", "mattr")}
        if theirs_t != {k: v for k, v in own["target"].items() if k not in ("mcpu", "mattr")}:
            continue
        theirs = isa_features(c["target"])
        if theirs and theirs <= mine:
            found.append((len(theirs), cls))
    return [cls for _, cls in sorted(found, reverse=True)]


def seeds(library_dir: Path | None, workload_key: str, target, k: int) -> tuple[list[Any], dict[str, Any]]:
    """Up to k records of a workload for the target's CPU class, best first, and their
    provenance ({"library", "cpu", "isa", "commit", "night", "latency_ms", ...}); where the
    class has none, a compatible class's (`compatible_classes`; the note names it under
    "borrowed_from"); ([], {}) when the library has none."""
    if library_dir is None or k <= 0:
        return [], {}
    t = read(library_dir, target)
    rows = t.filter(pc.field("workload_key") == workload_key).sort_by([("rank", "ascending")]).to_pylist()[:k]
    borrowed = None
    if not rows:
        everything = read(library_dir).filter(pc.field("workload_key") == workload_key)
        for cls in compatible_classes(library_dir, target) if everything.num_rows else []:
            rows = everything.filter(pc.field("cpu_class") == cls).sort_by([("rank", "ascending")]).to_pylist()[:k]
            if rows:
                borrowed = json.loads(cls)["target"].get("mcpu")
                break
    if not rows:
        return [], {}
    first = rows[0]
    note = {
        "library": str(library_dir),
        "records": len(rows),
        "task": first["task"],
        "model": first["model"],
        "cpu": first["cpu"],
        "isa": first["isa"],
        "threads": first["threads"],
        "commit": first["commit"],
        "night": first["night"],
        "latency_ms": first["latency_ms"],
        "measured": first["measured"],
        **({"borrowed_from": borrowed} if borrowed else {}),
    }
    return [json.loads(r["record"]) for r in rows], note


# ---- building it --------------------------------------------------------------------------------
def export(
    store_root: Path,
    target,
    out_dir: Path,
    *,
    k: int = PER_WORKLOAD,
    cpu_info: dict[str, Any] | None = None,
    source_commit: str | None = None,
) -> dict[str, Any]:
    """Add the store's best records for `target` to the library in `out_dir`.

    From the store's history: every valid measurement on exactly this target, all boards
    and sessions, best k distinct schedules per workload. They are merged with the rows the
    library file already has for the class (a library grows over nights and machines of one
    class), best k per workload kept. `cpu_info` ({"cpu", "isa"}: this machine's by
    default) and `source_commit` are the provenance of the new rows. Returns a summary."""
    f = pc.field("target_id") == target.id
    f = f & pc.field("record").is_valid() & pc.field("latency_ms").is_valid()
    f = f & history.not_emulated()  # an emulated board's timings are qemu's, not its CPU's
    t = history.read(
        store_root,
        history.MEASUREMENTS,
        filter=f,
        columns=["workload_key", "task", "model", "schedule_hash", "record", "latency_ms", "night", "threads"],
    )
    if t.num_rows == 0:
        raise LibraryError(
            f"the store {store_root} has no valid measurements on target {target.name!r} "
            f"(id {target.id}) from a real board (an emulated board's never enter the library): tune with that "
            "target first, or pass the --target it was tuned with"
        )
    alias = workload_keys.aliases(store_root)
    info = cpu_info or machine.cpu()
    src = source_commit or machine.source_commit()
    cls = class_json(target)
    fresh: list[dict[str, Any]] = []
    measured: dict[str, int] = {}
    for r in t.to_pylist():
        wk = alias.get(r["workload_key"], r["workload_key"])
        measured[wk] = measured.get(wk, 0) + 1
        fresh.append(
            {
                "cpu_class": cls,
                "workload_key": wk,
                "task": r["task"],
                "model": r["model"],
                "rank": 0,
                "record": r["record"],
                "latency_ms": r["latency_ms"],
                "cpu": info["cpu"],
                "isa": " ".join(info["isa"]),
                "threads": r["threads"],
                "commit": src,
                "night": r["night"],
                "_hash": r["schedule_hash"],
            }
        )
    for row in fresh:
        row["measured"] = measured[row["workload_key"]]

    path = Path(out_dir) / class_file(target)
    old = read(Path(out_dir), target).to_pylist() if path.exists() else []
    by_wl: dict[str, list[dict[str, Any]]] = {}
    for row in fresh + old:
        by_wl.setdefault(row["workload_key"], []).append(row)
    out_rows: list[dict[str, Any]] = []
    for wk, rows in by_wl.items():
        rows.sort(key=lambda r: r["latency_ms"])
        seen: set[str | None] = set()
        kept = []
        for row in rows:
            # one schedule: the same trace, or (rows of this store) the same scheduled module
            idents = {_schedule(row["record"]), row.pop("_hash", None)} - {None}
            if idents & seen:
                continue
            seen.update(idents)
            kept.append(row)
            if len(kept) == k:
                break
        for i, row in enumerate(kept, 1):
            row["rank"] = i
            out_rows.append(row)
    out_rows.sort(key=lambda r: (r["workload_key"], r["rank"]))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{int(time.time() * 1e3)}.tmp")
    pq.write_table(pa.Table.from_pylist(out_rows, schema=SCHEMA), tmp, compression="zstd")
    os.replace(tmp, path)
    return {
        "file": str(path),
        "cpu_class": cls,
        "workloads": len(by_wl),
        "records": len(out_rows),
        "from_store": len({r["workload_key"] for r in fresh}),
        "measurements": len(fresh),
        "commit": src,
        "cpu": info["cpu"],
    }


def _schedule(record: str) -> str:
    """A record's identity as a schedule: its trace (the record also holds the run times
    and target it was measured with, which differ between two measurements of one schedule)."""
    return json.dumps(json.loads(record)[0], sort_keys=True)


def summary(library_dir: Path) -> list[dict[str, Any]]:
    """One row per (CPU class, model, commit): what the library holds and where it came from."""
    t = read(library_dir)
    by: dict[tuple, dict[str, Any]] = {}
    for r in t.to_pylist():
        cls = json.loads(r["cpu_class"])["target"]
        k = (r["cpu_class"], r["model"], r["commit"])
        row = by.setdefault(
            k,
            {
                "mcpu": cls.get("mcpu") or cls.get("kind"),
                "model": r["model"],
                "cpu": r["cpu"],
                "isa": r["isa"],
                "commit": r["commit"],
                "workloads": set(),
                "records": 0,
                "nights": set(),
            },
        )
        row["workloads"].add(r["workload_key"])
        row["records"] += 1
        row["nights"].add(r["night"])
    return [
        dict(v, workloads=len(v["workloads"]), nights=",".join(sorted(n for n in v["nights"] if n)))
        for v in by.values()
    ]
