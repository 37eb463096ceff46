"""`tracekit export --chrome`: the file re-reads through tracekit's own Kineto parser, is on the
aligned clock (the synthetic clock skew is known), links collectives and shows stalls."""

import gzip
import itertools
import json
import re
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from tracekit.cli import main
from tracekit.export import REPLAY_PID_BASE, STALL_CAT
from tracekit.ingest import ingest
from tracekit.parsers import kineto
from tracekit.store import Run, SourceSink
from tracekit.synth import make_run_tables, write_kineto
from tracekit.workflows import export as export_chrome

SKEW_NS = 3_000_000
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def synth_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    tables, truth = make_run_tables(hosts=2, gpus_per_host=4, pp=2, ep=2, steps=2, straggler_rank=5,
                                    straggler_step=1, clock_skew_ns=SKEW_NS, seed=4)
    write_kineto(tables, base / "traces")
    report = ingest([base / "traces"], base / "run")
    assert not report.failed
    return base / "run", truth


def _load(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _threads(doc):
    """tid -> (pid, thread name); tids are unique in the file."""
    out = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            assert e["tid"] not in out, "tids must be unique across processes"
            out[e["tid"]] = (e["pid"], e["args"]["name"])
    return out


def _misnested(doc):
    """X slices that overlap a slice on their thread without nesting in it (Perfetto drops them)."""
    per = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            t = round(float(e["ts"]) * 1000)
            per[(e["pid"], e["tid"])].append((t, t + round(float(e["dur"]) * 1000)))
    bad = []
    for spans in per.values():
        stack = []
        for s, e in sorted(spans, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1][1] <= s:
                stack.pop()
            if stack and e > stack[-1][1]:
                bad.append((stack[-1], (s, e)))
            stack.append((s, e))
    return bad


def _run_events(run_path, offsets):
    ev = pl.from_arrow(Run(run_path).events()).with_columns(pl.col(pl.Categorical).cast(pl.String))
    off = pl.DataFrame({"rank": list(offsets), "off": list(offsets.values())},
                       schema={"rank": pl.Int32, "off": pl.Int64})
    ev = ev.join(off, on="rank").with_columns((pl.col("ts_ns") + pl.col("off")).alias("ts_ns"))
    return Counter(ev.select("rank", "lane", "kind", "name", "ts_ns", "dur_ns").iter_rows())


def _offsets(run_path):
    from tracekit.analysis import prepare

    ranks = prepare(run_path, write=False)["ranks"]
    return dict(zip(ranks.column("rank").to_pylist(), ranks.column("clock_offset_ns").to_pylist(), strict=True))


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_round_trip_through_the_kineto_parser(synth_run, tmp_path, suffix):
    run_path, _ = synth_run
    out = tmp_path / f"trace{suffix}"
    summary = export_chrome(run_path, out)
    doc = _load(out)
    threads = _threads(doc)
    # tracekit's own parser reads the export back: every X slice of a traced lane is an event
    work = tmp_path / "reread"
    sink = SourceSink(work, "export")
    res = kineto.parse(out, sink, rank=0)
    sink.close()
    back = pl.read_parquet(work / "events" / "rank=0" / "export.parquet")
    assert res.stats.skipped["unknown_category"] == summary.stalls  # stall slices are not trace events
    assert res.stats.skipped["flow"] == 2 * summary.flows
    tid_of_lane = re.compile(r"(?:stream|thread)(\d+)$")
    rows = Counter()
    for lane, kind, name, ts, dur in back.select("lane", "kind", "name", "ts_ns", "dur_ns").iter_rows():
        pid, traced_lane = threads[int(tid_of_lane.search(lane).group(1))]
        traced_lane = re.sub(r" \(overlap( \d+)?\)$", "", traced_lane)
        rows[(pid, traced_lane, kind, name, ts, dur)] += 1
    want = _run_events(run_path, _offsets(run_path))
    assert sum(want.values()) == summary.slices > 1000
    assert rows == want


def test_clock_is_the_aligned_one(synth_run, tmp_path):
    """Exported times minus traced times are the injected skew (known from synth, not fitted here)."""
    run_path, truth = synth_run
    out = tmp_path / "t.json"
    export_chrome(run_path, out)
    doc = _load(out)
    base = doc["baseTimeNanoseconds"]
    threads = _threads(doc)
    raw = pl.from_arrow(Run(run_path).events()).with_columns(pl.col(pl.Categorical).cast(pl.String))
    first_raw = dict(raw.group_by("rank").agg(pl.col("ts_ns").min()).iter_rows())
    first_out = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["pid"] < REPLAY_PID_BASE and e["cat"] != STALL_CAT:
            t = base + round(float(e["ts"]) * 1000)
            first_out[e["pid"]] = min(first_out.get(e["pid"], t), t)
    assert set(first_out) == set(first_raw) == {p for p, _ in threads.values()}
    shifts = {r: first_out[r] - first_raw[r] for r in first_raw}
    truth_off = {int(r): v for r, v in truth["clock_offset_ns"].items()}
    # offsets are relative to a reference rank: compare differences between ranks
    ref = min(shifts)
    for r in shifts:
        assert abs((shifts[r] - shifts[ref]) - (truth_off[r] - truth_off[ref])) <= 50_000, r
    assert max(truth_off.values()) - min(truth_off.values()) > 10 * 50_000  # the skew was there to undo


def test_processes_threads_flows_and_stalls(synth_run, tmp_path):
    run_path, truth = synth_run
    out = tmp_path / "t.json"
    summary = export_chrome(run_path, out)
    doc = _load(out)
    ev = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {r: f"rank {r} (node{r // 4:03d})" for r in range(8)}
    threads = _threads(doc)
    assert _misnested(doc) == []
    # lanes of a rank: compute stream first, then communication streams, then CPU, then stalls
    for pid in procs:
        names = [n for _, (p, n) in sorted(threads.items()) if p == pid]
        assert names[0] == f"gpu{pid % 4}/stream7", names
        assert names[-1].startswith("stalls")
    slices = defaultdict(list)
    for e in ev:
        if e["ph"] == "X":
            slices[(e["pid"], e["tid"])].append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e))
    # every flow: one start and one finish, each inside a communication slice of the same instance
    ends = defaultdict(dict)
    for e in ev:
        if e["ph"] in "sf" and e["cat"] == "tracekit_collective":
            assert e["bp"] == "e"
            hit = [s for s in slices[(e["pid"], e["tid"])] if s[0] <= float(e["ts"]) <= s[1]]
            assert hit, e
            a = hit[-1][2]["args"]
            ends[e["id"]][e["ph"]] = (e["pid"], a["instance"], float(e["ts"]), a["op"])
    assert len(ends) == summary.flows > 0 and summary.flows_dropped == 0
    for pair in ends.values():
        assert set(pair) == {"s", "f"}
        assert pair["s"][1] == pair["f"][1] and pair["s"][0] != pair["f"][0]
        assert pair["s"][2] <= pair["f"][2]  # an arrow never points back in time (viewers drop those)
        if pair["f"][3] in ("send", "recv"):
            assert (pair["s"][3], pair["f"][3]) == ("send", "recv")  # point to point: sender to receiver
    assert {p["f"][3] for p in ends.values()} >= {"recv", "all_reduce", "all_to_all"}
    # stalls: the analysis's waits, drawn; the injected delay shows as waits for the straggler in its step
    from tracekit.analysis import analyze

    stall_ev = [e for e in ev if e["ph"] == "X" and e["cat"] == STALL_CAT]
    assert len(stall_ev) == summary.stalls
    longest = defaultdict(int)
    for e in stall_ev:
        assert threads[e["tid"]][1].startswith("stalls") and e["pid"] != e["args"]["waited_for"]
        assert round(float(e["dur"]) * 1000) == e["args"]["wait_ns"]
        longest[e["args"]["instance"]] = max(longest[e["args"]["instance"]], e["args"]["wait_ns"])
    inst = pl.from_arrow(analyze(run_path, write=False).instances).filter(pl.col("max_wait_ns") > 0)
    assert longest == dict(inst.select("instance", "max_wait_ns").iter_rows())
    s = truth["straggler"]
    on_it = [float(e["dur"]) * 1000 for e in stall_ev if e["args"]["waited_for"] == s["rank"]]
    in_step = [float(e["dur"]) * 1000 for e in stall_ev
               if e["args"]["waited_for"] == s["rank"] and e["args"]["step"] == s["step"]]
    assert max(in_step) >= 0.5 * s["delay_ns"]
    assert max(on_it) == max(in_step)


def test_stall_slices_do_not_overlap_on_a_thread(synth_run, tmp_path):
    run_path, _ = synth_run
    out = tmp_path / "t.json"
    export_chrome(run_path, out)
    per = defaultdict(list)
    for e in _load(out)["traceEvents"]:
        if e["ph"] == "X" and e["cat"] == STALL_CAT:
            per[e["tid"]].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    for spans in per.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in itertools.pairwise(spans))


def test_levels_partition_overlapping_intervals():
    from tracekit.export import _levels

    assert _levels([0, 1, 2, 5, 6], [4, 3, 6, 7, 8]) == [0, 1, 2, 0, 1]
    assert _levels([0, 3, 3], [3, 5, 4]) == [0, 0, 1]  # touching is not overlapping
    assert _levels([], []) == []


def test_options_leave_parts_out(synth_run, tmp_path):
    run_path, _ = synth_run
    out = tmp_path / "t.json"
    summary = export_chrome(run_path, out, flows=False, stalls=False)
    assert summary.flows == summary.stalls == 0
    phases = Counter(e["ph"] for e in _load(out)["traceEvents"])
    assert set(phases) == {"M", "X"}


def test_cli_export_and_errors(synth_run, tmp_path):
    run_path, _ = synth_run
    out = tmp_path / "cli.json.gz"
    result = CliRunner().invoke(main, ["export", str(run_path), "--chrome", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out}: 8 ranks, ")
    with gzip.open(out) as fh:
        assert fh.read(2) == b'{"'
    result = CliRunner().invoke(main, ["export", str(run_path), "--chrome", str(out), "--json"])
    assert json.loads(result.output)["ranks"] == 8
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["export", str(tmp_path / "empty"), "--chrome", str(out)])
    assert result.exit_code == 1
    assert "not a tracekit run directory" in result.output and "Traceback" not in result.output
    assert not list(tmp_path.glob("*.tmp"))


def test_names_are_escaped_json(tmp_path):
    """Trace strings are untrusted: quotes, backslashes and control characters stay valid JSON."""
    from tracekit.export import _quoted

    nasty = ['a"b', "c\\d", "e\nf\x01", "<script>", None]
    df = pl.DataFrame({"name": nasty}).select(_quoted("name"))
    assert [json.loads(s) for s in df.to_series()] == ['a"b', "c\\d", "e\nf\x01", "<script>", ""]


def test_replayed_timelines_are_extra_processes(synth_run, tmp_path):
    from tracekit.workflows import replay as replay_run

    run_path = tmp_path / "run"
    shutil.copytree(synth_run[0], run_path)
    result = replay_run(run_path, ["rail-optimized:gpus=4", "rail-optimized:gpus=4,nic_gbps=100"])
    out = tmp_path / "t.json"
    summary = export_chrome(run_path, out)  # the timelines stored by replay_run
    assert list(summary.replay) == result.topologies
    doc = _load(out)
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    for k, name in enumerate(result.topologies):
        tl = result.results[k].timeline
        assert summary.replay[name] == tl.num_rows
        pids = {p for p in procs if REPLAY_PID_BASE * (k + 1) <= p < REPLAY_PID_BASE * (k + 2)}
        assert {procs[p] for p in pids} == {f"replay {name}: rank {r}" for r in set(tl.column("rank").to_pylist())}
    assert _misnested(doc) == []
    replayed = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] >= REPLAY_PID_BASE]
    assert len(replayed) == sum(summary.replay.values())
    named = Counter(e["name"] == e["args"]["kind"] for e in replayed)
    assert named[False] > 0.9 * len(replayed)  # named after the traced event they replay
    # the same result passed directly gives the same file
    direct = tmp_path / "d.json"
    export_chrome(run_path, direct, replay=result)
    assert direct.read_bytes() == out.read_bytes()
    assert export_chrome(run_path, tmp_path / "n.json", include_replay=False).replay == {}


def test_lane_order_compute_comm_other_gpu_cpu_numeric():
    from tracekit.export import _lane_order

    ev = pl.DataFrame({"lane": ["gpu0/stream13", "gpu0/stream7", "gpu0/stream-1", "cpu/thread2", "cpu/thread10",
                                "gpu0/stream20", "x"],
                       "kind": ["comm", "compute", "sync", "cpu_op", "cpu_op", "comm", "annotation"]})
    assert _lane_order(ev) == ["gpu0/stream7", "gpu0/stream13", "gpu0/stream20", "gpu0/stream-1", "cpu/thread2",
                               "cpu/thread10", "x"]


def test_nesting_levels_keep_every_thread_properly_nested():
    from tracekit.export import nesting_levels

    # [0,10) holds [1,3) and [2,3); [5,12) overlaps [0,10) without nesting: level 1; [11,12)
    # starts after [0,10) ended, so level 0 takes it
    start = np.array([0, 1, 2, 5, 11, 20])
    end = np.array([10, 3, 3, 12, 12, 20])
    assert nesting_levels(start, end).tolist() == [0, 0, 0, 1, 0, 0]
    assert nesting_levels(np.array([3, 0]), np.array([4, 3])).tolist() == [0, 0]  # touching is fine
    assert nesting_levels(np.array([0, 1, 2]), np.array([2, 3, 4])).tolist() == [0, 1, 0]


def test_sample_overlaps_go_to_overlap_threads(tmp_path):
    """The bundled sample has cuda_sync slices that overlap kernels on the stream by a few ns:
    Perfetto dropped 2 of them until they got threads of their own."""
    ingest([REPO / "sample_traces" / "synth_moe_16rank"], tmp_path / "run")
    out = tmp_path / "t.json"
    summary = export_chrome(tmp_path / "run", out, flows=False, stalls=False)
    doc = _load(out)
    assert summary.overlapping > 0
    assert _misnested(doc) == []
    names = {n for _, n in _threads(doc).values()}
    assert any(n.endswith(" (overlap)") for n in names)
    n_slices = sum(1 for e in doc["traceEvents"] if e["ph"] == "X")
    assert n_slices == summary.slices == Run(tmp_path / "run").events().num_rows
