"""Parser for nccl-tests results: the text table every `*_perf` binary prints, and `-J` JSON.

Text (NVIDIA/nccl-tests `src/common.cu`, `src/util.cu`, every release): a header (`# nThread 1
nGpus 1 minBytes 8 ...`, `# Using devices`, one `#  Rank  0 Group  0 Pid 123 on host device  0
[0000:04:00] NVIDIA H100 ...` line per rank; newer builds add `# nccl-tests version ...` and `#
Collective test starting: all_reduce_perf`), a column header (`# size count type redop root time
algbw busbw #wrong time algbw busbw #wrong`; older builds drop `redop`/`root` for some tests and
say `error` for `#wrong`; `-I 1` adds `i_min i_max i_p99 i_cv%` per side; `-S 1` a timestamp;
`-C 1` says `cputime`), one row per size, and a footer (`# Avg bus bandwidth : ...`). Copies
found in the wild lose the `# ` prefixes, gain launcher prefixes (`[1,0]<stdout>:`), stray lines
between rows (NCCL INFO lines, warnings) or sit in markdown code fences; several runs may share
one file. Columns are read by the names of the column header, rows are found anywhere in a line.

JSON (`-J FILE`, nccl-tests 2.17.3+): `{version, start_time, args, env, nccl_version,
config{nthreads, ngpus, ..., devices[{rank, group, pid, hostname, device, device_hex,
device_info}]}, results[{size, count, type, redop, root, out_of_place{time|cpu_time, alg_bw,
bus_bw, nwrong}, in_place{...}, actual_iterations, experiment_name}], out_of_bounds,
average_bus_bandwidth, end_time}`. A file cut short (the job died) is salvaged result by result.

Every non-blank line (text) or result (JSON) is a record: stored as a `microbench` row, or
skipped with a reason (`header`, `not nccl-tests output`, `malformed row`, ...).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tracekit._limits import MAX_GBS, MAX_WORLD_SIZE, RANGES, checked_int, out_of_range
from tracekit.errors import InputError
from tracekit.parsers._json_keys import warn_repeated_keys
from tracekit.parsers._lines import LineSource, account, line_batches, strip_ansi, text
from tracekit.parsers._nccl import version_of
from tracekit.parsers._stream import ByteStream, value_end
from tracekit.parsers.registry import Format
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "nccl_tests"
# 2: sendrecv_perf rows are op sendrecv; 3: tests_version; 4: host_names; 5: nranks without device lines;
# 6: no inferred rank count beyond MAX_WORLD_SIZE
PARSER_VERSION = "7"
MAX_JSON_BYTES = 256 << 20

#: Binary name -> op (the `microbench` vocabulary: the collectives' ops, plus `sendrecv`, nccl-tests'
#: ring of pairs in which every rank sends to the next and receives from the previous at once).
TEST_OPS = {
    "all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter",
    "alltoall_perf": "all_to_all", "alltoallv_perf": "all_to_all", "broadcast_perf": "broadcast",
    "reduce_perf": "reduce", "gather_perf": "gather", "scatter_perf": "scatter", "sendrecv_perf": "sendrecv",
    "hypercube_perf": "other",
}
#: nccl-tests type names (current and pre-2.x builds) -> bytes per element.
TYPE_BYTES = {
    "int8": 1, "char": 1, "uint8": 1, "int32": 4, "int": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "half": 2, "float16": 2, "float": 4, "float32": 4, "double": 8, "float64": 8, "bfloat16": 2,
    "f8e4m3": 1, "f8e5m2": 1,
}
REDOPS = frozenset({"sum", "prod", "max", "min", "avg", "mulsum", "none"})
_SIDE_FIELDS = ("time", "algbw", "busbw", "wrong", "i_min", "i_max", "i_p99", "i_cv")
_HEADER_NAMES = {
    "size": "size", "count": "count", "type": "type", "redop": "redop", "root": "root",
    "time": "time", "cputime": "time", "algbw": "algbw", "busbw": "busbw", "#wrong": "wrong",
    "error": "wrong", "i_min": "i_min", "i_max": "i_max", "i_p99": "i_p99", "i_cv%": "i_cv",
    "timestamp": "timestamp",
}
DEFAULT_COLUMNS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "wrong",
                   "time", "algbw", "busbw", "wrong")

_TEST_NAME = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(sorted(TEST_OPS, key=len, reverse=True))
                        + r")(?![A-Za-z0-9])")
_STARTING = re.compile(r"Collective test starting:\s*(\S+)")
_NTHREAD = re.compile(
    r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)\s+step:\s*(\d+)\((\w+)\)\s+"
    r"warmup iters:\s*(\d+)\s+iters:\s*(\d+)(?:\s+agg iters:\s*(\d+))?\s+validation:\s*(\d+)"
    r"(?:\s+graph:\s*(\d+))?")
_RANK = re.compile(
    r"Rank\s+(\d+)\s+(?:Group\s+(-?\d+)\s+)?(?:Pid\s+(\d+)\s+)?on\s+(\S+)\s+device\s+(\d+)\s+"
    r"\[([^\]]{0,64})\](.*)")
_VERSION = re.compile(r"nccl-tests version\s+(\S+)(?:\s+nccl-headers=(\d+))?(?:\s+nccl-library=(\d+))?")
_COLUMNS = re.compile(r"\bsize\s+count\s+type\b")
_FOOTER = re.compile(r"(Avg bus bandwidth|Out of bounds values)\s*:\s*(\S+)")
_TIMESTAMP = re.compile(r"(\d{4}-\d{2}-\d{2})\s+(\d{2}:\d{2}:\d{2})\s*$")
_NUMBER = re.compile(r"^-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$|^N/A$|^nan$|^-?inf$")
_SNIFF = re.compile(rb"nThread\s+\d+\s+nGpus\s+\d+\s+minBytes|#\s*size\s+count\s+type\s|Avg bus bandwidth\s*:"
                    rb"|Collective test starting:")
_JSON_KEYS = re.compile(rb'"(results|minimum_bytes|out_of_place|in_place|alg_bw|bus_bw|nccl_version|'
                        rb'average_bus_bandwidth|average_bus_bandwidith|experiment_name)"\s*:')
_COMMENT = re.compile(r"(?:^|[:>\]])\s*#")
_HEADER_LINE = re.compile(
    r"Using devices|nThread\s+\d|out-of-place|\(elements\)|Out of bounds values|Avg bus bandwidth"
    r"|Collective test (starting|concluded)|Reducing maxBytes|Blocking Enabled|Parallel Init Enabled"
    r"|Writing JSON output")


@dataclass
class NcclTestsResult(ParseResult):
    """The common result plus how many tables (runs) the file held."""

    runs: int = 0


def sniff_text(head: bytes) -> bool:
    """True when text looks like nccl-tests output (a header or a column header line)."""
    return _SNIFF.search(head) is not None


def sniff_json(head: bytes) -> bool:
    """True when the start of a JSON object looks like an nccl-tests `-J` report."""
    body = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not body.startswith(b"{"):
        return False
    keys = {m.group(1) for m in _JSON_KEYS.finditer(body)}
    return (b"results" in keys and len(keys) >= 2) or {b"out_of_place", b"alg_bw"} <= keys


def op_of_test(test: str | None) -> str | None:
    """The collective an nccl-tests binary measures (`all_reduce_perf` -> `all_reduce`)."""
    if not test:
        return None
    name = Path(test).name.removesuffix("_mpi")
    return TEST_OPS.get(name)


def test_in(name: str) -> str | None:
    """The nccl-tests binary named in a string (a command line, a file name), if exactly one."""
    found = {m.group(1) for m in _TEST_NAME.finditer(name)}
    return found.pop() if len(found) == 1 else None


@dataclass
class _Run:
    """The context of one test invocation: header facts shared by its tables."""

    test: str | None = None
    test_source: str | None = None
    nthreads: int | None = None
    ngpus: int | None = None
    iters: int | None = None
    warmup_iters: int | None = None
    graph: int | None = None
    nccl_version: str | None = None
    tests_version: str | None = None
    ranks: dict[int, tuple[str, str]] = field(default_factory=dict)
    seen_header: bool = False

    def devices(self) -> list[str] | None:
        return [self.ranks[r][1] for r in sorted(self.ranks)] if self.ranks else None

    def host_names(self) -> list[str] | None:
        return [self.ranks[r][0] for r in sorted(self.ranks)] if self.ranks else None

    def hosts(self) -> tuple[int | None, int | None]:
        if not self.ranks:
            return None, None
        per_host = Counter(h for h, _ in self.ranks.values())
        return len(per_host), max(per_host.values())


def _version_from_code(code: int | None) -> str | None:
    return version_of(code)


def _num(tok: str) -> float | None:
    if tok in ("N/A", "nan", "-nan"):
        return None
    try:
        v = float(tok)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _int(tok: str | None) -> int | None:
    if tok is None:
        return None
    v = _num(tok)
    return int(v) if v is not None and abs(v) < 2**62 else None


def _i32(tok: str | None) -> int | None:
    """`_int` for the int32 columns (root, iterations, graph): None outside their range."""
    v = _int(tok)
    return v if v is not None and -(2**31) <= v < 2**31 else None


class TableReader:
    """Reads nccl-tests text line by line (`feed`), collecting `microbench` rows.

    `feed` returns what the line was: "row", "header", "comment" (a `#` line that may be
    nccl-tests' or anyone's), "malformed row" or None (not nccl-tests text). The NCCL log parser
    feeds it the lines that are not NCCL records, so a file holding both yields both.
    """

    def __init__(self, source: str, *, file_test: str | None = None) -> None:
        self.source = source
        self.file_test = file_test
        self.rows: list[dict[str, Any]] = []
        self.warnings: list[str] = []
        self.run = _Run()
        self.columns: tuple[str, ...] | None = None
        self.table = -1
        self._table_rows = 0
        self._table_start = 0
        self._prelude_test: str | None = None
        self._next_versions: tuple[str | None, str | None] | None = None  # read after a run: the next run's
        self.time_kind = "time"

    # -- lines ---------------------------------------------------------------------------------

    def feed(self, line: str) -> str | None:
        row = self._row(line)
        if row is not None:
            return row
        m = _STARTING.search(line)
        if m:
            carried = None if self.run.seen_header or self._table_rows else (
                self.run.nccl_version, self.run.tests_version)
            self._new_run()
            self.run.test, self.run.test_source = Path(m.group(1)).name, "header"
            if carried is not None:
                self.run.nccl_version, self.run.tests_version = carried
            return "header"
        m = _NTHREAD.search(line)
        if m:
            if self.run.seen_header or self._table_rows:
                keep = (self.run.test, self.run.test_source) if self.run.test_source == "header" and \
                    not self.run.seen_header else None
                self._new_run(keep_prelude=True)
                if keep:
                    self.run.test, self.run.test_source = keep
            g = m.groups()
            self.run.seen_header = True
            self.run.nthreads, self.run.ngpus = _i32(g[0]), _i32(g[1])
            self.run.warmup_iters, self.run.iters = _i32(g[6]), _i32(g[7])
            self.run.graph = _i32(g[10])
            if self._prelude_test and not self.run.test:
                self.run.test, self.run.test_source = self._prelude_test, "command line"
            return "header"
        m = _RANK.search(line)
        if m and ("device" in line and "on" in line):
            rank = checked_int(m.group(1), "rank")
            if rank is None:
                return out_of_range("rank")
            self.run.ranks[rank] = (m.group(4), m.group(7).strip())
            return "header"
        m = _VERSION.search(line)
        if m:
            versions = (_version_from_code(_int(m.group(3) or m.group(2))), m.group(1))
            if self.run.seen_header or self._table_rows:  # a script's next test: its header follows
                self._next_versions = versions
            else:
                self.run.nccl_version, self.run.tests_version = versions
            return "header"
        if _COLUMNS.search(line):
            self._columns(line)
            return "header"
        m = _FOOTER.search(line)
        if m:
            self._end_table()
            return "header"
        if _HEADER_LINE.search(line):
            return "header"
        if _COMMENT.search(line):
            return "comment"
        name = test_in(line)
        if name is not None:
            self._prelude_test = name
        return None

    def _new_run(self, *, keep_prelude: bool = False) -> None:
        self._end_table()
        self.run = _Run()
        if self._next_versions is not None:
            self.run.nccl_version, self.run.tests_version = self._next_versions
            self._next_versions = None
        self.columns = None
        self.time_kind = "time"
        if not keep_prelude:
            self._prelude_test = None

    def _columns(self, line: str) -> None:
        self._end_table()
        body = line[_COLUMNS.search(line).start():]  # type: ignore[union-attr]
        cols: list[str] = []
        self.time_kind = "cputime" if re.search(r"\bcputime\b", body) else "time"
        for tok in body.split():
            name = _HEADER_NAMES.get(tok.lower())
            if name is not None:
                cols.append(name)
        self.columns = tuple(cols) if cols.count("size") == 1 else None

    def _end_table(self) -> None:
        if self._table_rows:
            self._finish_table()
        self._table_rows = 0

    def _row(self, line: str) -> str | None:
        toks = line.split()
        start = _row_start(toks)
        if start is None:
            return None
        toks = toks[start:]
        ts_ns = None
        tail = " ".join(toks[-2:])
        m = _TIMESTAMP.search(tail) if len(toks) >= 2 else None
        if m:
            ts_ns = _parse_ts(m.group(1), m.group(2))
            toks = toks[:-2]
        cols = self.columns or DEFAULT_COLUMNS
        cols = tuple(c for c in cols if c != "timestamp")
        values = _assign(toks, cols)
        if values is None:
            return "malformed row"
        if self._table_rows == 0:
            self.table += 1
            self._table_start = len(self.rows)
        self._table_rows += 1
        self.rows.append(self._make_row(values, ts_ns))
        return "row"

    def _make_row(self, v: dict[str, Any], ts_ns: int | None) -> dict[str, Any]:
        dtype = v.get("type")
        root = _i32(v.get("root"))
        row: dict[str, Any] = {
            "source": self.source, "run": self.table, "size_bytes": _int(v["size"]),
            "count": _int(v.get("count")), "dtype": dtype, "redop": v.get("redop"),
            "root": root, "ts_ns": ts_ns,
        }
        for side in ("oop", "ip"):
            got = v.get(side) or {}
            row[f"{side}_time_us"] = _num(got["time"]) if "time" in got else None
            row[f"{side}_algbw"] = _num(got["algbw"]) if "algbw" in got else None
            row[f"{side}_busbw"] = _num(got["busbw"]) if "busbw" in got else None
            row[f"{side}_wrong"] = _int(got.get("wrong"))
            for k in ("i_min", "i_max", "i_p99"):
                row[f"{side}_{k}_us"] = _num(got[k]) if k in got else None
            row[f"{side}_i_cv_pct"] = _num(got["i_cv"]) if "i_cv" in got else None
        return row

    def _finish_table(self) -> None:
        rows = self.rows[self._table_start:]
        run = self.run
        test, inferred = run.test, False
        if test is None and self._prelude_test:
            test = self._prelude_test
        if test is None and self.file_test:
            test = self.file_test
        nranks = len(run.ranks) or None
        if test is None:
            test, why = infer_test(rows, nranks)
            inferred = True
            if test is not None:
                self.warnings.append(f"table {rows[0]['run']}: no test name in the output; inferred "
                                     f"{test} from the columns ({why})")
            else:
                self.warnings.append(f"table {rows[0]['run']}: no test name and the columns do not tell ({why})")
        op = op_of_test(test)
        if nranks is None and op is not None:
            nranks, warning = _missing_nranks(rows, op, f"table {rows[0]['run']}: no device lines")
            self.warnings.append(warning)
        hosts, per_host = run.hosts()
        devices = run.devices()
        for r in rows:
            r.update(test=test, test_inferred=inferred, op=op, nranks=nranks, hosts=hosts,
                     ranks_per_host=per_host, devices=devices, host_names=run.host_names(), iters=run.iters,
                     warmup_iters=run.warmup_iters, graph=run.graph, nccl_version=run.nccl_version,
                     tests_version=run.tests_version, time_kind=self.time_kind)

    def close(self) -> list[dict[str, Any]]:
        self._end_table()
        return self.rows


def _row_start(toks: list[str]) -> int | None:
    """Index of a result row's `size` token: two integers then a known type name."""
    n = len(toks)
    for i in range(n - 2):
        a = toks[i]
        if not a.isdigit():
            continue
        if toks[i + 1].isdigit() and toks[i + 2].lower() in TYPE_BYTES:
            return i
    return None


def _assign(toks: list[str], cols: tuple[str, ...]) -> dict[str, Any] | None:
    """Map a row's tokens onto the column names; the out-of-place side may be absent (blank)."""
    pre = [c for c in cols if c not in _SIDE_FIELDS]
    first_side = len(pre)
    n_side = (len(cols) - first_side) // 2 if len(cols) > first_side else 0
    side_cols = cols[first_side:first_side + n_side]
    if len(toks) < first_side:
        return None
    out: dict[str, Any] = dict(zip(pre, toks[:first_side], strict=True))
    if out.get("redop") is not None and out["redop"].lower() not in REDOPS:
        return None
    rest = toks[first_side:]
    if not all(_NUMBER.match(t) for t in rest):
        return None
    if len(rest) == 2 * n_side:
        out["oop"] = dict(zip(side_cols, rest[:n_side], strict=True))
        out["ip"] = dict(zip(side_cols, rest[n_side:], strict=True))
    elif len(rest) == n_side and n_side:
        out["ip"] = dict(zip(side_cols, rest, strict=True))
    elif not rest:
        return None
    else:
        return None
    return out


def _parse_ts(day: str, clock: str) -> int | None:
    import datetime as dt

    try:
        t = dt.datetime.fromisoformat(f"{day}T{clock}").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return None
    return int(t.timestamp()) * 1_000_000_000


#: Ops whose `count` column is per rank, so size / (count x type bytes) is the rank count.
_COUNT_PER_RANK = frozenset({"all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"})
#: busbw / algbw = c (n - 1) / n for these ops (nccl-tests' factors), so n = c / (c - f).
_BUS_FACTOR_SCALE = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0}
#: nccl-tests prints algbw and busbw with two decimals: each printed value is within this of the true one.
_PRINTED_HALF_UNIT = 0.005


def _share_ratios(rows: list[dict[str, Any]]) -> list[float]:
    """size / (count x type bytes) of every row that has all three: how many ranks' worth of data it names."""
    out = []
    for r in rows:
        width = TYPE_BYTES.get(str(r.get("dtype") or "").lower())
        if width and r.get("count") and r.get("size_bytes"):
            out.append(r["size_bytes"] / (r["count"] * width))
    return out


def _missing_nranks(rows: list[dict[str, Any]], op: str, where: str) -> tuple[int | None, str]:
    """`infer_nranks` for a table with no device lines, and the warning that says how (or that its
    rows cannot be replayed)."""
    nranks, why = infer_nranks(rows, op)
    if nranks:
        return nranks, f"{where}; {nranks} ranks inferred from {why}"
    return None, f"{where} and the rank count cannot be told from the columns ({why}): its rows cannot be replayed"


def infer_nranks(rows: list[dict[str, Any]], op: str) -> tuple[int | None, str]:
    """The rank count of a table printed without its `Using devices` lines (outputs pasted in docs
    and READMEs): size / count where the count is per rank, else nccl-tests' busbw / algbw factor
    inverted. Each printed value is taken as exact to half its last digit, and n is kept only when
    one whole number fits every row: a coarse table gives no count, never a wrong one; nor does a
    count beyond `MAX_WORLD_SIZE` (huge sizes or factors; a run's rank list is sized by it)."""
    n, why = _infer_nranks(rows, op)
    if n is not None and checked_int(n, "world_size") is None:
        return None, f"{why}: {_digits(n)} ranks, beyond {MAX_WORLD_SIZE:,}"
    return n, why


def _digits(n: int) -> str:
    text = str(n)
    return f"{text[:12]}... ({len(text)} digits)" if len(text) > 15 else f"{n:,}"


def _infer_nranks(rows: list[dict[str, Any]], op: str) -> tuple[int | None, str]:
    if op in _COUNT_PER_RANK:
        ratios = set(_share_ratios(rows))
        if len(ratios) == 1 and (n := ratios.pop()) >= 2 and n == int(n):
            return int(n), f"size / count = {int(n)} on every row"
    scale = _BUS_FACTOR_SCALE.get(op)
    if scale is None:
        return None, f"{op}'s busbw equals its algbw whatever the rank count"
    low, high, values = 2.0, math.inf, 0
    for r in rows:
        for side in ("oop", "ip"):
            a, b = r.get(f"{side}_algbw"), r.get(f"{side}_busbw")
            if not a or not b or a <= _PRINTED_HALF_UNIT or b <= a:
                continue
            values += 1
            f_low = (b - _PRINTED_HALF_UNIT) / (a + _PRINTED_HALF_UNIT)
            f_high = (b + _PRINTED_HALF_UNIT) / (a - _PRINTED_HALF_UNIT)
            if f_low >= scale:  # no rank count gives it: the factor is scale (n - 1) / n < scale
                return None, f"busbw / algbw of {f_low:.3g} on a row, beyond {op}'s {scale:g} for any rank count"
            low = max(low, scale / (scale - f_low))
            high = min(high, scale / (scale - f_high) if f_high < scale else math.inf)
    if not values:
        return None, "no row whose busbw exceeds its algbw"
    whole = range(math.ceil(low), math.floor(high) + 1) if high < math.inf else range(0)
    if len(whole) == 1:
        return whole[0], f"busbw / algbw on {values} value{'s' if values > 1 else ''}"
    if not whole and high < math.inf:
        return None, f"busbw / algbw disagree between rows ({low:.2f} to {high:.2f} ranks)"
    return None, f"busbw / algbw is too coarse to tell (somewhere from {math.ceil(low)} to " + (
        f"{math.floor(high)} ranks)" if high < math.inf else "any higher count)")


def infer_test(rows: list[dict[str, Any]], nranks: int | None) -> tuple[str | None, str]:
    """Guess the binary from a table: the size/count ratio (how many ranks' worth of data a row
    names), whether there is a reduction and a root, and the busbw/algbw factor."""
    ratios, factors = _share_ratios(rows), []
    redop = any(r.get("redop") not in (None, "none") for r in rows)
    rooted = any(r.get("root") is not None and r["root"] >= 0 for r in rows)
    for r in rows:
        for side in ("oop", "ip"):
            a, b = r.get(f"{side}_algbw"), r.get(f"{side}_busbw")
            if a and b and a >= 0.1:
                factors.append(b / a)
    if not ratios:
        return None, "no row with a size, count and type"
    ratios.sort()
    per_rank = ratios[len(ratios) // 2]
    many = per_rank > 1.5
    factors.sort()
    factor = factors[len(factors) // 2] if factors else None
    why = f"size/count = {per_rank:g} element{'s' if per_rank != 1 else ''} per count, " + (
        f"busbw/algbw = {factor:.3g}, " if factor is not None else "") + (
        "a reduction" if redop else "no reduction") + (", a root" if rooted else ", no root")
    if rooted:
        if redop:
            return "reduce_perf", why
        return ("gather_perf", why + "; scatter_perf prints the same") if many else ("broadcast_perf", why)
    if redop:
        return ("reduce_scatter_perf", why) if many else ("all_reduce_perf", why)
    if many:
        return "all_gather_perf", why + "; alltoall_perf prints the same"
    if factor is not None and factor > 1.05:
        return "all_reduce_perf", why
    return "sendrecv_perf", why


# ---------------------------------------------------------------------------------------------


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None) -> NcclTestsResult:
    """Parse nccl-tests text or `-J` JSON into the `microbench` table."""
    where = os.fspath(path)
    try:
        from tracekit.parsers._stream import peek

        head = peek(where, 4096)
    except OSError as exc:
        raise InputError(where, f"cannot read ({exc.strerror or exc})") from exc
    if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
        return _parse_json(where, sink)
    return _parse_text(where, sink)


def _parse_text(where: str, sink: SourceSink) -> NcclTestsResult:
    stats = SourceStats()
    reader = TableReader(where, file_test=test_in(Path(where).name))
    info = LineSource()
    try:
        for batch in line_batches(where, info):
            for raw in batch:
                if not raw.strip():
                    continue
                outcome = reader.feed(text(strip_ansi(raw)))
                _count(stats, outcome)
    except OSError as exc:
        raise InputError(where, f"cannot read ({exc.strerror or exc})") from exc
    rows = reader.close()
    stats.warnings.extend(reader.warnings)
    account(info, stats)
    if not rows:
        raise InputError(where, "no nccl-tests result rows")
    return _finish(where, sink, stats, rows)


def _count(stats: SourceStats, outcome: str | None) -> None:
    if outcome == "row":
        stats.store()
    elif outcome == "comment":
        stats.skip("header")
    elif outcome is None:
        stats.skip("not nccl-tests output")
    else:
        stats.skip(outcome)


#: Beyond this a time (us) measures nothing: the project's duration range (`_limits.RANGES`).
MAX_TIME_US = RANGES["duration_ns"][1] / 1e3


def _drop_unphysical(rows: list[dict[str, Any]], warnings: list[str]) -> None:
    """Bandwidths and times beyond any hardware read as missing, counted in one warning (a
    hostile or corrupt row would otherwise be stored, printed and scored as a measurement)."""
    dropped = 0
    for r in rows:
        for k, v in r.items():
            if type(v) is not float:
                continue
            limit = MAX_GBS if k.endswith(("_algbw", "_busbw")) else MAX_TIME_US if k.endswith("_us") else None
            if limit is not None and abs(v) > limit:
                r[k] = None
                dropped += 1
    if dropped:
        warnings.append(f"{dropped:,} bandwidth or time value{'s' if dropped > 1 else ''} beyond any hardware "
                        f"(over {MAX_GBS:g} GB/s or {MAX_TIME_US:g} us) read as missing")


def _finish(where: str, sink: SourceSink, stats: SourceStats, rows: list[dict[str, Any]]) -> NcclTestsResult:
    _drop_unphysical(rows, stats.warnings)
    sink.add("microbench", _columns(rows))
    runs = len({r["run"] for r in rows})
    return NcclTestsResult(stats=stats, runs=runs)


def _columns(rows: Iterable[dict[str, Any]]) -> dict[str, list[Any]]:
    rows = list(rows)
    names: list[str] = []
    for r in rows:
        for k in r:
            if k not in names:
                names.append(k)
    return {k: [r.get(k) for r in rows] for k in names}


# -- JSON ------------------------------------------------------------------------------------


def _parse_json(where: str, sink: SourceSink) -> NcclTestsResult:
    stats = SourceStats()
    buf = bytearray()
    try:
        with ByteStream(where) as stream:
            for chunk in stream.chunks():
                buf += chunk
                if len(buf) > MAX_JSON_BYTES:
                    raise InputError(where, f"larger than the {MAX_JSON_BYTES}-byte limit")
    except OSError as exc:
        raise InputError(where, f"cannot read ({exc.strerror or exc})") from exc
    data = bytes(buf)
    warn_repeated_keys(data, stats.warnings)
    try:
        doc = msgspec.json.decode(data)
        results = doc.get("results") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or not isinstance(results, list):
            raise InputError(where, "not an nccl-tests JSON report (no `results` list)")
        salvaged = False
    except (msgspec.DecodeError, RecursionError):
        doc, results = _salvage(data)
        if results is None:
            raise InputError(where, "corrupt JSON and no `results` list to salvage") from None
        salvaged = True
    cfg = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    devices = cfg.get("devices") if isinstance(cfg.get("devices"), list) else doc.get("devices")
    devices = [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []
    args = doc.get("args") if isinstance(doc.get("args"), list) else []
    test = Path(str(args[0])).name.removesuffix("_mpi") if args and isinstance(args[0], str) else None
    if test not in TEST_OPS:
        test = test_in(" ".join(str(a) for a in args)) or test_in(Path(where).name)
    hosts = Counter(str(d.get("hostname")) for d in devices if d.get("hostname") is not None)
    ranks = {_int(str(d.get("rank"))) for d in devices} - {None}
    nranks = len(ranks) or None
    by_rank = sorted(devices, key=lambda d: _int(str(d.get("rank"))) or 0)
    names = [str(d.get("device_info", "")).strip() or None for d in by_rank]
    host_names = [str(d.get("hostname")) for d in by_rank] if hosts else None
    rows: list[dict[str, Any]] = []
    for res in results:
        if not isinstance(res, dict) or _int(str(res.get("size"))) is None:
            stats.skip("malformed result")
            continue
        row: dict[str, Any] = {
            "source": where, "run": 0, "size_bytes": _int(str(res["size"])), "count": _int(str(res.get("count"))),
            "dtype": _str(res.get("type")), "redop": _str(res.get("redop")),
            "root": _i32(str(res.get("root")).strip()), "ts_ns": None,
        }
        kind = None
        for side, key in (("oop", "out_of_place"), ("ip", "in_place")):
            got = res.get(key) if isinstance(res.get(key), dict) else {}
            t = got.get("time", got.get("cpu_time"))
            if "cpu_time" in got:
                kind = "cputime"
            elif "time" in got:
                kind = kind or "time"
            row[f"{side}_time_us"] = _float(t)
            row[f"{side}_algbw"] = _float(got.get("alg_bw"))
            row[f"{side}_busbw"] = _float(got.get("bus_bw"))
            wrong = _float(got.get("nwrong"))
            row[f"{side}_wrong"] = int(wrong) if wrong is not None else None
            per = res.get(f"{key}_per_iter") if isinstance(res.get(f"{key}_per_iter"), dict) else {}
            row[f"{side}_i_min_us"] = _float(per.get("min_us"))
            row[f"{side}_i_max_us"] = _float(per.get("max_us"))
            row[f"{side}_i_p99_us"] = _float(per.get("p99_us"))
            row[f"{side}_i_cv_pct"] = _float(per.get("cv_pct"))
        row["time_kind"] = kind
        rows.append(row)
        stats.store()
    if not rows:
        raise InputError(where, "no nccl-tests results")
    inferred = False
    if test is None:
        test, why = infer_test(rows, nranks)
        inferred = True
        stats.warnings.append(f"no test name in the report's args; inferred {test} from the columns ({why})")
    op = op_of_test(test)
    if salvaged:
        stats.warnings.append(f"truncated or corrupt JSON: salvaged {len(rows)} results")
    if nranks is None and op is not None:
        nranks, warning = _missing_nranks(rows, op, "no devices in the report")
        stats.warnings.append(warning)
    iters = _i32(str(cfg.get("iterations"))) if cfg else None
    warm = _i32(str(cfg.get("warmup_iters"))) if cfg else None
    graph = _i32(str(cfg.get("graph"))) if cfg else None
    version = _version_from_code(_int(str(doc.get("nccl_version"))))
    for row in rows:
        row.update(test=test, test_inferred=inferred, op=op, nranks=nranks,
                   hosts=len(hosts) or None, ranks_per_host=max(hosts.values()) if hosts else None,
                   devices=names or None, host_names=host_names, iters=iters, warmup_iters=warm, graph=graph,
                   nccl_version=version)
    return _finish(where, sink, stats, rows)


def _str(v: Any) -> str | None:
    if v is None:
        return None
    s = str(v).strip()
    return s or None


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return float(v) if abs(v) < 2**1023 else None
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return _num(v.strip())
    return None


def _salvage(data: bytes) -> tuple[dict[str, Any], list[Any] | None]:
    """The complete top-level values before the damage and every complete result object."""
    doc: dict[str, Any] = {}
    for key in (b'"config"', b'"args"', b'"nccl_version"', b'"devices"'):
        i = data.find(key)
        if i < 0:
            continue
        j = data.find(b":", i + len(key))
        k = j + 1
        while k < len(data) and data[k] in b" \t\r\n":
            k += 1
        if k >= len(data):
            continue
        end = value_end(data, k, True)
        if end > 0:
            with contextlib.suppress(msgspec.DecodeError, RecursionError):
                doc[key.strip(b'"').decode()] = msgspec.json.decode(data[k:end])
    i = data.find(b'"results"')
    if i < 0:
        return doc, None
    j = data.find(b"[", i)
    if j < 0:
        return doc, None
    results: list[Any] = []
    for raw in _array_items(data, j + 1):
        try:
            results.append(msgspec.json.decode(raw))
        except (msgspec.DecodeError, RecursionError):
            results.append(None)
    return doc, results


def _array_items(data: bytes, pos: int) -> Iterator[bytes]:
    n = len(data)
    while pos < n:
        while pos < n and data[pos] in b" \t\r\n,":
            pos += 1
        if pos >= n or data[pos] == 0x5D:
            return
        end = value_end(data, pos, True)
        if end <= pos or end > n:  # incomplete, or nothing a value can start with (a stray `}`)
            return
        if data[pos] == 0x7B and data[end - 1] != 0x7D:
            return
        yield data[pos:end]
        pos = end


FORMAT = Format(name=NAME, description="nccl-tests output", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: sniff_json(head.data),  # where DETECTION names it first: -J JSON
                        lambda head: not head.json_object and sniff_text(head.data)))  # then: text tables
