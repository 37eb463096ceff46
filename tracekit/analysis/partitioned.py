"""The analysis with its event-reading steps mapped over rank partitions (Ray tasks, or here).

Matching, alignment and classification read only the collectives; the two steps that read
events, step windows and the per rank and step breakdown, work rank by rank. So the driver never
holds the events: each task reads its ranks' Parquet partitions from the run directory and
returns small tables, which the driver reduces (concatenated in rank order, as the whole-run
functions order them). The results are the same tables, bit for bit, as `analyze` on one machine.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from tracekit.analysis import breakdown, steps
from tracekit.analysis._frames import frame, table
from tracekit.analysis.classify import Overrides, classify, embedding_all_to_all
from tracekit.analysis.clocks import align_clocks
from tracekit.analysis.matching import match_collectives
from tracekit.executors import Executor, run_tasks
from tracekit.store import Run, event_frame

#: At most this many Ray tasks per phase; larger runs put several ranks in a task.
MAX_TASKS = 256
#: The local executor puts consecutive ranks in one task up to this many bytes of event files
#: (30k to 170k events, at 70 to 12 bytes each on disk): fewer tasks than 256 of a few ranks, whose
#: fixed polars cost per operation it pays one after another, and a bounded partition in memory.
LOCAL_TASK_BYTES = 2 << 20
#: The event columns phase 1 (step windows) reads.
WINDOW_COLUMNS = ("rank", "name", "ts_ns", "dur_ns", "step")


def rank_chunks(ranks: Sequence[int], max_tasks: int | None = None, *,
                sizes: Mapping[int, int] | None = None, max_bytes: int | None = None) -> list[list[int]]:
    """Consecutive groups of ranks: at most `max_tasks` (default `MAX_TASKS`) of them, and with
    `sizes` (bytes per rank) and `max_bytes`, a new group wherever the next rank would take the
    group past `max_bytes` (a group always has a rank)."""
    ranks = sorted(ranks)
    if not ranks:
        return []
    if max_bytes is not None:
        out: list[list[int]] = []
        total = 0
        for r in ranks:
            size = (sizes or {}).get(r, 0)
            if out and total + size <= max_bytes:
                out[-1].append(r)
                total += size
            else:
                out.append([r])
                total = size
        return out
    size = math.ceil(len(ranks) / (max_tasks or MAX_TASKS))
    return [ranks[i:i + size] for i in range(0, len(ranks), size)]


def _events(run_path: str, files: list[str], columns: Sequence[str] | None = None) -> pl.DataFrame:
    return frame(event_frame(run_path, files, columns), "events")


def windows_task(run_path: str, files: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Map, phase 1: step windows found in these event files (one rank partition), and their
    event extents. Tasks get the partition's files from the driver, which listed the run once."""
    return steps.event_windows(_events(run_path, files, WINDOW_COLUMNS))


def breakdown_task(run_path: str, files: list[str], collectives: pl.DataFrame, windows: pl.DataFrame,
                   compute: str | Sequence[str]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Map, phase 2: the per rank and step breakdown of these event files' ranks, and their
    compute time as disjoint intervals (rank, s, e) for the critical path (which takes the same
    union)."""
    ev = _events(run_path, files)
    wide, long = breakdown.per_rank_step(ev, collectives, windows, compute=compute)
    iv = breakdown.compute_intervals(ev, breakdown.comm_intervals(ev, collectives), compute=compute)
    return wide, long, _union_by_rank(iv)


def _union_by_rank(iv: pl.DataFrame) -> pl.DataFrame:
    """Per rank, the union of intervals as disjoint sorted intervals (touching ones kept apart,
    as `rootcause` merges only overlapping ones): a new interval wherever the rank changes or a
    start passes the running end of the rank's intervals so far."""
    if iv.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "s": pl.Int64, "e": pl.Int64})
    iv = iv.sort("rank", "s")
    new = ((pl.col("rank") != pl.col("rank").shift(1))
           | (pl.col("s") > pl.col("e").cum_max().over("rank").shift(1))).fill_null(True)
    return (iv.with_columns(new.cum_sum().alias("_g"))
            .group_by("_g", maintain_order=True)
            .agg(pl.col("rank").first(), pl.col("s").first(), pl.col("e").max())
            .select(pl.col("rank").cast(pl.Int32), pl.col("s").cast(pl.Int64), pl.col("e").cast(pl.Int64)))


def prepared(run: Run, executor: Executor, *, dims: str | Overrides | None, write: bool,
             compute: str | Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What `core._prepared` returns, plus the breakdown ("wide", "long"), computed per rank
    partition on `executor`; the events themselves are never loaded here."""
    coll, mismatches = match_collectives(run.table("collectives"))
    ranks, align = align_clocks(coll, run.table("ranks"))
    names = (run.scan("events").select(pl.col("name").cast(pl.String).unique()).collect().get_column("name")
             .to_list() if run.has("events") else [])
    coll, groups = classify(coll, run.table("groups"), ranks, overrides=dims, embedding=embedding_all_to_all(names))
    c = frame(coll, "collectives")
    path = str(run.path.resolve())
    files_of: dict[int, list[str]] = {}
    for f in run.event_files():
        files_of.setdefault(int(f.parent.name.split("=", 1)[1]), []).append(str(f.resolve()))
    event_ranks = sorted(files_of)
    if executor.is_local:
        sizes = {r: sum(os.path.getsize(f) for f in fs) for r, fs in files_of.items()}

        def chunks(ranks: list[int]) -> list[list[int]]:
            return rank_chunks(ranks, sizes=sizes, max_bytes=LOCAL_TASK_BYTES)
    else:
        chunks = rank_chunks

    def chunk_files(chunk: list[int]) -> list[str]:
        return [f for r in chunk for f in files_of.get(r, [])]

    found = run_tasks(executor, windows_task, [(path, chunk_files(chunk)) for chunk in chunks(event_ranks)])
    windows = steps.finish_windows(_concat([f for f, _ in found], steps.WINDOW_SCHEMA),
                                   _concat([e for _, e in found], _EXTENT_SCHEMA), c)
    c = steps.assign_step(c, windows)
    coll = table(c, "collectives")
    if write:
        run.write_tables({"collectives": coll, "ranks": ranks, "groups": groups})
    work_ranks = sorted(set(event_ranks) | set(windows.get_column("rank").to_list()))
    calls = []
    for chunk in chunks(work_ranks):
        calls.append((path, chunk_files(chunk), c.filter(pl.col("rank").cast(pl.Int32).is_in(chunk)),
                      windows.filter(pl.col("rank").is_in(chunk)), compute))
    parts = run_tasks(executor, breakdown_task, calls)
    wide, long = _reduce([(w, g) for w, g, _ in parts])
    extra = {"alignment": align, "mismatches": mismatches, "windows": windows, "collectives": c,
             "wide": wide, "long": long,
             "compute": _concat([iv for _, _, iv in parts], {"rank": pl.Int32, "s": pl.Int64, "e": pl.Int64})}
    return {"ranks": ranks, "groups": groups, "collectives": coll}, extra


_EXTENT_SCHEMA = {"rank": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64}


def _concat(frames: list[pl.DataFrame], schema: dict[str, Any]) -> pl.DataFrame:
    frames = [f for f in frames if f.height]
    if not frames:
        return pl.DataFrame(schema=schema)
    return pl.concat(frames, how="vertical_relaxed")


def _reduce(parts: list[tuple[pl.DataFrame, pl.DataFrame]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    if not parts:
        return breakdown.per_rank_step(frame(None, "events"), frame(None, "collectives"),
                                       pl.DataFrame(schema=steps.WINDOW_SCHEMA))
    wides = [w for w, _ in parts]
    longs = [g for _, g in parts if g.height] or [parts[0][1]]
    return pl.concat(wides, how="vertical_relaxed"), pl.concat(longs, how="vertical_relaxed")

