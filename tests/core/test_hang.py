"""Hang/desync verdicts: the three real gloo scenarios, the project's sample, and synthetic cases."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit import schema
from tracekit.finding import texts
from tracekit.hang import find_hangs, fmt_ranks
from tracekit.parsers import flight_recorder as fr
from tracekit.results import dumps as encode
from tracekit.results import to_builtins
from tracekit.store import SourceSink

REPO = Path(__file__).resolve().parents[2]
FR_REAL = REPO / ".." / "shared" / "real_traces" / "flight_recorder" / "gloo_torch2.13_cpu"
SAMPLE_FR = REPO / "sample_traces" / "gloo_moe_8rank" / "fr"
ENCODINGS = ("pickle", "json", "pickle_pgconfig_rebuilt")


def parse_parts(files: list[Path], run_dir: Path) -> list[dict[str, pa.Table]]:
    """Parse each dump into its own tables (collectives, groups, ranks)."""
    out = []
    for i, f in enumerate(files):
        key = f"s{i}"
        sink = SourceSink(run_dir, key)
        fr.parse(f, sink)
        sink.close()
        out.append({n: pq.read_table(run_dir / "sources" / key / f"{n}.parquet")
                    for n in ("collectives", "groups", "ranks")})
    return out


def combine(parts: list[dict[str, pa.Table]]) -> dict[str, pa.Table]:
    return {n: pa.concat_tables([p[n] for p in parts], promote_options="permissive").unify_dictionaries()
            for n in ("collectives", "groups", "ranks")}


def hang_of(parts: list[dict[str, pa.Table]]):
    t = combine(parts)
    return find_hangs(t["collectives"], t["groups"], ranks=t["ranks"])


@pytest.fixture(scope="module")
def real() -> Path:
    if not FR_REAL.is_dir():
        pytest.skip(f"real Flight Recorder dumps not present at {FR_REAL}")
    return FR_REAL.resolve()


@pytest.fixture(scope="module")
def parsed(real, tmp_path_factory) -> dict[tuple[str, str], list[dict[str, pa.Table]]]:
    out = {}
    for scenario in ("healthy", "missing_rank", "type_mismatch"):
        for enc in ENCODINGS:
            files = sorted((real / scenario / enc).glob("rank_*"))
            out[scenario, enc] = parse_parts(files, tmp_path_factory.mktemp(f"{scenario}_{enc}"))
    return out


def _core(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The verdict without prose (pickle has call sites in its sentences, JSON has none)."""
    keys = ("group", "desc", "ranks", "last_seq", "first_divergent_seq", "missing_ranks", "mismatches",
            "status", "suspects")
    return [{k: g[k] for k in keys} for g in doc["groups"]]


# ------------------------------------------------------------------------------ real scenarios


@pytest.mark.parametrize("enc", ENCODINGS)
def test_real_healthy_has_no_findings(parsed, enc):
    res = hang_of(parsed["healthy", enc])
    assert res.findings == [] and not res.hung and res.suspects == []
    assert {g.group: g.status for g in res.groups} == dict.fromkeys("01234", "ok")
    assert res.last_seq["0"] == {0: 10, 1: 10, 2: 10, 3: 10}
    assert res.groups[1].ranks == [0, 1] and res.groups[3].ranks == [0, 2]  # membership rebuilt across dumps


@pytest.mark.parametrize("enc", ENCODINGS)
def test_real_missing_rank(parsed, enc):
    res = hang_of(parsed["missing_rank", enc])
    g0 = res.groups[0]
    assert (g0.group, g0.desc, g0.status) == ("0", "default_pg", "hang")
    assert g0.first_divergent_seq == 11 and g0.missing_ranks == [1] and g0.suspects == [1]
    assert g0.last_seq == {0: 11, 1: 10, 2: 11, 3: 11} and g0.mismatches == []
    assert g0.last_completed_seq == {0: 10, 1: 10, 2: 10, 3: 10}
    assert "ranks 0,2,3 reached all_reduce seq 11" in g0.verdict
    assert "rank 1 never issued it" in g0.verdict and "rank 1 is the one to look at" in g0.verdict
    assert [g.status for g in res.groups[1:]] == ["ok"] * 4
    assert res.suspects == [1] and res.findings[0].text.startswith("Start with rank 1")
    assert len(res.findings) == 2


@pytest.mark.parametrize("enc", ENCODINGS)
def test_real_type_mismatch_blames_the_minority(parsed, enc):
    res = hang_of(parsed["type_mismatch", enc])
    g0 = res.groups[0]
    assert g0.status == "mismatch" and g0.first_divergent_seq == 11 and g0.missing_ranks == []
    assert to_builtins(g0.mismatches) == [{"seq": 11, "field": "op", "majority": "all_reduce", "minority_ranks": [3],
                              "values": [{"value": "all_reduce", "ranks": [0, 1, 2]},
                                         {"value": "broadcast", "ranks": [3]}]}]
    assert g0.suspects == [3] and res.suspects == [3]  # the stock analyzer blames 0,1,2 here
    assert "rank 3 issued broadcast" in g0.verdict and "rank 3 is the one to look at" in g0.verdict
    assert [g.status for g in res.groups[1:]] == ["ok"] * 4


@pytest.mark.parametrize("scenario", ["healthy", "missing_rank", "type_mismatch"])
def test_real_pickle_and_json_agree(parsed, scenario):
    docs = [to_builtins(hang_of(parsed[scenario, enc])) for enc in ENCODINGS]
    assert _core(docs[0]) == _core(docs[1]) == _core(docs[2])
    assert docs[0]["last_seq"] == docs[1]["last_seq"]


def test_real_pickle_verdict_names_the_call_site(parsed):
    g0 = hang_of(parsed["type_mismatch", "pickle"]).groups[0]
    assert "(called from worker at /tmp/frgen/gen_gloo_fr.py:79)" in g0.verdict


def test_real_pickle_plus_json_of_the_same_run_are_deduplicated(parsed):
    both = parsed["missing_rank", "pickle"] + parsed["missing_rank", "json"]
    assert _core(to_builtins(hang_of(both))) == _core(to_builtins(hang_of(parsed["missing_rank", "json"])))


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_real_read_order_never_changes_the_verdict(parsed, data):
    for scenario in ("missing_rank", "type_mismatch"):
        parts = parsed[scenario, "json"]
        ref = to_builtins(hang_of(parts))
        order = data.draw(st.permutations(range(len(parts))))
        shuffled = [parts[i] for i in order]
        rows = data.draw(st.randoms(use_true_random=False))
        t = combine(shuffled)
        idx = list(range(t["collectives"].num_rows))
        rows.shuffle(idx)
        coll = t["collectives"].take(pa.array(idx))
        got = to_builtins(find_hangs(coll, t["groups"], ranks=t["ranks"]))
        assert got == ref


def test_json_document_shape(parsed):
    doc = json.loads(encode(hang_of(parsed["missing_rank", "json"]), sort_keys=True))
    assert set(doc) == {"groups", "findings", "last_seq", "suspects", "source", "notes", "locations", "messages"}
    g = doc["groups"][0]
    for key in ("group", "desc", "ranks", "last_seq", "first_divergent_seq", "missing_ranks", "mismatches",
                "verdict"):
        assert key in g
    assert doc["last_seq"]["0"] == {"0": 11, "1": 10, "2": 11, "3": 11}
    assert doc["source"] == "flight_recorder"


# ------------------------------------------------------------------------ the project's sample


@pytest.mark.parametrize("enc", ["pickle", "json"])
def test_sample_gloo_moe_has_no_hang(tmp_path, enc):
    files = sorted((SAMPLE_FR / enc).glob("rank_*"))
    truth_path = SAMPLE_FR.parent / "truth.json"
    if len(files) != 8 or not truth_path.is_file():
        pytest.skip("sample FR dumps not present")
    truth = json.loads(truth_path.read_text())
    res = hang_of(parse_parts(files, tmp_path))
    assert res.findings == [] and not res.hung
    layout = {g["pg_name"]: g for g in truth["layout"]["groups"]}
    per_rank = truth["expected_calls"]["0"]["all_steps"]
    expected_last = {"0": 2, "1": per_rank["all_reduce"]["count"], "2": per_rank["all_reduce"]["count"],
                     "3": per_rank["all_to_all"]["count"], "4": per_rank["all_to_all"]["count"]}
    for g in res.groups:
        assert g.ranks == layout[g.group]["ranks"] and g.desc == layout[g.group]["desc"]
        assert g.last_seq == dict.fromkeys(layout[g.group]["ranks"], expected_last[g.group])
        assert g.status == "ok"


# ------------------------------------------------------------------------------ synthetic cases


def table(rows: list[dict[str, Any]]) -> pa.Table:
    base = {"op": "all_reduce", "dtype": "Float", "in_bytes": 1024, "out_bytes": 1024, "state": "completed",
            "source": "flight_recorder", "seq_explicit": True, "is_p2p": False}
    full = []
    for i, r in enumerate(rows):
        row = {**base, "coll_id": i, "ts_ns": 1000 * r["seq"] + r["rank"], **r}
        row.setdefault("time_created_ns", row["ts_ns"])
        full.append(row)
    cols = {k: [r.get(k) for r in full] for k in {k for r in full for k in r}}
    cols["group"] = pa.array([str(g) for g in cols["group"]], pa.string())
    return schema.conform("collectives", cols)


def groups(*specs: tuple[str, list[int], bool]) -> pa.Table:
    return schema.conform("groups", {"group": [s[0] for s in specs], "desc": [f"g{s[0]}" for s in specs],
                                     "ranks": pa.array([s[1] for s in specs], pa.list_(pa.int32())),
                                     "ranks_complete": [s[2] for s in specs]})


def dumps(ranks: list[int]) -> pa.Table:
    """A ranks table saying each of `ranks` left a Flight Recorder dump."""
    return schema.conform("ranks", {"rank": pa.array(ranks, pa.int32()),
                                    "source_format": ["flight_recorder"] * len(ranks)})


def seqs(group: str, ranks: list[int], upto: int, **over: Any) -> list[dict[str, Any]]:
    return [{"rank": r, "group": group, "seq": s, **over} for r in ranks for s in range(1, upto + 1)]


def test_stuck_inside_a_collective_every_rank_arrived():
    rows = seqs("0", [0, 1, 2, 3], 4) + [{"rank": r, "group": "0", "seq": 5, "state": "started"} for r in range(4)]
    res = find_hangs(table(rows), groups(("0", [0, 1, 2, 3], True)))
    g = res.groups[0]
    assert g.status == "stuck" and g.first_divergent_seq is None and g.suspects == []
    assert "no desync" in g.verdict and texts(res.findings) == [g.verdict]


def test_dump_timing_is_not_a_hang():
    rows = seqs("0", [0, 1, 2], 5) + seqs("0", [3], 4)
    g = find_hangs(table(rows), groups(("0", [0, 1, 2, 3], True))).groups[0]
    assert g.status == "dump_skew" and g.missing_ranks == [3] and g.suspects == []
    assert "dump timing, not a hang" in g.verdict


def test_majority_missing_blames_the_ranks_that_ran_ahead():
    rows = [*seqs("0", [0, 1, 2, 3], 4), {"rank": 2, "group": "0", "seq": 5, "state": "scheduled"}]
    g = find_hangs(table(rows), groups(("0", [0, 1, 2, 3], True))).groups[0]
    assert g.status == "hang" and g.missing_ranks == [0, 1, 3] and g.suspects == [2]
    assert "only rank 2 reached" in g.verdict


def test_tie_has_no_majority_and_is_order_independent():
    rows = seqs("0", [0, 1, 2, 3], 2)
    rows += [{"rank": r, "group": "0", "seq": 3, "state": "scheduled", "op": "broadcast" if r in (1, 3) else
              "all_reduce"} for r in range(4)]
    a = find_hangs(table(rows), None)
    b = find_hangs(table(list(reversed(rows))), None)
    assert to_builtins(a) == to_builtins(b)
    g = a.groups[0]
    assert g.mismatches[0].majority == "all_reduce" and g.mismatches[0].minority_ranks == [1, 3]
    assert "no majority" in g.verdict


def test_dtype_and_size_mismatches():
    rows = seqs("7", [0, 1, 2], 1)
    rows += [{"rank": 0, "group": "7", "seq": 2, "dtype": "BFloat16", "state": "scheduled"},
             {"rank": 1, "group": "7", "seq": 2, "state": "scheduled"},
             {"rank": 2, "group": "7", "seq": 2, "state": "scheduled"},
             {"rank": 0, "group": "7", "seq": 3, "state": "scheduled", "in_bytes": 8, "out_bytes": 8},
             {"rank": 1, "group": "7", "seq": 3, "state": "scheduled"},
             {"rank": 2, "group": "7", "seq": 3, "state": "scheduled"}]
    g = find_hangs(table(rows), None).groups[0]
    assert [(m.seq, m.field, m.minority_ranks) for m in g.mismatches] == [(2, "dtype", [0]), (3, "size", [0])]
    assert g.first_divergent_seq == 2 and g.suspects == [0]
    assert "rank 0 used dtype BFloat16" in g.verdict and "Also mismatched at seq 3" in g.verdict


def test_uneven_all_to_all_sizes_are_not_a_mismatch():
    rows = [{"rank": r, "group": "0", "seq": 1, "op": "all_to_all", "in_bytes": 100 * (r + 1)} for r in range(4)]
    assert find_hangs(table(rows), None).groups[0].status == "ok"


def test_members_without_a_dump_are_not_judged():
    rows = seqs("0", [0, 1], 3)
    res = find_hangs(table(rows), groups(("0", [0, 1, 2, 3], True)))
    g = res.groups[0]
    assert g.status == "ok" and g.no_dump_ranks == [2, 3] and "No dump from ranks 2,3" in g.verdict


def test_member_with_a_dump_but_nothing_on_the_group():
    rows = seqs("0", [0, 1, 2, 3], 3)
    rows += [{"rank": r, "group": "1", "seq": 1, "ts_ns": 5000 + r, "state": "scheduled"} for r in (0, 1)]
    res = find_hangs(table(rows), groups(("0", [0, 1, 2, 3], True), ("1", [0, 1, 2], True)))
    g1 = res.groups[1]
    assert g1.last_seq == {0: 1, 1: 1, 2: 0} and g1.status == "hang"
    assert g1.first_divergent_seq == 1 and g1.missing_ranks == [2] and g1.suspects == [2]
    assert "nothing recorded on this group" in g1.verdict


def test_wrapped_buffer_member_is_not_blamed():
    rows = [{"rank": r, "group": "1", "seq": s, "ts_ns": 10 * s} for r in (0, 1) for s in (1, 2)]
    rows += [{"rank": 2, "group": "0", "seq": s, "ts_ns": 1000 + s} for s in (1, 2)]  # rank 2's buffer starts later
    res = find_hangs(table(rows), groups(("1", [0, 1, 2], True)))
    g1 = next(g for g in res.groups if g.group == "1")
    assert g1.status == "ok" and g1.missing_ranks == [] and "not checked" in g1.verdict
    assert g1.last_seq == {0: 2, 1: 2}


def test_p2p_pair():
    rows = [{"rank": 0, "group": "5", "seq": s, "op": "send", "is_p2p": True} for s in (1, 2, 3)]
    rows += [{"rank": 1, "group": "5", "seq": s, "op": "recv", "is_p2p": True} for s in (1, 2)]
    rows[2]["state"] = "scheduled"
    g = find_hangs(table(rows), groups(("5", [0, 1], True))).groups[0]
    assert g.status == "hang" and g.suspects == [1] and "rank 1 is the one to look at" in g.verdict
    assert g.last_p2p_seq == {0: 3, 1: 2}


def test_no_fr_rows_falls_back_with_a_caveat():
    extra = {"rank": 0, "group": "0", "seq": 4, "source": "kineto", "seq_explicit": False, "state": "scheduled"}
    rows = [*seqs("0", [0, 1], 3, source="kineto", seq_explicit=False), extra]
    res = find_hangs(table(rows), None)
    assert res.source == "call order within the traced window"
    assert res.findings[-1].text.startswith("Sequence numbers come")


def test_empty():
    res = find_hangs(schema.empty("collectives"), schema.empty("groups"))
    assert res.groups == [] and texts(res.findings) == ["No collectives with sequence numbers: nothing to check."]


def test_fmt_ranks():
    assert fmt_ranks([3, 0, 2]) == "0,2,3"
    assert fmt_ranks([0, 1, 2, 3, 5, 7, 8, 9]) == "0-3,5,7-9"
    assert fmt_ranks(range(0, 200, 2), limit=3).endswith("(100 ranks)")


# --------------------------------------------------------------------- property: blame the minority


@settings(max_examples=60, deadline=None)
@given(n=st.integers(3, 9), last=st.integers(1, 6), data=st.data())
def test_blame_is_the_minority_whatever_the_order(n, last, data):
    ranks = list(range(n))
    k = data.draw(st.integers(1, (n - 1) // 2))  # a strict minority
    odd = sorted(data.draw(st.permutations(ranks))[:k])
    kind = data.draw(st.sampled_from(["missing", "op", "dtype", "size"]))
    rows = seqs("g", ranks, last - 1)
    for r in ranks:
        if kind == "missing" and r in odd:
            continue
        row = {"rank": r, "group": "g", "seq": last, "state": "scheduled"}
        if r in odd and kind == "op":
            row["op"] = "broadcast"
        elif r in odd and kind == "dtype":
            row["dtype"] = "Half"
        elif r in odd and kind == "size":
            row["in_bytes"] = 4
        rows.append(row)
    rnd = random.Random(data.draw(st.integers(0, 2**32)))
    ref = None
    for _ in range(3):
        rnd.shuffle(rows)
        res = find_hangs(table(rows), groups(("g", ranks, True)), ranks=dumps(ranks))
        doc = to_builtins(res)
        ref = ref or doc
        assert doc == ref
        g = res.groups[0]
        assert g.first_divergent_seq == last and g.suspects == odd, (kind, odd)
        if kind == "missing":
            assert g.missing_ranks == odd
        else:
            assert g.mismatches[0].minority_ranks == odd and g.mismatches[0].field == kind


# ------------------------------------------------------------------ synthetic NCCL dumps, end to end


def _nccl_entry(rid: int, seq: int, state: str, *, pg: tuple[str, str] = ("0", "default_pg"),
                name: str = "nccl:all_reduce", t: int = 0) -> dict[str, Any]:
    t0 = 1_700_000_000_000_000_000 + t * 1_000_000
    started = t0 + 1000 if state in ("started", "completed") else None
    done = t0 + 5000 if state == "completed" else None
    return {"record_id": rid, "pg_id": 0, "process_group": pg, "collective_seq_id": seq, "p2p_seq_id": 0,
            "op_id": seq, "profiling_name": name, "time_created_ns": t0, "time_discovered_started_ns": started,
            "time_discovered_completed_ns": done, "duration_ms": 0.004 if done else None,
            "input_sizes": [[4096]], "input_dtypes": ["BFloat16"], "output_sizes": [[4096]],
            "output_dtypes": ["BFloat16"], "state": state, "retired": state == "completed",
            "timeout_ms": 600000, "is_p2p": False}


def test_nccl_timeout_dumps_end_to_end(tmp_path):
    import pickle

    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
           "1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}}
    files = []
    for rank in (0, 1, 2):  # rank 3's watchdog never fired: no dump
        entries = [_nccl_entry(i, i + 1, "completed", t=i) for i in range(4)]
        if rank != 2:  # rank 2 never issued seq 5
            entries.append(_nccl_entry(4, 5, "started", t=10))
        entries.append(_nccl_entry(5, 1, "completed", pg=("1", "tp"), t=1) if rank < 2 else None)
        dump = {"version": "2.6", "nccl_version": "2.21.5", "pg_config": cfg, "pg_status": {},
                "entries": [e for e in entries if e is not None]}
        path = tmp_path / f"nccl_trace_rank_{rank}"
        path.write_bytes(pickle.dumps(dump, protocol=4))
        files.append(path)
    res = hang_of(parse_parts(files, tmp_path / "run"))
    g0 = res.groups[0]
    assert g0.ranks_complete and g0.ranks == [0, 1, 2, 3] and g0.no_dump_ranks == [3]
    assert g0.status == "hang" and g0.first_divergent_seq == 5 and g0.missing_ranks == [2] and g0.suspects == [2]
    assert g0.last_seq == {0: 5, 1: 5, 2: 4} and g0.last_completed_seq == {0: 4, 1: 4, 2: 4}
    assert "No dump from rank 3: not checked." in g0.verdict
    assert res.groups[1].status == "ok" and res.findings[0].text.startswith("Start with rank 2")


def test_coalesced_ops_share_a_seq_and_do_not_mismatch():
    rows = []
    for r in range(4):
        for op_id, op in ((10, "all_gather"), (11, "all_gather"), (12, "other")):  # ..._coalesced + end marker
            rows.append({"rank": r, "group": "0", "seq": 7, "op": op, "op_id": op_id, "ts_ns": 7000 + op_id})
    rnd = random.Random(5)
    rnd.shuffle(rows)
    g = find_hangs(table(rows), None).groups[0]
    assert g.status == "ok" and g.mismatches == [] and g.last_seq == dict.fromkeys(range(4), 7)


def test_divergence_on_an_assumed_group_says_it_may_not_be_real():
    """Regression: on the HTA 2-of-128 Kineto sample (no process groups in the trace) `hang` named
    rank 1 for a dtype mismatch between calls only paired by their order on each rank."""
    rows = [{"rank": r, "group": "0", "seq": s, "source": "kineto", "seq_explicit": False,
             "dtype": "Long" if (r, s) == (0, 0) else "Byte"} for r in (0, 1) for s in range(3)]
    assumed = schema.conform("groups", {"group": ["0"], "desc": ["default_pg (assumed)"],
                                        "ranks": pa.array([[0, 1]], pa.list_(pa.int32())), "ranks_complete": [True]})
    g = find_hangs(table(rows), assumed).groups[0]
    assert g.status == "mismatch" and "may not be real" in g.verdict
    named = find_hangs(table(rows), groups(("0", [0, 1], True))).groups[0]
    assert named.status == "mismatch" and "may not be real" not in named.verdict
