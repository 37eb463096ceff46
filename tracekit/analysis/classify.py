"""Classification of collective calls into parallelism dimensions (DP, PP, EP, TP, CP, WORLD)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import polars as pl
import pyarrow as pa

from tracekit.analysis._frames import P2P_OPS, Frame, frame, table
from tracekit.errors import TracekitError
from tracekit.schema import DIMS

Overrides = Mapping[str, Iterable[str]]

_DESC_TOKENS: dict[str, tuple[str, ...]] = {
    "DP": ("dp", "ddp", "fsdp", "hsdp", "data", "replicate", "shard", "dense"),
    "PP": ("pp", "pipe", "pipeline"),
    "EP": ("ep", "moe", "expert", "experts", "a2a"),
    "TP": ("tp", "tensor", "mp", "sp"),
    "CP": ("cp", "context", "ulysses"),
    "WORLD": ("default", "world", "global"),
}
_REDUCE_OPS = ("all_reduce", "reduce_scatter", "all_gather")
_TP_MAX_BYTES = 256 << 20


#: Names that mark a run's all-to-alls as the sparse embedding exchange of a recommender model
#: (TorchRec's KJT and pooled-embedding all-to-alls, FBGEMM's table-batched embedding kernels),
#: and names that mark experts; an all-to-all is EP by its shape only without the first or with both.
EMBEDDING_NAMES = (r"KJTAllToAll|PooledEmbeddings(?:AllToAll|Awaitable)|sparse_data_dist"
                   r"|split_embedding_codegen|dense_embedding_codegen")
EXPERT_NAMES = r"(?i)\bmoe|expert|dpsk::ep::|deep_ep::"


def embedding_all_to_all(names: Iterable[str | None]) -> bool:
    """True when the run's event names show embedding sharding and nothing names experts: its
    all-to-alls then carry embeddings (DLRM), not tokens to experts."""
    embedding = re.compile(EMBEDDING_NAMES)
    expert = re.compile(EXPERT_NAMES)
    seen = False
    for n in names:
        if not n:
            continue
        if expert.search(n):
            return False
        seen = seen or bool(embedding.search(n))
    return seen


class DimsError(TracekitError):
    """A `--dims` mapping is malformed."""


def parse_dims(spec: str | Overrides | None) -> dict[str, list[str]]:
    """Parse `dp=GROUP[,GROUP],ep=...` (or a mapping) into {DIM: [group or desc substring]}."""
    if spec is None or spec == "":
        return {}
    if isinstance(spec, Mapping):
        items = {str(k).upper(): [str(v)] if isinstance(v, str) else [str(x) for x in v]
                 for k, v in spec.items()}
    else:
        items = {}
        current = None
        for token in (t.strip() for t in str(spec).split(",")):
            if not token:
                continue
            if "=" in token:
                key, _, value = token.partition("=")
                current = key.strip().upper()
                items.setdefault(current, [])
                token = value.strip()
            if current is None:
                raise DimsError(f"--dims: {token!r} has no dimension (expected dim=GROUP, e.g. dp=3)")
            if token:
                items[current].append(token)
    bad = sorted(set(items) - set(DIMS))
    if bad:
        raise DimsError(f"--dims: unknown dimension(s) {bad}; use {', '.join(d.lower() for d in DIMS)}")
    return items


def desc_dims(desc: str | None) -> list[str]:
    """Dimensions named by a process-group description, e.g. 'dp_stage0' -> ['DP']."""
    if not desc:
        return []
    tokens = set(re.split(r"[^a-z]+", desc.lower()))
    if "undefined" in tokens:
        return []
    return [dim for dim, words in _DESC_TOKENS.items() if tokens & set(words)]


def classify(
    collectives: Frame, groups: Frame, ranks: Frame, *, overrides: str | Overrides | None = None,
    embedding: bool = False,
) -> tuple[pa.Table, pa.Table]:
    """Give every collective call a dim, and every group the set of dims seen on it.

    Precedence, per call: a user override for the group (`overrides`: {dim: [group id or desc
    substring]}), the parser's `dim_hint` (from kernel names such as DeepEP), the PG description
    (tokens like dp, fsdp, ep, moe, pp, tp, cp, default_pg), then the shape: all_to_all -> EP
    (OTHER with `embedding`, a run whose names show embedding sharding, `embedding_all_to_all`);
    send/recv with at most two distinct peers per rank -> PP (more -> EP); all_reduce,
    reduce_scatter or all_gather inside one host, on messages up to 256 MiB, on a rank that also
    reduces over an inter-host group -> TP; other reductions -> DP, or WORLD on the whole world
    unless it is the only group that reduces; anything else on the whole world -> WORLD, else
    OTHER; a call whose op is unknown (an arg-less kernel) on a group that reduces takes the dim
    of the group's reductions. When a group carries several candidate dims, the op picks among them.
    """
    coll = frame(collectives, "collectives")
    grp = frame(groups, "groups")
    rk = frame(ranks, "ranks")
    rules = parse_dims(overrides)
    world = set(rk.get_column("rank").to_list()) | set(coll.get_column("rank").to_list())
    world_size = max([len(world), *[w for w in rk.get_column("world_size").to_list() if w]], default=0)
    host_of = {r: h for r, h in zip(rk.get_column("rank").to_list(), rk.get_column("host").to_list(), strict=True)
               if h is not None}

    members: dict[str, set[int]] = {}
    descs: dict[str, str | None] = {}
    for g, d, rs in zip(grp.get_column("group").to_list(), grp.get_column("desc").to_list(),
                        grp.get_column("ranks").to_list(), strict=True):
        members[g] = set(rs or [])
        descs[g] = d
    for g, rs in coll.group_by("group").agg(pl.col("rank").unique()).iter_rows():
        if g is not None:
            members.setdefault(g, set()).update(rs)
            descs.setdefault(g, None)

    def is_world(g: str) -> bool:
        return world_size > 1 and len(members.get(g, ())) >= world_size

    def intra_host(g: str) -> bool:
        hs = {host_of.get(r) for r in members.get(g, ())}
        return len(members.get(g, ())) > 1 and None not in hs and len(hs) == 1

    override_dims: dict[str, list[str]] = {}
    for dim, tokens in rules.items():
        for g in members:
            if any(t == g or (descs[g] and t.lower() in descs[g].lower()) for t in tokens):
                override_dims.setdefault(g, []).append(dim)
    unmatched = [t for dim, ts in rules.items() for t in ts
                 if not any(t == g or (descs[g] and t.lower() in descs[g].lower()) for g in members)]
    if unmatched:
        raise DimsError(f"--dims: no group matches {unmatched} (by id or description)")

    ops = coll.group_by("group").agg(pl.col("op").unique())
    ops_of = {g: set(o) for g, o in ops.iter_rows() if g is not None}
    reducing = [g for g, o in ops_of.items() if o & set(_REDUCE_OPS)]
    inter_reduce_ranks: set[int] = set()
    for g in reducing:
        if not intra_host(g) and not is_world(g):
            inter_reduce_ranks |= members.get(g, set())
    peers = (coll.filter(pl.col("op").is_in(P2P_OPS) & pl.col("peer").is_not_null())
             .group_by("group", "rank").agg(pl.col("peer").n_unique().alias("n"))
             .group_by("group").agg(pl.col("n").max()))
    max_peers = {g: n for g, n in peers.iter_rows() if g is not None}
    sizes = coll.group_by("group").agg(pl.col("in_bytes").median()).iter_rows()
    median_bytes = {g: b for g, b in sizes if g is not None}

    def shape_dim(g: str | None, op: str) -> str:
        a2a = "OTHER" if embedding else "EP"
        if g is None:
            return "PP" if op in P2P_OPS else a2a if op == "all_to_all" else "OTHER"
        if op == "all_to_all":
            return a2a
        if op == "other" and g in reducing:
            return shape_dim(g, next(o for o in _REDUCE_OPS if o in ops_of[g]))
        if op in P2P_OPS:
            return "PP" if max_peers.get(g, 0) <= 2 else "EP"
        if op in _REDUCE_OPS:
            small = (median_bytes.get(g) or 0) <= _TP_MAX_BYTES
            if intra_host(g) and small and members.get(g, set()) & inter_reduce_ranks:
                return "TP"
            if is_world(g):
                return "DP" if reducing == [g] else "WORLD"
            return "DP"
        return "WORLD" if is_world(g) else "OTHER"

    def pick(cands: list[str], op: str, g: str | None) -> str:
        if len(cands) == 1:
            return cands[0]
        natural = shape_dim(g, op)
        if natural in cands:
            return natural
        prefer = {"all_to_all": ("EP", "CP"), "send": ("PP", "CP", "EP"), "recv": ("PP", "CP", "EP")}
        for d in prefer.get(op, ("DP", "TP", "CP", "WORLD")):
            if d in cands:
                return d
        return cands[0]

    cache: dict[tuple[str | None, str, str | None], str] = {}

    def dim_of(g: str | None, op: str, hint: str | None) -> str:
        key = (g, op, hint)
        if key in cache:
            return cache[key]
        if g in override_dims:
            d = pick(override_dims[g], op, g)
        elif hint and hint.upper() in DIMS:
            d = hint.upper()
        else:
            from_desc = desc_dims(descs.get(g)) if g is not None else []
            if from_desc == ["WORLD"]:
                from_desc = []
            d = pick(from_desc, op, g) if from_desc else shape_dim(g, op)
        cache[key] = d
        return d

    keys = coll.select("group", "op", "dim_hint").unique()
    mapping = keys.with_columns(
        pl.Series("dim", [dim_of(g, o or "other", h) for g, o, h in keys.iter_rows()], dtype=pl.String)
    )
    out = coll.drop("dim").join(mapping, on=["group", "op", "dim_hint"], how="left", nulls_equal=True,
                                maintain_order="left")
    seen = out.group_by("group").agg(pl.col("dim").unique().sort())
    dims_of = {g: d for g, d in seen.iter_rows() if g is not None}
    known = set(grp.get_column("group").to_list())
    extra = [g for g in dims_of if g not in known]
    if extra:
        grp = pl.concat([grp, pl.DataFrame({"group": extra, "size": [len(members[g]) for g in extra],
                                            "ranks": [sorted(members[g]) for g in extra]},
                                           schema={"group": pl.String, "size": grp.schema["size"],
                                                   "ranks": grp.schema["ranks"]})],
                        how="diagonal_relaxed")
    grp = grp.with_columns(
        pl.col("group").map_elements(lambda g: sorted(dims_of.get(g, [])), return_dtype=pl.List(pl.String))
        .alias("dims")
    )
    return table(out, "collectives"), table(grp, "groups")
