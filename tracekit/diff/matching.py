"""Lining two runs up: ranks, process groups, steps and collective instances."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

from tracekit.diff.results import GroupPair


def frame(t: pa.Table) -> pl.DataFrame:
    """An Arrow table as polars, categoricals as strings."""
    df = pl.from_arrow(t)
    assert isinstance(df, pl.DataFrame)
    return df.with_columns(pl.col(pl.Categorical).cast(pl.String))


def _span(ranks: Iterable[int]) -> str:
    rs = sorted(ranks)
    if not rs:
        return "none"
    if rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 2:
        return f"{rs[0]}-{rs[-1]}"
    return ",".join(map(str, rs[:8])) + (f",... ({len(rs)})" if len(rs) > 8 else "")


def match_ranks(a: pl.DataFrame, b: pl.DataFrame) -> tuple[str, dict[int, int], list[str]]:
    """Ranks of A to ranks of B: by rank number when both runs have the same world size and ranks,
    else by (host, local device) where both are known, else by rank number where it exists in both,
    else (no rank in common, as many present on each side) in rank order. Returns (how, mapping, notes)."""
    notes: list[str] = []
    ra = {int(r["rank"]): r for r in a.iter_rows(named=True)}
    rb = {int(r["rank"]): r for r in b.iter_rows(named=True)}
    world_a = _world(a, ra)
    world_b = _world(b, rb)
    for name, world, present in (("A", world_a, ra), ("B", world_b, rb)):
        if world > len(present):
            missing = sorted(set(range(world)) - set(present))
            notes.append(f"{name} has {len(present)} of its {world} ranks (missing: {_span(missing)})")
    if world_a != world_b:
        notes.append(f"world sizes differ: A {world_a} ranks, B {world_b}")
        key_a = {(r["host"], r["local_device"]): k for k, r in ra.items()
                 if r.get("host") is not None and r.get("local_device") is not None}
        key_b = {(r["host"], r["local_device"]): k for k, r in rb.items()
                 if r.get("host") is not None and r.get("local_device") is not None}
        common = set(key_a) & set(key_b)
        if common:
            mapping = {key_a[k]: key_b[k] for k in sorted(common, key=lambda k: key_a[k])}
            notes.append(f"ranks matched by host and local device: {len(mapping)} of A's {len(ra)}")
            return "host_device", mapping, notes
    mapping = {r: r for r in sorted(set(ra) & set(rb))}
    if not mapping and ra and len(ra) == len(rb):
        mapping = dict(zip(sorted(ra), sorted(rb), strict=True))
        notes.append(f"no rank in common: the {len(ra)} present rank(s) matched in order "
                     f"({', '.join(f'{x}->{y}' for x, y in list(mapping.items())[:4])})")
        return "order", mapping, notes
    if world_a != world_b:
        notes.append(f"no (host, device) in common: ranks matched by number, {len(mapping)} of A's {len(ra)}")
    return "rank", mapping, notes


def _world(df: pl.DataFrame, rows: dict[int, dict]) -> int:
    sizes = [w for w in df.get_column("world_size").to_list() if w] if "world_size" in df.columns else []
    return max(sizes) if sizes else (max(rows) + 1 if rows else 0)


def match_groups(a: pl.DataFrame, b: pl.DataFrame, ranks: dict[int, int]) -> tuple[list[GroupPair], list[str]]:
    """Process groups of A to groups of B: by membership (mapped through `ranks`) and description,
    then by membership alone, then by description alone (when it names one group on each side),
    then by the same group id (PG name or NCCL commId) and size. Returns the pairs and the notes on
    groups left unmatched."""
    def members(row: dict, mapping: dict[int, int] | None) -> tuple[int, ...]:
        rs = row.get("ranks") or []
        return tuple(sorted(mapping.get(r, -1 - r) for r in rs) if mapping is not None else sorted(rs))

    rows_a = list(a.iter_rows(named=True))
    rows_b = list(b.iter_rows(named=True))
    left = {r["group"]: r for r in rows_a}
    right = {r["group"]: r for r in rows_b}
    pairs: list[GroupPair] = []
    for how in ("membership+desc", "membership", "desc", "id"):
        index: dict[object, list[str]] = {}
        for g, r in right.items():
            index.setdefault(_group_key(how, members(r, None), r.get("desc"), g), []).append(g)
        for g, r in list(left.items()):
            key = _group_key(how, members(r, ranks), r.get("desc"), g)
            cands = index.get(key) or []
            if how == "desc" and (r.get("desc") is None or len(cands) != 1):
                continue
            if cands:
                gb = cands.pop(0)
                pairs.append(GroupPair(group_a=g, group_b=gb, desc=r.get("desc"), size=len(r.get("ranks") or []),
                                       by=how))
                del left[g]
                del right[gb]
    notes = []
    if left:
        notes.append(f"{len(left)} group(s) of A have no match in B: {', '.join(sorted(left)[:6])}")
    if right:
        notes.append(f"{len(right)} group(s) of B have no match in A: {', '.join(sorted(right)[:6])}")
    return sorted(pairs, key=lambda p: p.group_a), notes


def _group_key(how: str, members: tuple[int, ...], desc: str | None, group: str) -> object:
    if how == "membership+desc":
        return (members, desc)
    if how == "membership":
        return members
    if how == "id":
        return (group, len(members))
    return desc


@dataclass(frozen=True)
class InstancePairs:
    """Matched instances (instance in A, instance in B) and how many were matched each way."""

    pairs: pl.DataFrame  # instance_a, instance_b
    by_seq: int
    by_position: int
    only_a: int
    only_b: int


def match_instances(inst_a: pl.DataFrame, inst_b: pl.DataFrame, groups: list[GroupPair],
                    steps: list[int]) -> InstancePairs:
    """Instances of A to instances of B, per matched group: by sequence number when the group's
    sequence of (op, size) is the same in both runs, else by (step, op, size, position among the
    group's calls of that op and size in the step). Only the compared steps count."""
    cols = ["instance", "group", "seq", "op", "bytes", "step"]
    gmap = {p.group_a: p.group_b for p in groups}
    a = inst_a.select(cols).filter(pl.col("group").is_in(list(gmap)) & pl.col("step").is_in(steps))
    a = a.with_columns(pl.col("group").replace_strict(gmap, return_dtype=pl.String))
    b = inst_b.select(cols).filter(pl.col("group").is_in(list(gmap.values())) & pl.col("step").is_in(steps))
    found = []
    by_seq = by_pos = 0
    b_by_group = {g: part for (g,), part in b.group_by("group")}
    for (g,), pa_ in a.group_by("group"):
        pb = b_by_group.get(g)
        if pb is None:
            continue
        pa_, pb = pa_.sort("seq"), pb.sort("seq")
        same = (pa_.height == pb.height and pa_.get_column("op").to_list() == pb.get_column("op").to_list()
                and pa_.get_column("bytes").to_list() == pb.get_column("bytes").to_list())
        if same:
            found.append(pl.DataFrame({"instance_a": pa_.get_column("instance"),
                                       "instance_b": pb.get_column("instance")}))
            by_seq += pa_.height
            continue
        key = ["step", "op", "bytes", "_k"]
        ka = pa_.with_columns(pl.int_range(pl.len()).over("step", "op", "bytes").alias("_k"))
        kb = pb.with_columns(pl.int_range(pl.len()).over("step", "op", "bytes").alias("_k"))
        j = ka.join(kb, on=key, how="inner", nulls_equal=True, suffix="_b").select(
            pl.col("instance").alias("instance_a"), pl.col("instance_b"))
        found.append(j)
        by_pos += j.height
    pairs = (pl.concat(found) if found else pl.DataFrame(schema={"instance_a": pl.Int64, "instance_b": pl.Int64}))
    return InstancePairs(pairs=pairs, by_seq=by_seq, by_position=by_pos, only_a=a.height - pairs.height,
                         only_b=b.height - pairs.height)
