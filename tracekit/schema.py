"""Arrow schemas for every tracekit table: the contract between ingest, analysis, replay and viz.

Times are int64 nanoseconds since the epoch on the rank's own clock; `ranks.clock_offset_ns`
maps them onto the run's common clock (common = own + offset). Repeated strings are
dictionary-encoded. Column names are the contract: columns may be added, never renamed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa

SCHEMA_VERSION = "1"

KINDS = ("compute", "comm", "memcpy", "memset", "cpu_op", "runtime", "annotation", "sync")
OPS = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
    "send", "recv", "barrier", "gather", "scatter", "other",
)
#: A microbenchmark's op: a collective's, or nccl-tests' `sendrecv` (every rank sends to the next rank
#: and receives from the previous one at once, a ring of pairs).
MICROBENCH_OPS = (*OPS, "sendrecv")
DIMS = ("DP", "PP", "EP", "TP", "CP", "WORLD", "OTHER")
STATES = ("completed", "started", "scheduled", "unknown")
CHANNEL_PATTERNS = ("ring", "tree", "p2p", "nvls", "collnet")
TRANSPORTS = ("P2P", "SHM", "NET", "NVLS", "COLLNET")
COUNTER_METRICS = (
    "tx_bytes", "rx_bytes", "tx_pkts", "rx_pkts", "xmit_wait", "pfc_pause", "ecn_marked",
    "discards", "errors", "speed_bps",
)
NODE_KINDS = ("gpu", "nic", "nvswitch", "leaf", "spine", "core", "switch", "host", "storage")
NETWORKS = ("backend", "frontend")
LOG_LEVELS = ("TRACE", "INFO", "WARN", "ERROR", "ABORT")
MEDIA = ("nvlink", "pcie", "ib", "roce", "eth")
COUNTER_KINDS = ("counter", "gauge", "rate")
DIRECTIONS = ("tx", "rx")
#: Window flags. `wrapped` and `gap` are notes (the window keeps its numbers); the others void the
#: metric they name (see `tracekit.telemetry`).
LINK_FLAGS = ("wrapped", "saturated", "reset", "gap", "wrap_ambiguous")

DICT_STR = pa.dictionary(pa.int32(), pa.string())


def _schema(name: str, fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(fields, metadata={"tracekit.table": name, "tracekit.schema_version": SCHEMA_VERSION})


RANKS = _schema("ranks", [
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("world_size", pa.int32()),
    pa.field("host", pa.string()),
    pa.field("pid", pa.int64()),
    pa.field("local_device", pa.int32()),
    pa.field("source_file", pa.string()),
    pa.field("source_format", DICT_STR),
    pa.field("clock_offset_ns", pa.int64()),
    pa.field("backend", DICT_STR),
    pa.field("device_name", pa.string()),
    pa.field("nccl_version", pa.string()),
    pa.field("bus_id", pa.string()),
])

GROUPS = _schema("groups", [
    pa.field("group", pa.string(), nullable=False),
    pa.field("desc", pa.string()),
    pa.field("backend", DICT_STR),
    pa.field("ranks", pa.list_(pa.int32())),
    pa.field("size", pa.int32()),
    pa.field("dims", pa.list_(pa.string())),
    pa.field("ranks_complete", pa.bool_()),
])

EVENTS = _schema("events", [
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("lane", DICT_STR),
    pa.field("kind", DICT_STR),
    pa.field("name", DICT_STR),
    pa.field("ts_ns", pa.int64()),
    pa.field("dur_ns", pa.int64()),
    pa.field("step", pa.int32()),
    pa.field("correlation", pa.int64()),
    pa.field("coll_id", pa.int64()),
    pa.field("cat", DICT_STR),
    pa.field("external_id", pa.int64()),
    pa.field("sync_lane", DICT_STR),
    pa.field("sync_correlation", pa.int64()),
])

COLLECTIVES = _schema("collectives", [
    pa.field("coll_id", pa.int64(), nullable=False),
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("group", DICT_STR),
    pa.field("seq", pa.int64()),
    pa.field("op", DICT_STR),
    pa.field("dtype", DICT_STR),
    pa.field("in_bytes", pa.int64()),
    pa.field("out_bytes", pa.int64()),
    pa.field("nranks", pa.int32()),
    pa.field("peer", pa.int32()),
    pa.field("in_splits", pa.list_(pa.int64())),
    pa.field("out_splits", pa.list_(pa.int64())),
    pa.field("ts_ns", pa.int64()),
    pa.field("dur_ns", pa.int64()),
    pa.field("state", DICT_STR),
    pa.field("algo", DICT_STR),
    pa.field("proto", DICT_STR),
    pa.field("source", DICT_STR),
    pa.field("instance", pa.int64()),
    pa.field("dim", DICT_STR),
    pa.field("seq_explicit", pa.bool_()),
    pa.field("name", DICT_STR),
    pa.field("lane", DICT_STR),
    pa.field("step", pa.int32()),
    pa.field("comms_id", pa.string()),
    pa.field("dim_hint", DICT_STR),
])

CHANNELS = _schema("channels", [
    pa.field("group", DICT_STR),
    pa.field("rank", pa.int32()),
    pa.field("channel", pa.int32()),
    pa.field("pattern", DICT_STR),
    pa.field("peer_rank", pa.int32()),
    pa.field("direction", DICT_STR),
    pa.field("transport", DICT_STR),
    pa.field("detail", pa.string()),
    pa.field("nic", pa.string()),
    pa.field("proxy_rank", pa.int32()),
])

COUNTERS = _schema("counters", [
    pa.field("ts_ns", pa.int64()),
    pa.field("device", DICT_STR),
    pa.field("port", DICT_STR),
    pa.field("metric", DICT_STR),
    pa.field("value", pa.float64()),
    pa.field("kind", DICT_STR),
    pa.field("bits", pa.int32()),
    pa.field("source_format", DICT_STR),
    pa.field("host", DICT_STR),
    pa.field("direction", DICT_STR),
    pa.field("qualifier", DICT_STR),
    pa.field("saturated", pa.bool_()),
    pa.field("saturable", pa.bool_()),
    pa.field("name", DICT_STR),
])

LINK_SAMPLES = _schema("link_samples", [
    pa.field("link", DICT_STR),
    pa.field("device", DICT_STR),
    pa.field("port", DICT_STR),
    pa.field("ts_ns", pa.int64()),
    pa.field("interval_ns", pa.int64()),
    pa.field("tx_bytes", pa.float64()),
    pa.field("rx_bytes", pa.float64()),
    pa.field("tx_util", pa.float64()),
    pa.field("rx_util", pa.float64()),
    pa.field("flags", pa.list_(pa.string())),
    pa.field("origin", DICT_STR),
    pa.field("host", DICT_STR),
    pa.field("link_end", DICT_STR),
    pa.field("speed_bps", pa.float64()),
    pa.field("tx_pkts", pa.float64()),
    pa.field("rx_pkts", pa.float64()),
    pa.field("tx_pause", pa.float64()),
    pa.field("rx_pause", pa.float64()),
    pa.field("ecn_marked", pa.float64()),
    pa.field("tx_discards", pa.float64()),
    pa.field("rx_discards", pa.float64()),
    pa.field("tx_errors", pa.float64()),
    pa.field("rx_errors", pa.float64()),
    pa.field("xmit_wait", pa.float64()),
    pa.field("flag_detail", pa.list_(pa.string())),
])

TOPOLOGY_NODES = _schema("topology_nodes", [
    pa.field("node", pa.string(), nullable=False),
    pa.field("kind", DICT_STR),
    pa.field("host", pa.string()),
    pa.field("rank", pa.int32()),
    pa.field("network", DICT_STR),
    pa.field("guid", pa.string()),
    pa.field("lid", pa.int32()),
    pa.field("description", pa.string()),
    pa.field("source_format", DICT_STR),
])

TOPOLOGY_LINKS = _schema("topology_links", [
    pa.field("link", pa.string(), nullable=False),
    pa.field("src", pa.string()),
    pa.field("dst", pa.string()),
    pa.field("gbps", pa.float64()),
    pa.field("latency_ns", pa.int64()),
    pa.field("medium", DICT_STR),
    pa.field("plane", pa.int32()),
    pa.field("network", DICT_STR),
    pa.field("tier", DICT_STR),
    pa.field("cables", pa.int32()),
    pa.field("src_port", pa.string()),
    pa.field("dst_port", pa.string()),
    pa.field("width", DICT_STR),
    pa.field("speed", DICT_STR),
    pa.field("source_format", DICT_STR),
])

MICROBENCH = _schema("microbench", [
    pa.field("source", pa.string()),
    pa.field("run", pa.int32()),
    pa.field("test", DICT_STR),
    pa.field("test_inferred", pa.bool_()),
    pa.field("op", DICT_STR),
    pa.field("size_bytes", pa.int64()),
    pa.field("count", pa.int64()),
    pa.field("dtype", DICT_STR),
    pa.field("redop", DICT_STR),
    pa.field("root", pa.int32()),
    pa.field("nranks", pa.int32()),
    pa.field("ranks_per_host", pa.int32()),
    pa.field("hosts", pa.int32()),
    pa.field("devices", pa.list_(pa.string())),
    pa.field("oop_time_us", pa.float64()),
    pa.field("oop_algbw", pa.float64()),
    pa.field("oop_busbw", pa.float64()),
    pa.field("oop_wrong", pa.int64()),
    pa.field("ip_time_us", pa.float64()),
    pa.field("ip_algbw", pa.float64()),
    pa.field("ip_busbw", pa.float64()),
    pa.field("ip_wrong", pa.int64()),
    pa.field("ts_ns", pa.int64()),
    pa.field("time_kind", DICT_STR),
    pa.field("iters", pa.int32()),
    pa.field("warmup_iters", pa.int32()),
    pa.field("graph", pa.int32()),
    pa.field("nccl_version", pa.string()),
    pa.field("oop_i_min_us", pa.float64()),
    pa.field("oop_i_max_us", pa.float64()),
    pa.field("oop_i_p99_us", pa.float64()),
    pa.field("oop_i_cv_pct", pa.float64()),
    pa.field("ip_i_min_us", pa.float64()),
    pa.field("ip_i_max_us", pa.float64()),
    pa.field("ip_i_p99_us", pa.float64()),
    pa.field("ip_i_cv_pct", pa.float64()),
    pa.field("tests_version", pa.string()),
    pa.field("host_names", pa.list_(pa.string())),
])

LOG_MESSAGES = _schema("log_messages", [
    pa.field("rank", pa.int32()),
    pa.field("host", pa.string()),
    pa.field("pid", pa.int64()),
    pa.field("tid", pa.int64()),
    pa.field("ts_ns", pa.int64()),
    pa.field("level", DICT_STR),
    pa.field("subsystem", DICT_STR),
    pa.field("message", pa.string()),
    pa.field("source", DICT_STR),
    pa.field("line", pa.int64()),
])

#: COLL lines of an NCCL log whose global rank is unknown (their communicator's Init lines were
#: cut off, or the process GPU is outside the log's world communicator): kept with what the line
#: gives, `rank` null and `rank_reason` saying why; never matched or replayed.
UNRANKED_COLLECTIVES = _schema("unranked_collectives", [
    pa.field("rank", pa.int32()),
    pa.field("rank_reason", DICT_STR),
    pa.field("group", DICT_STR),
    pa.field("comm", pa.string()),
    pa.field("host", pa.string()),
    pa.field("pid", pa.int64()),
    pa.field("comm_rank", pa.int32()),
    pa.field("seq", pa.int64()),
    pa.field("op", DICT_STR),
    pa.field("name", DICT_STR),
    pa.field("dtype", DICT_STR),
    pa.field("in_bytes", pa.int64()),
    pa.field("out_bytes", pa.int64()),
    pa.field("nranks", pa.int32()),
    pa.field("root", pa.int32()),
    pa.field("peer_local", pa.int32()),
    pa.field("ts_ns", pa.int64()),
    pa.field("algo", DICT_STR),
    pa.field("proto", DICT_STR),
    pa.field("source", DICT_STR),
    pa.field("line", pa.int64()),
])

SCHEMAS: dict[str, pa.Schema] = {
    "ranks": RANKS,
    "groups": GROUPS,
    "events": EVENTS,
    "collectives": COLLECTIVES,
    "channels": CHANNELS,
    "counters": COUNTERS,
    "link_samples": LINK_SAMPLES,
    "topology_nodes": TOPOLOGY_NODES,
    "topology_links": TOPOLOGY_LINKS,
    "microbench": MICROBENCH,
    "log_messages": LOG_MESSAGES,
    "unranked_collectives": UNRANKED_COLLECTIVES,
}

VOCABULARIES: dict[tuple[str, str], tuple[str, ...]] = {
    ("events", "kind"): KINDS,
    ("collectives", "op"): OPS,
    ("collectives", "dim"): DIMS,
    ("collectives", "state"): STATES,
    ("channels", "pattern"): CHANNEL_PATTERNS,
    ("channels", "transport"): TRANSPORTS,
    ("counters", "metric"): COUNTER_METRICS,
    ("counters", "kind"): COUNTER_KINDS,
    ("counters", "direction"): DIRECTIONS,
    ("topology_nodes", "kind"): NODE_KINDS,
    ("topology_links", "medium"): MEDIA,
    ("topology_nodes", "network"): NETWORKS,
    ("topology_links", "network"): NETWORKS,
    ("log_messages", "level"): LOG_LEVELS,
    ("microbench", "op"): MICROBENCH_OPS,
    ("unranked_collectives", "op"): OPS,
}


class SchemaError(ValueError):
    """A table does not match its tracekit schema."""


def empty(name: str) -> pa.Table:
    """An empty table with the named schema."""
    return empty_table(SCHEMAS[name])


def empty_table(arrow_schema: pa.Schema) -> pa.Table:
    """An empty table of `arrow_schema`; unlike `Schema.empty_table`, it never imports pandas
    (pyarrow loads it there, when installed: 0.2-0.6 s of CPU)."""
    return pa.Table.from_batches([], schema=arrow_schema)


def conform(name: str, data: pa.Table | Mapping[str, Iterable] | None) -> pa.Table:
    """Cast `data` to the named schema: order columns, add missing ones as nulls, keep extras last.

    Accepts an Arrow table or a mapping of column name to values (lists or arrays).
    """
    schema = SCHEMAS[name]
    if data is None:
        return empty(name)
    if not isinstance(data, pa.Table):
        data = pa.table({k: _as_array(v) for k, v in data.items()})
    n = data.num_rows
    columns, fields = [], []
    for field in schema:
        if field.name in data.column_names:
            col = data.column(field.name)
            if col.type != field.type:
                try:
                    col = col.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise SchemaError(f"{name}.{field.name}: cannot cast {col.type} to {field.type}: {exc}") from exc
        else:
            if not field.nullable:
                raise SchemaError(f"{name}: required column {field.name!r} is missing")
            col = pa.nulls(n, field.type)
        columns.append(col)
        fields.append(field)
    for extra in data.column_names:
        if extra not in schema.names:
            columns.append(data.column(extra))
            fields.append(data.schema.field(extra))
    out = pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=schema.metadata))
    return out


#: integers beyond int64 nulled by `_as_array` in this process (a safety net; parsers range-check)
_OVERFLOWS = [0]


def overflows() -> int:
    """How many integers beyond int64 `conform` has nulled so far in this process."""
    return _OVERFLOWS[0]


def _as_array(values: Iterable) -> pa.Array | pa.ChunkedArray:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    values = values if isinstance(values, list) else list(values)
    try:
        return pa.array(values)
    except OverflowError:  # an integer beyond int64 (a parser's unbounded number): null, counted by the sink
        return pa.array([_without_overflow(v) for v in values])
    except UnicodeEncodeError:  # lone surrogates (from JSON "\ud800" escapes): not valid UTF-8
        return pa.array([v.encode("utf-8", "replace").decode("utf-8") if isinstance(v, str) else v
                         for v in values])


def _without_overflow(v: object) -> object:
    """`v` with every integer beyond int64 made null (and counted), inside lists too."""
    if type(v) is int and not -(2**63) <= v < 2**63:
        _OVERFLOWS[0] += 1
        return None
    if isinstance(v, list):
        return [_without_overflow(x) for x in v]
    return v


def validate(name: str, table: pa.Table) -> list[str]:
    """Return a list of problems (empty when the table conforms to the named schema)."""
    problems: list[str] = []
    schema = SCHEMAS.get(name)
    if schema is None:
        return [f"unknown table {name!r}"]
    for field in schema:
        if field.name not in table.column_names:
            problems.append(f"{name}: missing column {field.name!r}")
            continue
        actual = table.schema.field(field.name).type
        if actual != field.type:
            problems.append(f"{name}.{field.name}: type {actual}, expected {field.type}")
        elif not field.nullable and table.column(field.name).null_count:
            problems.append(f"{name}.{field.name}: {table.column(field.name).null_count} nulls in a required column")
    for (table_name, column), vocab in VOCABULARIES.items():
        if table_name != name or column not in table.column_names:
            continue
        seen = {v for v in table.column(column).to_pylist() if v is not None}
        unknown = sorted(seen - set(vocab))
        if unknown:
            problems.append(f"{name}.{column}: values outside the vocabulary: {unknown[:5]}")
    meta = table.schema.metadata or {}
    if meta.get(b"tracekit.schema_version") != SCHEMA_VERSION.encode():
        problems.append(f"{name}: schema_version metadata missing or not {SCHEMA_VERSION}")
    return problems


def check(name: str, table: pa.Table) -> pa.Table:
    """Raise SchemaError when the table does not conform; return it unchanged otherwise."""
    problems = validate(name, table)
    if problems:
        raise SchemaError("; ".join(problems))
    return table
