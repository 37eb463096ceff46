"""Make a real 8-rank CPU (gloo) MoE training run with per-rank Kineto traces.

Usage::

    python sample_traces/make_gloo_moe.py --out sample_traces/gloo_moe_8rank

Layout (world size 8, all processes on localhost, two *pretend* hosts):

* host  = f"node{rank // 4}"  -> ranks 0-3 on node0, ranks 4-7 on node1
* stage = rank // 4           -> pipeline parallel (PP=2); p2p pairs 0<->4, 1<->5, 2<->6, 3<->7
  (one 2-rank PG per pair, desc "pp_pair{i}"); stage 0 ``dist.send``s activations to rank+4,
  stage 1 sends the activation gradient back in backward.
* dp    = rank % 4            -> data parallel (DP=4) inside a stage; dense grads are flattened into
  one bucket and ``all_reduce``d over PG "dp_stage{s}".
* ep    = rank % 4            -> expert parallel (EP=4) inside a stage, one expert per rank, PG
  "ep_stage{s}" (same ranks as dp_stage{s} but a distinct group). Each MoE layer does, in forward,
  a split-count exchange (``all_to_all_single`` of int64 counts), an uneven token dispatch and the
  matching combine (``all_to_all_single`` with input/output split sizes); backward runs the two
  transposed token all_to_alls again (combine-backward, then dispatch-backward).

Injected facts (all recorded in ``truth.json``, computed from the run itself):

(a) straggler: rank 5 sleeps 80 ms at the start of profiler step 2 (before its forward), so every
    collective / p2p it joins in that step starts late on its peers;
(b) skewed routing: top-1 router with a gate bias so that expert 0 of each stage (rank 0 and rank 4)
    receives >= 50 % of the tokens (asserted);
(c) EP imbalance follows from (b): the hot expert ranks compute on more rows, so the combine
    all_to_all of the other EP ranks waits on them.

Steps 0..4 run; step 0 is profiler warm-up, steps 1-4 are recorded (``ProfilerStep#1..#4``).
Outputs in ``--out``: ``rank{r}.node{h}.pt.trace.json.gz`` (one Chrome trace per rank),
``truth.json``, and (unless ``--no-fr``) gloo Flight Recorder dumps in ``fr/pickle/rank_{r}`` and
``fr/json/rank_{r}.json``.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import pickle
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 8
RANKS_PER_HOST = 4
STAGES = 2
EP = 4  # == DP == ranks per stage
HIDDEN = 32
FFN = 64
TOKENS = 24  # tokens per rank per step
STEPS = 5  # step 0 = profiler warm-up, 1..4 active
PROFILED_STEPS = [1, 2, 3, 4]
STRAGGLER = {"rank": 5, "step": 2, "sleep_ms": 80}
GATE_BIAS = [1.2, 0.3, 0.0, -0.3]  # top-1 router bias: expert 0 is hot
GATE_STD = 0.2  # router weight init std; router sees layer-normed input
SEED = 1234
LR = 0.05

DTYPE_NAMES = {torch.float32: "Float", torch.int64: "Long"}


def host_of(rank: int) -> str:
    """Pretend host name of a rank."""
    return f"node{rank // RANKS_PER_HOST}"


class CallLog:
    """Records every communication call this rank makes (ground truth for truth.json)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.step = -1
        self.phase = "setup"
        self.calls: list[dict[str, Any]] = []
        self.routing: list[dict[str, Any]] = []

    def add(self, **kw: Any) -> None:
        """Append one call record."""
        kw.update(step=self.step, phase=self.phase, seq=len(self.calls))
        self.calls.append(kw)


LOG: CallLog | None = None
GROUPS: dict[str, dict[str, Any]] = {}  # desc -> {"pg": ProcessGroup, "ranks": [...]}


def _log() -> CallLog:
    assert LOG is not None
    return LOG


def _desc_of(group: dist.ProcessGroup | None) -> str:
    if group is None:
        return "default_pg"
    for desc, g in GROUPS.items():
        if g["pg"] is group:
            return desc
    return "?"


def all_to_all_rows(
    out: torch.Tensor,
    inp: torch.Tensor,
    out_splits: list[int] | None,
    in_splits: list[int] | None,
    group: dist.ProcessGroup,
    kind: str,
) -> None:
    """``all_to_all_single`` with logging; splits are in rows of dim 0."""
    row = int(torch.Size(inp.shape[1:]).numel())
    n = dist.get_world_size(group)
    ins = in_splits if in_splits is not None else [inp.shape[0] // n] * n
    outs = out_splits if out_splits is not None else [out.shape[0] // n] * n
    esz = inp.element_size()
    _log().add(
        op="all_to_all",
        api="all_to_all_single",
        kind=kind,
        group=_desc_of(group),
        dtype=DTYPE_NAMES[inp.dtype],
        elem_size=esz,
        row_elems=row,
        in_shape=list(inp.shape),
        out_shape=list(out.shape),
        in_nelems=inp.numel(),
        out_nelems=out.numel(),
        in_bytes=inp.numel() * esz,
        out_bytes=out.numel() * esz,
        input_split_sizes=ins,
        output_split_sizes=outs,
        in_split_bytes=[s * row * esz for s in ins],
        out_split_bytes=[s * row * esz for s in outs],
        explicit_splits=in_splits is not None,
    )
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)


def all_reduce_logged(t: torch.Tensor, group: dist.ProcessGroup, kind: str) -> None:
    """SUM all_reduce with logging."""
    _log().add(
        op="all_reduce",
        api="all_reduce",
        kind=kind,
        group=_desc_of(group),
        dtype=DTYPE_NAMES[t.dtype],
        elem_size=t.element_size(),
        in_shape=list(t.shape),
        in_nelems=t.numel(),
        out_nelems=t.numel(),
        in_bytes=t.numel() * t.element_size(),
        out_bytes=t.numel() * t.element_size(),
    )
    dist.all_reduce(t, group=group)


def send_logged(t: torch.Tensor, dst: int, group: dist.ProcessGroup, kind: str) -> None:
    """dist.send (global dst rank) with logging."""
    _log().add(
        op="send",
        api="send",
        kind=kind,
        group=_desc_of(group),
        peer=dst,
        dtype=DTYPE_NAMES[t.dtype],
        elem_size=t.element_size(),
        in_shape=list(t.shape),
        in_nelems=t.numel(),
        in_bytes=t.numel() * t.element_size(),
    )
    dist.send(t.contiguous(), dst=dst, group=group)


def recv_logged(t: torch.Tensor, src: int, group: dist.ProcessGroup, kind: str) -> None:
    """dist.recv (global src rank) with logging."""
    _log().add(
        op="recv",
        api="recv",
        kind=kind,
        group=_desc_of(group),
        peer=src,
        dtype=DTYPE_NAMES[t.dtype],
        elem_size=t.element_size(),
        out_shape=list(t.shape),
        out_nelems=t.numel(),
        out_bytes=t.numel() * t.element_size(),
    )
    dist.recv(t, src=src, group=group)


def barrier_logged(kind: str) -> None:
    """Default-PG barrier with logging (gloo FR records these as gloo:barrier)."""
    _log().add(op="barrier", api="barrier", kind=kind, group="default_pg")
    dist.barrier()


class AllToAll(torch.autograd.Function):
    """Differentiable uneven all_to_all over rows; backward is the transposed exchange."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        in_splits: list[int],
        out_splits: list[int],
        group: dist.ProcessGroup,
        kind: str,
    ) -> torch.Tensor:
        ctx.in_splits, ctx.out_splits, ctx.group, ctx.kind = in_splits, out_splits, group, kind
        out = x.new_empty((sum(out_splits), x.shape[1]))
        all_to_all_rows(out, x.contiguous(), out_splits, in_splits, group, kind)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        gin = g.new_empty((sum(ctx.in_splits), g.shape[1]))
        all_to_all_rows(gin, g.contiguous(), ctx.in_splits, ctx.out_splits, ctx.group, ctx.kind + "_bwd")
        return gin, None, None, None, None


class MoE(nn.Module):
    """Top-1 MoE layer; this rank hosts expert ``ep_rank`` of the EP group."""

    def __init__(self, ep_rank: int, group: dist.ProcessGroup, ep_ranks: list[int]) -> None:
        super().__init__()
        self.gate = nn.Linear(HIDDEN, EP, bias=False)  # dense (replicated, DP-reduced)
        nn.init.normal_(self.gate.weight, std=GATE_STD)
        self.register_buffer("gate_bias", torch.tensor(GATE_BIAS))
        torch.manual_seed(SEED + 100 + ep_rank)  # expert weights differ per expert
        self.expert = nn.Sequential(nn.Linear(HIDDEN, FFN), nn.GELU(), nn.Linear(FFN, HIDDEN))
        self.group, self.ep_ranks = group, ep_ranks

    def dense_parameters(self) -> list[nn.Parameter]:
        """Parameters replicated across DP (router)."""
        return list(self.gate.parameters())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Route, dispatch, run the local expert, combine."""
        h = nn.functional.layer_norm(x, (HIDDEN,))
        probs = torch.softmax(self.gate(h) + self.gate_bias, dim=-1)
        gate_p, expert_idx = probs.max(dim=-1)
        order = torch.argsort(expert_idx, stable=True)
        in_counts = torch.bincount(expert_idx, minlength=EP).to(torch.int64)
        out_counts = torch.empty_like(in_counts)
        with torch.profiler.record_function("moe_count_exchange"):
            all_to_all_rows(out_counts, in_counts, None, None, self.group, "count_exchange")
        in_splits, out_splits = in_counts.tolist(), out_counts.tolist()
        _log().routing.append({"step": _log().step, "in_counts": in_splits, "out_counts": out_splits})
        with torch.profiler.record_function("moe_dispatch"):
            recv = AllToAll.apply(x[order], in_splits, out_splits, self.group, "dispatch")
        with torch.profiler.record_function("moe_expert"):
            y = self.expert(recv)
        with torch.profiler.record_function("moe_combine"):
            back = AllToAll.apply(y, out_splits, in_splits, self.group, "combine")
        out = torch.empty_like(back)
        out = out.index_copy(0, order, back)
        return x + out * gate_p.unsqueeze(-1)


class Stage(nn.Module):
    """Pipeline stage: dense in/out projections around one MoE layer."""

    def __init__(self, stage: int, ep_rank: int, group: dist.ProcessGroup, ep_ranks: list[int]) -> None:
        super().__init__()
        torch.manual_seed(SEED + stage)  # dense weights identical across DP replicas
        self.pre = nn.Linear(HIDDEN, HIDDEN)
        self.moe = MoE(ep_rank, group, ep_ranks)
        torch.manual_seed(SEED + 10 + stage)
        self.post = nn.Linear(HIDDEN, HIDDEN)

    def dense_parameters(self) -> list[nn.Parameter]:
        """DP-replicated parameters (everything except the expert)."""
        return [*self.pre.parameters(), *self.moe.dense_parameters(), *self.post.parameters()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Stage forward."""
        return self.post(self.moe(torch.relu(self.pre(x))))


def free_port() -> int:
    """Pick a free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_groups() -> None:
    """Create all sub-groups (same order on every rank)."""
    for s in range(STAGES):
        ranks = list(range(s * EP, (s + 1) * EP))
        GROUPS[f"dp_stage{s}"] = {"ranks": ranks, "dim": "dp", "pg": dist.new_group(ranks, group_desc=f"dp_stage{s}")}
    for s in range(STAGES):
        ranks = list(range(s * EP, (s + 1) * EP))
        GROUPS[f"ep_stage{s}"] = {"ranks": ranks, "dim": "ep", "pg": dist.new_group(ranks, group_desc=f"ep_stage{s}")}
    for i in range(EP):
        ranks = [i, i + EP]
        GROUPS[f"pp_pair{i}"] = {"ranks": ranks, "dim": "pp", "pg": dist.new_group(ranks, group_desc=f"pp_pair{i}")}


def train_step(rank: int, model: Stage, opt: torch.optim.Optimizer, step: int) -> None:
    """One GPipe step with a single micro-batch."""
    log = _log()
    stage, dp = rank // EP, rank % EP
    pp = GROUPS[f"pp_pair{dp}"]["pg"]
    dpg = GROUPS[f"dp_stage{stage}"]["pg"]
    if rank == STRAGGLER["rank"] and step == STRAGGLER["step"]:
        with torch.profiler.record_function("injected_straggler_sleep"):
            time.sleep(STRAGGLER["sleep_ms"] / 1000)
    opt.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(SEED * 1000 + step * 10 + dp)
    log.phase = "fwd"
    if stage == 0:
        x = torch.randn(TOKENS, HIDDEN, generator=g)
        act = model(x)
        with torch.profiler.record_function("pp_send_activation"):
            send_logged(act.detach(), rank + EP, pp, "pp_fwd_activation")
        log.phase = "bwd"
        grad = torch.empty_like(act)
        with torch.profiler.record_function("pp_recv_grad"):
            recv_logged(grad, rank + EP, pp, "pp_bwd_grad")
        act.backward(grad)
    else:
        act_in = torch.empty(TOKENS, HIDDEN)
        with torch.profiler.record_function("pp_recv_activation"):
            recv_logged(act_in, rank - EP, pp, "pp_fwd_activation")
        act_in.requires_grad_(True)
        target = torch.randn(TOKENS, HIDDEN, generator=g)
        loss = nn.functional.mse_loss(model(act_in), target)
        log.phase = "bwd"
        loss.backward()
        assert act_in.grad is not None
        with torch.profiler.record_function("pp_send_grad"):
            send_logged(act_in.grad, rank - EP, pp, "pp_bwd_grad")
    log.phase = "dp_sync"
    params = model.dense_parameters()
    flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
    with torch.profiler.record_function("dp_grad_allreduce"):
        all_reduce_logged(flat, dpg, "dp_grad_bucket")
    flat /= EP
    off = 0
    for p in params:
        assert p.grad is not None
        n = p.grad.numel()
        p.grad.copy_(flat[off : off + n].view_as(p.grad))
        off += n
    opt.step()


def worker(rank: int, out: str, port: int, fr: bool) -> None:
    """Per-rank entry point."""
    global LOG
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    if fr:
        os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    LOG = CallLog(rank)
    make_groups()
    stage, dp = rank // EP, rank % EP
    ep_desc = f"ep_stage{stage}"
    model = Stage(stage, dp, GROUPS[ep_desc]["pg"], GROUPS[ep_desc]["ranks"])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    outdir = Path(out)
    host = host_of(rank)
    trace_path = outdir / f"rank{rank}.{host}.pt.trace.json.gz"

    def on_ready(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(trace_path))

    barrier_logged("before_profiling")
    sched = torch.profiler.schedule(wait=0, warmup=1, active=len(PROFILED_STEPS), repeat=1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched, on_trace_ready=on_ready, record_shapes=True
    ) as prof:
        for step in range(STEPS):
            LOG.step = step
            if step == PROFILED_STEPS[0]:
                prof.add_metadata("hostname", host)
                prof.add_metadata_json(
                    "tracekit_layout",
                    json.dumps({"rank": rank, "host": host, "stage": stage, "dp_rank": dp, "ep_rank": dp}),
                )
            train_step(rank, model, opt, step)
            prof.step()
    LOG.step, LOG.phase = -1, "teardown"
    barrier_logged("after_training")
    pg_names = {
        d: dist.distributed_c10d._get_process_group_name(g["pg"]) for d, g in GROUPS.items() if rank in g["ranks"]
    }
    part = {"rank": rank, "calls": LOG.calls, "routing": LOG.routing, "pg_names": pg_names}
    (outdir / f"_part_rank{rank}.json").write_text(json.dumps(part))
    if fr:
        c10d = torch._C._distributed_c10d
        (outdir / "fr" / "pickle").mkdir(parents=True, exist_ok=True)
        (outdir / "fr" / "json").mkdir(parents=True, exist_ok=True)
        (outdir / "fr" / "pickle" / f"rank_{rank}").write_bytes(c10d._dump_fr_trace(True, False, False))
        (outdir / "fr" / "json" / f"rank_{rank}.json").write_bytes(c10d._dump_fr_trace_json(True, False))
    dist.barrier()  # after the dump: not logged, not in the FR files
    dist.destroy_process_group()


C10D_OPS = {
    "c10d::alltoall_base_": "all_to_all",
    "c10d::allreduce_": "all_reduce",
    "c10d::send": "send",
    "c10d::recv_": "recv",
    "c10d::barrier": "barrier",
}


def check_trace(path: Path, rank: int, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Re-read one exported trace and check its c10d ops against what the rank logged."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    evs = doc["traceEvents"]
    steps = sorted((e for e in evs if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    ops = sorted((e for e in evs if e.get("name") in C10D_OPS), key=lambda e: e["ts"])
    for st in steps:
        n = int(st["name"].split("#")[1])
        got = [e for e in ops if st["ts"] <= e["ts"] < st["ts"] + st["dur"]]
        exp = [c for c in calls if c["step"] == n]
        assert [C10D_OPS[e["name"]] for e in got] == [c["op"] for c in exp], (rank, n)
        for e, c in zip(got, exp, strict=True):
            if c["op"] == "all_to_all" and c["explicit_splits"]:
                ci = e["args"]["Concrete Inputs"]  # [out, in, pg, out_splits, in_splits, async, timeout]
                assert json.loads(ci[3]) == c["output_split_sizes"], (rank, n)
                assert json.loads(ci[4]) == c["input_split_sizes"], (rank, n)
    assert doc.get("hostname") == host_of(rank)
    gloo = {}
    for e in evs:
        if str(e.get("name", "")).startswith("gloo:"):
            gloo[e["name"]] = gloo.get(e["name"], 0) + 1
    return {
        "ok": True,
        "profiler_steps": [e["name"] for e in steps],
        "c10d_ops": {k: sum(e["name"] == k for e in ops) for k in C10D_OPS},
        "gloo_annotations": gloo,
        "record_param_comms": sum(e.get("name") == "record_param_comms" for e in evs),
    }


def check_fr(path: Path, rank: int, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Re-read one gloo FR pickle and check its entries against the logged collectives."""
    with path.open("rb") as f:
        dump = pickle.load(f)  # our own file, written a moment ago
    ents = dump.get("entries", [])
    exp = [c for c in calls if c["op"] in ("all_reduce", "all_to_all", "barrier")]
    assert [e["profiling_name"] for e in ents] == [f"gloo:{c['op']}" for c in exp], rank
    assert [e["process_group"][1] for e in ents] == [c["group"] for c in exp], rank
    return {
        "ok": True,
        "entries": len(ents),
        "version": dump.get("version"),
        "pg_config_as_dumped": dump.get("pg_config"),
        "entry_steps": [c["step"] for c in exp],
        "entry_kinds": [c["kind"] for c in exp],
        "p2p_entries": sum(bool(e.get("is_p2p")) for e in ents),
    }


def build_truth(outdir: Path, fr: bool) -> dict[str, Any]:
    """Merge per-rank call logs into truth.json content."""
    parts = {}
    for r in range(WORLD):
        p = outdir / f"_part_rank{r}.json"
        parts[r] = json.loads(p.read_text())
        p.unlink()
    groups = []
    for s in range(STAGES):
        for dim in ("dp", "ep"):
            desc = f"{dim}_stage{s}"
            ranks = list(range(s * EP, (s + 1) * EP))
            groups.append({"desc": desc, "dim": dim, "ranks": ranks, "pg_name": parts[ranks[0]]["pg_names"][desc]})
    for i in range(EP):
        desc = f"pp_pair{i}"
        groups.append({"desc": desc, "dim": "pp", "ranks": [i, i + EP], "pg_name": parts[i]["pg_names"][desc]})
    groups.insert(0, {"desc": "default_pg", "dim": "world", "ranks": list(range(WORLD)), "pg_name": "0"})
    ranks_info = [
        {
            "rank": r,
            "host": host_of(r),
            "stage": r // EP,
            "dp_rank": r % EP,
            "ep_rank": r % EP,
            "expert_id": r % EP,
            "pp_peer": (r + EP) % WORLD,
            "trace_file": f"rank{r}.{host_of(r)}.pt.trace.json.gz",
        }
        for r in range(WORLD)
    ]

    # EP all_to_all matrices: one entry per (step, stage, call index within the step)
    a2a: list[dict[str, Any]] = []
    for step in range(STEPS):
        for s in range(STAGES):
            members = list(range(s * EP, (s + 1) * EP))
            per_rank = {
                r: [c for c in parts[r]["calls"] if c["step"] == step and c["op"] == "all_to_all"] for r in members
            }
            n_calls = {len(v) for v in per_rank.values()}
            assert len(n_calls) == 1, n_calls
            for i in range(n_calls.pop()):
                calls = {r: per_rank[r][i] for r in members}
                kinds = {c["kind"] for c in calls.values()}
                assert len(kinds) == 1, kinds
                c0 = calls[members[0]]
                mat_rows = [calls[r]["input_split_sizes"] for r in members]
                mat_bytes = [calls[r]["in_split_bytes"] for r in members]
                # consistency: what src sends == what dst expects
                for a, ra in enumerate(members):
                    for b, rb in enumerate(members):
                        assert calls[ra]["input_split_sizes"][b] == calls[rb]["output_split_sizes"][a]
                a2a.append(
                    {
                        "step": step,
                        "profiled": step in PROFILED_STEPS,
                        "stage": s,
                        "group": f"ep_stage{s}",
                        "ranks": members,
                        "call_index_in_step": i,
                        "kind": c0["kind"],
                        "phase": c0["phase"],
                        "dtype": c0["dtype"],
                        "elem_size": c0["elem_size"],
                        "row_elems": c0["row_elems"],
                        "explicit_splits": c0["explicit_splits"],
                        "split_rows": mat_rows,
                        "split_bytes": mat_bytes,
                        "total_bytes": sum(map(sum, mat_bytes)),
                        "per_rank": {
                            str(r): {
                                k: calls[r][k]
                                for k in (
                                    "input_split_sizes",
                                    "output_split_sizes",
                                    "in_shape",
                                    "out_shape",
                                    "in_nelems",
                                    "out_nelems",
                                    "in_bytes",
                                    "out_bytes",
                                )
                            }
                            for r in members
                        },
                    }
                )

    hot: list[dict[str, Any]] = []
    for step in range(STEPS):
        for s in range(STAGES):
            members = list(range(s * EP, (s + 1) * EP))
            recv = [sum(x["out_counts"]) for r in members for x in parts[r]["routing"] if x["step"] == step]
            total = sum(recv)
            share = [round(v / total, 4) for v in recv]
            top = max(range(EP), key=lambda e: recv[e])
            assert top == 0 and share[0] >= 0.5, (step, s, share)
            hot.append(
                {
                    "step": step,
                    "stage": s,
                    "hot_expert": top,
                    "hot_rank": members[top],
                    "hot_share": share[top],
                    "tokens_per_expert": recv,
                    "share_per_expert": share,
                    "tokens_total": total,
                }
            )

    # expected communication calls per rank (profiled window and whole run)
    def summarize(calls: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in calls:
            d = out.setdefault(
                c["op"], {"count": 0, "in_nelems": 0, "in_bytes": 0, "out_nelems": 0, "out_bytes": 0, "by_kind": {}}
            )
            d["count"] += 1
            for k in ("in_nelems", "in_bytes", "out_nelems", "out_bytes"):
                d[k] += c.get(k, 0)
            d["by_kind"][c["kind"]] = d["by_kind"].get(c["kind"], 0) + 1
        return out

    expected = {}
    for r in range(WORLD):
        calls = parts[r]["calls"]
        prof_calls = [c for c in calls if c["step"] in PROFILED_STEPS]
        expected[str(r)] = {
            "profiled_steps": summarize(prof_calls),
            "all_steps": summarize([c for c in calls if c["step"] >= 0]),
            "outside_steps": summarize([c for c in calls if c["step"] < 0]),
            "per_step_sequence": {
                str(s): [
                    {
                        k: c.get(k)
                        for k in (
                            "op",
                            "kind",
                            "phase",
                            "group",
                            "peer",
                            "dtype",
                            "in_nelems",
                            "out_nelems",
                            "in_bytes",
                            "out_bytes",
                            "input_split_sizes",
                            "output_split_sizes",
                        )
                        if c.get(k) is not None
                    }
                    for c in calls
                    if c["step"] == s
                ]
                for s in range(STEPS)
            },
        }

    checks: dict[str, Any] = {"traces": {}, "flight_recorder": {}}
    for r in range(WORLD):
        calls = parts[r]["calls"]
        checks["traces"][str(r)] = check_trace(outdir / ranks_info[r]["trace_file"], r, calls)
        if fr:
            checks["flight_recorder"][str(r)] = check_fr(outdir / "fr" / "pickle" / f"rank_{r}", r, calls)

    return {
        "generator": "sample_traces/make_gloo_moe.py",
        "torch_version": torch.__version__,
        "backend": "gloo",
        "world_size": WORLD,
        "model": {
            "hidden": HIDDEN,
            "ffn": FFN,
            "tokens_per_rank_per_step": TOKENS,
            "moe_layers_per_stage": 1,
            "top_k": 1,
            "gate_bias": GATE_BIAS,
            "gate_std": GATE_STD,
            "microbatches_per_step": 1,
            "dtype": "float32",
        },
        "steps_run": STEPS,
        "profiled_steps": PROFILED_STEPS,
        "profiler_step_labels": {str(s): f"ProfilerStep#{s}" for s in PROFILED_STEPS},
        "layout": {
            "hosts": {
                f"node{h}": list(range(h * RANKS_PER_HOST, (h + 1) * RANKS_PER_HOST))
                for h in range(WORLD // RANKS_PER_HOST)
            },
            "pp": STAGES,
            "dp": EP,
            "ep": EP,
            "ranks": ranks_info,
            "groups": groups,
        },
        "injected": {
            "straggler": {
                **STRAGGLER,
                "profiler_step_label": f"ProfilerStep#{STRAGGLER['step']}",
                "annotation": "injected_straggler_sleep",
                "where": "start of step, before forward (before pp recv of activation)",
            },
            "skewed_routing": {"hot_expert_ranks": [0, 4], "min_share": 0.5, "per_step": hot},
            "ep_compute_imbalance": (
                "hot expert ranks 0 and 4 run the expert MLP on >=50% of "
                "the stage's tokens, so EP peers wait in the combine a2a"
            ),
        },
        "all_to_all": a2a,
        "expected_calls": expected,
        "notes": [
            "split_rows[i][j] = rows (tokens) EP member i sends to EP member j (global ranks in "
            "'ranks'); split_bytes = rows * row_elems * elem_size.",
            "count_exchange a2a has no explicit splits (equal split of 1 int64 per peer).",
            "*_bwd a2a calls run inside autograd backward (combine_bwd first, then dispatch_bwd).",
            "send/recv peers are global ranks; each pair has its own 2-rank PG 'pp_pair{i}'.",
            "step 0 is profiler warm-up (not in the traces) but is in the FR dumps.",
        ],
        "flight_recorder": fr,
        "self_checks": checks,
    }


def main() -> None:
    """Spawn the 8 ranks, then write truth.json."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="sample_traces/gloo_moe_8rank")
    ap.add_argument("--no-fr", action="store_true", help="skip Flight Recorder dumps")
    args = ap.parse_args()
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    for old in outdir.glob("*.pt.trace.json.gz"):
        old.unlink()
    t0 = time.time()
    mp.start_processes(
        worker, args=(str(outdir), free_port(), not args.no_fr), nprocs=WORLD, join=True, start_method="spawn"
    )
    truth = build_truth(outdir, not args.no_fr)
    (outdir / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    print(f"wrote {outdir} in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
