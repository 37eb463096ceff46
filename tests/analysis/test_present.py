"""The presenter: rows and sentences from typed results, formatted once for the CLI and the report."""

from __future__ import annotations

import json

import polars as pl

from tracekit.analysis import analyze
from tracekit.present import fmt_delta, fmt_ms, printable, root_cause_rows, straggler_rows
from tracekit.replay.engine import Convergence, Fallback, Identity
from tracekit.results import dumps, from_builtins, to_builtins


def test_small_formatters():
    assert fmt_ms(1_234_567) == "1.235 ms"
    assert fmt_delta(110, 100) == " (+10.0%)" and fmt_delta(5, 0) == ""
    assert printable("a\x1bb") == "a\\x1bb"


def test_rows_follow_the_result_tables(synth_wide):
    tables, truth = synth_wide
    result = analyze(tables)
    roots = root_cause_rows(result, 3)
    causes = pl.from_arrow(result.root_causes)
    assert len(roots) == min(3, causes.height) and roots[0].root == str(causes.row(0, named=True)["root_rank"])
    assert " waited for rank " in roots[0].worst and roots[0].worst.split(" at ")[-1] != "-"
    strag = straggler_rows(result)
    assert strag[0].rank == str(truth["straggler"]["rank"]) and all(int(s.last) > 0 for s in strag)


def test_encoder_keeps_field_order_and_reads_back():
    fb = Fallback(group="g", seq=3, op="send", reason="members_end_apart", text="t", ranks=(1, 2))
    ident = Identity(max_step_error=0.5, instances_fallen_back=1, max_event_error_ns=2.0, fallbacks=(fb,))
    doc = json.loads(dumps(ident))
    assert list(doc) == ["max_step_error", "instances_fallen_back", "max_event_error_ns", "fallbacks", "comm_ns",
                         "exposed_ns"]
    assert list(doc["fallbacks"][0]) == ["group", "seq", "op", "reason", "ranks", "text"]
    assert from_builtins(doc, Identity) == ident
    conv = Convergence(rounds=2, residual_ns=1.0, tolerance_ns=3.0, converged=True, moves_ns=(5.0, 1.0))
    assert from_builtins({**to_builtins(conv), "residual_ns": 1}, Convergence) == conv
