"""What every telemetry parser shares: the metric spec, the `counters` row buffer, reading bytes,
and the time stamps users put next to tools that print none (perfquery, sysfs dumps)."""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit._limits import RANGES, out_of_range
from tracekit.errors import InputError
from tracekit.parsers._stream import ByteStream
from tracekit.store import ParseResult, SourceSink, SourceStats

#: Largest (decompressed) telemetry file read at once.
MAX_BYTES = 4 << 30
TS_MIN, TS_MAX = RANGES["time_ns"]
#: Ceilings at which InfiniBand PortCounters stick ("clamp at all ones") instead of wrapping.
SATURATION_CEILINGS = (2**16 - 1, 2**32 - 1)


@dataclass(frozen=True)
class MetricSpec:
    """How one source metric maps onto a canonical `counters` metric.

    `scale` turns the source value into the canonical unit (IB words x4, Mb/s x1e6). A
    `saturable` counter is an InfiniBand one that may clamp at all ones: the sample is marked
    `saturated` when the device's raw value (canonical / `device_factor`) sits at a ceiling
    (2^bits-1 when `bits` is known and the counter saturates, else 2^16-1 or 2^32-1).
    """

    metric: str
    direction: str | None
    kind: str = "counter"
    bits: int | None = 64
    scale: float = 1.0
    saturable: bool = False
    device_factor: float = 1.0
    qualifier: str | None = None


def is_saturated(spec: MetricSpec, value: float) -> bool:
    """True when a sample of a saturable counter sits at its ceiling."""
    if not spec.saturable or value != value:
        return False
    raw = value / spec.device_factor
    if spec.bits is not None and spec.bits <= 32:
        return raw >= 2**spec.bits - 1
    return raw in SATURATION_CEILINGS


def saturated_mask(spec: MetricSpec, values: np.ndarray) -> np.ndarray:
    """`is_saturated` over an array of canonical values."""
    if not spec.saturable:
        return np.zeros(values.shape, bool)
    raw = values / spec.device_factor
    if spec.bits is not None and spec.bits <= 32:
        return raw >= 2**spec.bits - 1
    return np.isin(raw, np.array(SATURATION_CEILINGS, np.float64))


_COLUMNS = ("ts_ns", "host", "device", "port", "metric", "direction", "qualifier", "value", "kind",
            "bits", "saturated", "saturable", "name")


class CounterBuffer:
    """Buffers `counters` rows and writes them to the sink in batches; keeps the time span."""

    def __init__(self, sink: SourceSink, source_format: str, stats: SourceStats, *, batch: int = 65_536) -> None:
        self.sink = sink
        self.source_format = source_format
        self.stats = stats
        self.batch = batch
        self.rows: dict[str, list[Any]] = {c: [] for c in _COLUMNS}
        self.ts_min: int | None = None
        self.ts_max: int | None = None
        self.saturated: dict[tuple[str, str], int] = {}

    def add(self, ts_ns: int | None, host: str | None, device: str, port: str, spec: MetricSpec,
            value: float, *, name: str, qualifier: str | None = None) -> None:
        """Store one sample (already in canonical units); a time stamp out of range is skipped."""
        if ts_ns is not None and not TS_MIN <= ts_ns <= TS_MAX:
            self.stats.skip(out_of_range("ts"))
            return
        rows = self.rows
        sat = is_saturated(spec, value)
        if sat:
            key = (f"{host + '/' if host and host != device else ''}{device}:{port}", name)
            self.saturated[key] = self.saturated.get(key, 0) + 1
        for col, v in (("ts_ns", ts_ns), ("host", host), ("device", device), ("port", port),
                       ("metric", spec.metric), ("direction", spec.direction),
                       ("qualifier", qualifier if qualifier is not None else spec.qualifier),
                       ("value", float(value)), ("kind", spec.kind), ("bits", spec.bits),
                       ("saturated", sat), ("saturable", spec.saturable), ("name", name)):
            rows[col].append(v)
        self.stats.store()
        if ts_ns is not None:
            self.ts_min = ts_ns if self.ts_min is None else min(self.ts_min, ts_ns)
            self.ts_max = ts_ns if self.ts_max is None else max(self.ts_max, ts_ns)
        if len(rows["ts_ns"]) >= self.batch:
            self.flush()

    def add_table(self, table: pa.Table, *, in_range: bool = False) -> None:
        """Store a ready batch of rows (columns named as in `counters`, plus `source_format`);
        rows whose time stamp is out of range were counted as stored by the caller and are moved
        to skipped here (`in_range`: the caller checked that there are none)."""
        if table.num_rows and not in_range and "ts_ns" in table.column_names:
            ts = table.column("ts_ns")
            bad = pc.fill_null(pc.or_(pc.less(ts, TS_MIN), pc.greater(ts, TS_MAX)), False)
            n_bad = pc.sum(bad).as_py() or 0
            if n_bad:
                table = table.filter(pc.invert(bad))
                self.stats.stored -= n_bad
                self.stats.skipped[out_of_range("ts")] += n_bad
        if table.num_rows:
            self.sink.add("counters", table)

    def flush(self) -> None:
        if not self.rows["ts_ns"]:
            return
        data = {c: self.rows[c] for c in _COLUMNS}
        data["ts_ns"] = pa.array(data["ts_ns"], pa.int64())
        data["value"] = pa.array(data["value"], pa.float64())
        data["bits"] = pa.array(data["bits"], pa.int32())
        data["saturated"] = pa.array(data["saturated"], pa.bool_())
        data["saturable"] = pa.array(data["saturable"], pa.bool_())
        data["source_format"] = [self.source_format] * len(self.rows["ts_ns"])
        self.sink.add("counters", data)
        self.rows = {c: [] for c in _COLUMNS}

    def saturation_warnings(self) -> list[str]:
        """One warning per saturated (port, counter): it can give no rate while it stays there."""
        out = []
        for (where, name), n in sorted(self.saturated.items())[:20]:
            out.append(f"{where} {name} is at a saturation ceiling (2^16-1 or 2^32-1) in {n} sample(s): "
                       "an InfiniBand counter that stopped counting; windows ending there are flagged")
        if len(self.saturated) > 20:
            out.append(f"... and {len(self.saturated) - 20} more saturated counters")
        return out

    def result(self) -> ParseResult:
        self.flush()
        self.stats.warnings.extend(self.saturation_warnings())
        return ParseResult(stats=self.stats, ts_min_ns=self.ts_min, ts_max_ns=self.ts_max)


def read_bytes(path: str | os.PathLike[str], stats: SourceStats | None = None, *,
               max_bytes: int = MAX_BYTES, max_line_bytes: int | None = None) -> bytes:
    """The whole (gunzipped) file; a truncated gzip is salvaged with a warning. A line-oriented
    format passes `max_line_bytes`: a line longer than that (a file with no newline) is refused
    as soon as it is seen, not after the whole file is in memory."""
    where = os.fspath(path)
    buf = bytearray()
    line = 0  # bytes since the last newline
    try:
        with ByteStream(where) as stream:
            for chunk in stream.chunks():
                buf += chunk
                if len(buf) > max_bytes:
                    raise InputError(where, f"larger than the {max_bytes}-byte limit")
                if max_line_bytes is not None:
                    nl = chunk.rfind(b"\n")
                    line = line + len(chunk) if nl < 0 else len(chunk) - nl - 1
                    if line > max_line_bytes:
                        raise InputError(where, f"a line longer than {max_line_bytes:,} bytes (no newline after "
                                                f"byte {len(buf) - line:,}): not a line-oriented text file")
            if stream.corrupt:
                raise InputError(where, stream.corrupt)
            if stream.truncated_gzip and stats is not None:
                stats.warnings.append("truncated gzip stream: read up to the cut")
    except OSError as exc:
        raise InputError(where, f"cannot read ({exc.strerror or exc})") from exc
    return bytes(buf)


def decode_text(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(where, f"not UTF-8 text (byte {exc.start})") from exc


_EPOCH = re.compile(r"^\s*#?\s*(?:(?:ts|time|timestamp|date)\s*[:=]\s*)?(\d{9,19}(?:\.\d+)?)\s*$", re.I)
_ISO = re.compile(r"^\s*#?\s*(?:(?:ts|time|timestamp|date)\s*[:=]\s*)?"
                  r"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s*$", re.I)


def epoch_to_ns(value: float | str) -> int:
    """Epoch seconds, milliseconds, microseconds or nanoseconds (by magnitude) to ns."""
    text = str(value).strip()
    if "e" in text.lower():
        text = f"{float(text):.9f}"
    whole, _, frac = text.partition(".")
    digits = len(whole.lstrip("-"))
    zeros = 9 if digits <= 11 else 6 if digits <= 14 else 3 if digits <= 17 else 0
    ns = int(whole) * 10**zeros
    if zeros and frac:
        ns += (-1 if whole.startswith("-") else 1) * int((frac + "0" * zeros)[:zeros])
    return ns


def time_line(line: str) -> int | None:
    """The time (ns since epoch) a stand-alone time-stamp line gives, else None.

    Accepted: epoch seconds/ms/us/ns (`date +%s.%N`), or ISO 8601 (`date -Is`; no zone = UTC),
    optionally after `#` and `ts:`/`time=`/`timestamp:`/`date:`.
    """
    m = _EPOCH.match(line)
    if m:
        return epoch_to_ns(m.group(1))
    m = _ISO.match(line)
    if m:
        return iso_to_ns(m.group(1))
    return None


def iso_to_ns(text: str) -> int:
    """ISO 8601 to ns since epoch; a time without a zone is UTC; sub-microsecond digits are kept."""
    text = text.strip().replace(" ", "T", 1)
    frac_ns = 0
    m = re.match(r"^(.*T\d\d:\d\d:\d\d)\.(\d+)(.*)$", text)
    if m:
        text = m.group(1) + m.group(3)
        frac_ns = int((m.group(2) + "000000000")[:9])
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    stamp = dt.datetime.fromisoformat(text)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    return int(stamp.timestamp()) * 1_000_000_000 + frac_ns


def strip_port(instance: str | None) -> str | None:
    """`host:9100` -> `host`; `[::1]:9100` -> `::1`; a bare name is kept."""
    if not instance:
        return None
    if instance.startswith("["):
        return instance[1:].split("]", 1)[0]
    if instance.count(":") == 1:
        return instance.rsplit(":", 1)[0]
    return instance


def first(mapping: dict[str, str], keys: Iterable[str]) -> str | None:
    for k in keys:
        v = mapping.get(k)
        if v not in (None, ""):
            return v
    return None


def port_owner(host: str | None, device: str) -> str:
    """The name of the thing a port is on: the device, prefixed by its host when they differ
    (`node01/mlx5_0`, but `leaf1` for a switch whose device is the host)."""
    return f"{host}/{device}" if host and host != device else device


def normal_port(port: object) -> str:
    """Port names compare as text; `01` and `1` are the same port."""
    text = str(port).strip()
    return (text.lstrip("0") or "0") if text.isascii() and text.isdigit() else text
