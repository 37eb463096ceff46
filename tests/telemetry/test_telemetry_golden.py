"""Ingest + rating outputs pinned to golden/ingest_golden.json, which was written by the
implementation before the speed rewrite (per-line kernels, per-sample arrays): the faster parser
and rating must give the same `counters` rows, the same `link_samples` windows, and the same
accounting (every line stored or skipped with a reason) on the real samples and on the
constructed pitfalls (wraps, resets, saturation, gaps, duplicates, malformed lines).
One deliberate change since: a millisecond stamp too large for int64 ns (99,999,999,999,999,999)
used to wrap into a bogus time; it is now skipped as `ts_out_of_range`.

Regenerate only on purpose: `python tests/telemetry/test_telemetry_golden.py --write`."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from pitfall_inputs import write_pitfalls
from telemetry_helpers import REAL

from tracekit.ingest import ingest
from tracekit.store import Run

GOLDEN = Path(__file__).parent / "golden" / "ingest_golden.json"
#: Real telemetry samples (relative to REAL) that some parser claims.
REAL_FILES = ("prometheus/node_exporter_infiniband.prom", "prometheus/query_range_matrix_example.json",
              "gnmi/gnmic_event_format_interface_counters.json", "gnmi/gnmic_json_format_sros_port_stats.jsonl",
              "gnmi/gnmic_json_format_sros_port_stats.pretty.txt",
              "infiniband/perfquery_x_hca_0x7cfe9003003b4bde.txt",
              "infiniband/perfquery_x_switch_0x7cfe9003009ce5b0.txt", "infiniband/ufm_telemetry_tfs_small.json")


def _plain(v: object) -> object:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else v
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def outcome(path: Path, work: Path) -> dict:
    """Everything an ingest of one file makes of it, as plain JSON values."""
    report = ingest([path], work / "run", jobs=1)
    (src,) = report.sources
    assert src.error is None, src.error
    assert src.read == src.stored + sum(src.skipped.values()), src.to_dict()
    run = Run(work / "run")
    doc = run.read_json("telemetry") or {}
    tables = {}
    for name in ("counters", "link_samples"):
        t = run.table(name)
        tables[name] = {"columns": t.column_names,
                        "rows": [[_plain(r[c]) for c in t.column_names] for r in t.to_pylist()]}
    return {"read": src.read, "stored": src.stored, "skipped": dict(sorted(src.skipped.items())),
            "warnings": src.warnings, "ts": [src.ts_min_ns, src.ts_max_ns], "rates": doc.get("stats"),
            "links": doc.get("links"), **tables}


def _inputs(tmp: Path) -> dict[str, Path]:
    made = {f"made/{p.name}": p for p in write_pitfalls(tmp / "made")}
    real = {f"real/{name}": REAL / name for name in REAL_FILES if (REAL / name).is_file()}
    return {**made, **real}


def _cases() -> list[str]:
    return sorted(json.loads(GOLDEN.read_text())) if GOLDEN.is_file() else []


@pytest.mark.parametrize("name", _cases())
def test_ingest_matches_the_golden_outputs(name, tmp_path):
    if name.startswith("real/") and not (REAL / name[5:]).is_file():
        pytest.skip(f"real telemetry sample {name[5:]} not present")
    path = _inputs(tmp_path)[name]
    want = json.loads(GOLDEN.read_text())[name]
    got = json.loads(json.dumps(outcome(path, tmp_path / "w")))
    for key in want:
        assert got[key] == want[key], f"{name}: {key} differs"



@pytest.mark.parametrize("block", [97, 4096])
def test_the_outputs_do_not_depend_on_the_block_size(block, tmp_path, monkeypatch):
    """The parser tokenizes a few MiB at a time: cut into blocks of a few lines (a long line
    makes its block grow), the pitfalls give the golden outputs all the same."""
    from tracekit.parsers.telemetry import prometheus

    monkeypatch.setattr(prometheus, "BLOCK_BYTES", block)
    golden = json.loads(GOLDEN.read_text())
    for name, path in _inputs(tmp_path).items():
        if name.startswith("made/"):
            got = json.loads(json.dumps(outcome(path, tmp_path / f"w-{path.name}")))
            for key in golden[name]:
                assert got[key] == golden[name][key], f"{name}: {key} differs with {block}-byte blocks"

def test_golden_covers_every_pitfall():
    golden = json.loads(GOLDEN.read_text())
    made = golden["made/pitfalls.prom"]
    assert set(made["rates"]["flagged"]) >= {"wrapped", "reset", "wrap_ambiguous", "gap", "saturated"}
    assert set(made["skipped"]) >= {"malformed_line", "bad_value", "bad_timestamp", "nan_value", "unused_metric",
                                    "legacy_duplicate", "subset_of_another_counter", "malformed_labels",
                                    "ts_out_of_range"}
    assert made["rates"]["skipped"]["duplicate"] == 1
    assert all(golden[n]["read"] == golden[n]["stored"] + sum(golden[n]["skipped"].values()) for n in golden)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        found = _inputs(Path(d))
        GOLDEN.parent.mkdir(exist_ok=True)
        doc = {n: outcome(p, Path(d) / f"w{i}") for i, (n, p) in enumerate(sorted(found.items()))}
        GOLDEN.write_text(json.dumps(doc, indent=0, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN} ({len(doc)} inputs)")
