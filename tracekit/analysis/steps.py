"""Training steps: per-rank step windows, and the step each timed row falls into."""

from __future__ import annotations

import polars as pl

from tracekit._limits import RANGES
from tracekit.analysis._frames import P2P_OPS

STEP_RE = r"^ProfilerStep#(\d+)$"
#: Largest step number kept (steps are int32 in every table, as the parsers read them).
STEP_MAX = RANGES["count"][1]
WINDOW_SCHEMA = {"rank": pl.Int32, "step": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64,
                 "source": pl.String}


def step_windows(events: pl.DataFrame, collectives: pl.DataFrame) -> pl.DataFrame:
    """Per rank, the [start_ns, end_ns) window of each step on the rank's own clock.

    Sources, by rank, first that applies: `ProfilerStep#N` annotations ("annotation"); the
    extent of the events carrying `events.step` ("events.step"); the cadence of the least
    frequent repeated collective, DP preferred ("cadence": step k ends when its k-th call ends);
    else one step 0 spanning everything ("whole"). Windows of a rank never overlap.
    """
    found, extents = event_windows(events)
    return finish_windows(found, extents, collectives)


def event_windows(events: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The part of `step_windows` that reads events, rank by rank (so it can run per rank
    partition): windows from annotations or `events.step`, and each rank's event extent."""
    ev = events.filter(pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null())
    ann = (
        ev.with_columns(pl.col("name").str.extract(STEP_RE, 1).cast(pl.Int64, strict=False).alias("_s"))
        .filter(pl.col("_s").is_between(0, STEP_MAX))  # ingest counted the others as a dropped `step`
        .with_columns(pl.col("_s").cast(pl.Int32))
        .group_by("rank", "_s").agg(pl.col("ts_ns").min().alias("start_ns"),
                                    (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("end_ns"))
        .rename({"_s": "step"}).with_columns(pl.lit("annotation").alias("source"))
    )
    done = set(ann.get_column("rank").to_list())
    by_step = (
        ev.filter(pl.col("step").is_not_null() & ~pl.col("rank").is_in(list(done)))
        .group_by("rank", "step").agg(pl.col("ts_ns").min().alias("start_ns"),
                                      (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("end_ns"))
        .with_columns(pl.lit("events.step").alias("source"))
    )
    found = pl.concat([p.select(list(WINDOW_SCHEMA)).cast(WINDOW_SCHEMA) for p in (ann, by_step)])
    return found, _extents(ev, None)


def finish_windows(found: pl.DataFrame, extents: pl.DataFrame, collectives: pl.DataFrame) -> pl.DataFrame:
    """The rest of `step_windows`, from the collectives alone: cadence or whole-run windows for
    the ranks whose events gave none, then windows clipped so that they never overlap."""
    parts = [found.select(list(WINDOW_SCHEMA)).cast(WINDOW_SCHEMA)]
    done = set(found.get_column("rank").to_list())
    extents = _extents(extents, collectives)
    rest = extents.filter(~pl.col("rank").is_in(list(done)))
    if rest.height:
        cad = _cadence(collectives.filter(pl.col("rank").is_in(rest.get_column("rank").to_list())), rest)
        parts.append(cad)
        done |= set(cad.get_column("rank").to_list())
        whole = rest.filter(~pl.col("rank").is_in(list(done))).with_columns(
            pl.lit(0).alias("step"), pl.lit("whole").alias("source"))
        parts.append(whole.select("rank", "step", "start_ns", "end_ns", "source"))
    out = pl.concat([p.select(list(WINDOW_SCHEMA)).cast(WINDOW_SCHEMA) for p in parts])
    out = out.sort("rank", "start_ns", "step").with_columns(
        pl.min_horizontal("end_ns", pl.col("start_ns").shift(-1).over("rank")).fill_null(pl.col("end_ns"))
        .alias("end_ns"))
    return out.filter(pl.col("end_ns") > pl.col("start_ns"))


def _extents(ev: pl.DataFrame, coll: pl.DataFrame | None) -> pl.DataFrame:
    """Per rank, the earliest start and latest end of `ev` (events, or extents already reduced
    to rank, start_ns, end_ns) and of the timed collectives when given."""
    if "start_ns" in ev.columns:
        parts = [ev.select(pl.col("rank").cast(pl.Int32), pl.col("start_ns").alias("ts_ns"),
                           pl.col("end_ns").alias("e"))]
    else:
        parts = [ev.select(pl.col("rank").cast(pl.Int32), pl.col("ts_ns"),
                           (pl.col("ts_ns") + pl.col("dur_ns")).alias("e"))]
    if coll is not None:
        parts.append(coll.filter(pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null()).select(
            pl.col("rank").cast(pl.Int32), pl.col("ts_ns"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("e")))
    return pl.concat(parts).group_by("rank").agg(pl.col("ts_ns").min().alias("start_ns"),
                                                 pl.col("e").max().alias("end_ns"))


def _cadence(coll: pl.DataFrame, extents: pl.DataFrame) -> pl.DataFrame:
    empty = pl.DataFrame(schema=WINDOW_SCHEMA)
    c = coll.filter(pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null()
                    & ~pl.col("op").is_in(P2P_OPS))
    if c.height == 0:
        return empty
    if "dim" in c.columns and c.filter(pl.col("dim") == "DP").height:
        c = c.filter(pl.col("dim") == "DP")
    sig = ["group", "op", "in_bytes"]
    counts = (c.group_by([*sig, "rank"]).len()
              .group_by(sig).agg(pl.col("len").median().alias("n"))
              .filter(pl.col("n") >= 2)
              # group breaks ties (two DP groups of one size, one per PP stage): group_by order is arbitrary
              .sort(["n", "in_bytes", "group"], descending=[False, True, False], nulls_last=True))
    if counts.height == 0:
        return empty
    chosen = counts.row(0, named=True)
    marks = c.filter((pl.col("group") == chosen["group"]) & (pl.col("op") == chosen["op"])
                     & (pl.col("in_bytes").eq_missing(chosen["in_bytes"])))
    ends = (marks.select(pl.col("rank").cast(pl.Int32), (pl.col("ts_ns") + pl.col("dur_ns")).alias("e"))
            .sort("rank", "e").group_by("rank", maintain_order=True).agg(pl.col("e")))
    rows = []
    span = {r: (s, e) for r, s, e in extents.iter_rows()}
    for r, e in ends.iter_rows():
        start, stop = span[r]
        bounds = [start, *e[:-1], max(stop, e[-1])]
        for k in range(len(bounds) - 1):
            rows.append((r, k, bounds[k], bounds[k + 1], "cadence"))
    return pl.DataFrame(rows, schema=WINDOW_SCHEMA, orient="row")


def split_by_step(intervals: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Cut intervals (rank, s, e, ...) at step boundaries; adds `step`, keeps pieces inside windows."""
    if windows.group_by("rank").len().get_column("len").max() == 1:
        iv = intervals.with_columns(pl.col("rank").cast(pl.Int32)).join(
            windows.select(pl.col("rank").cast(pl.Int32), "step", "start_ns", "end_ns"), on="rank")
        iv = iv.with_columns(pl.max_horizontal("s", "start_ns").alias("s"),
                             pl.min_horizontal("e", "end_ns").alias("e"))
        return iv.filter(pl.col("e") > pl.col("s")).drop("start_ns", "end_ns")
    w = windows.sort("rank", "start_ns").with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).over("rank").alias("_k"))
    keys = w.select(pl.col("rank").cast(pl.Int32), "start_ns", "_k").sort("start_ns")
    iv = intervals.with_columns(pl.col("rank").cast(pl.Int32)).with_row_index("_i")
    first = (iv.select("_i", "rank", "s").sort("s")
             .join_asof(keys, left_on="s", right_on="start_ns", by="rank", strategy="backward",
                        check_sortedness=False)
             .select("_i", pl.col("_k").fill_null(0).alias("_k0")))
    last = (iv.select("_i", "rank", (pl.col("e") - 1).alias("_e1")).sort("_e1")
            .join_asof(keys, left_on="_e1", right_on="start_ns", by="rank", strategy="backward",
                       check_sortedness=False)
            .select("_i", pl.col("_k").alias("_k1")))
    iv = (iv.join(first, on="_i").join(last, on="_i").filter(pl.col("_k1").is_not_null())
          .with_columns(pl.int_ranges("_k0", pl.col("_k1") + 1).alias("_k")).explode("_k"))
    iv = iv.join(w.select(pl.col("rank").cast(pl.Int32), "_k", "step", "start_ns", "end_ns"),
                 on=["rank", "_k"])
    iv = iv.with_columns(pl.max_horizontal("s", "start_ns").alias("s"),
                         pl.min_horizontal("e", "end_ns").alias("e"))
    return iv.filter(pl.col("e") > pl.col("s")).drop("_i", "_k0", "_k1", "_k", "start_ns", "end_ns")


def assign_step(df: pl.DataFrame, windows: pl.DataFrame, *, ts: str = "ts_ns") -> pl.DataFrame:
    """Fill a null `step` column from the window that contains each row's `ts` (by rank)."""
    keys = windows.select(pl.col("rank").cast(pl.Int32), "start_ns", "end_ns",
                          pl.col("step").alias("_ws")).sort("start_ns")
    tmp = df.with_row_index("_r").with_columns(pl.col("rank").cast(pl.Int32))
    found = (tmp.filter(pl.col(ts).is_not_null()).select("_r", "rank", ts).sort(ts)
             .join_asof(keys, left_on=ts, right_on="start_ns", by="rank", strategy="backward",
                        check_sortedness=False)
             .select("_r", pl.when(pl.col(ts) < pl.col("end_ns")).then(pl.col("_ws")).alias("_ws")))
    out = tmp.join(found, on="_r", how="left", maintain_order="left")
    step = pl.col("step").fill_null(pl.col("_ws")) if "step" in df.columns else pl.col("_ws")
    return out.with_columns(step.cast(pl.Int32).alias("step")).drop("_r", "_ws")


#: The one definition of step time, named wherever a step time is shown.
STEP_TIME = "step time: first rank in to last rank out (ProfilerStep windows on the aligned clock)"

STEP_TIME_SCHEMA = {"step": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64, "step_ns": pl.Int64,
                    "ranks": pl.UInt32, "first_rank": pl.Int32, "last_rank": pl.Int32}


def step_times(windows: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """Per step, the step time (see STEP_TIME): from the earliest start of the step's window on
    any rank to the latest end, on the aligned clock (own clock + clock_offset_ns). Also the
    number of ranks with that step, and which rank started first and which ended last."""
    if windows.height == 0:
        return pl.DataFrame(schema=STEP_TIME_SCHEMA)
    off = ranks.select(pl.col("rank").cast(pl.Int32), pl.col("clock_offset_ns").fill_null(0).alias("_off"))
    w = (windows.with_columns(pl.col("rank").cast(pl.Int32)).join(off, on="rank", how="left")
         .with_columns((pl.col("start_ns") + pl.col("_off").fill_null(0)).alias("_s"),
                       (pl.col("end_ns") + pl.col("_off").fill_null(0)).alias("_e")))
    out = w.group_by("step").agg(
        pl.col("_s").min().alias("start_ns"), pl.col("_e").max().alias("end_ns"), pl.len().alias("ranks"),
        pl.col("rank").sort_by(["_s", "rank"]).first().alias("first_rank"),
        pl.col("rank").sort_by([pl.col("_e"), pl.col("rank")], descending=[True, False]).first().alias("last_rank"))
    out = out.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("step_ns"))
    return out.select(list(STEP_TIME_SCHEMA)).cast(STEP_TIME_SCHEMA).sort("step")
