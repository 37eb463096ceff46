"""Placement what-if: remapping ranks to hosts, on a synthetic 2-host DP x PP x EP run."""

import json

import pytest

from tracekit.synth import SynthSpec, make_run_tables
from tracekit.whatif import WhatIfError, make_baseline, named_placement, placement, read_placement
from tracekit.whatif.placement import greedy_placement, pp_chains

TOPO = "rail-optimized:gpus=4"
SPEC = SynthSpec(hosts=2, gpus_per_host=4, pp=2, ep=2, steps=2, straggler_rank=None, clock_skew_ns=0)


@pytest.fixture(scope="module")
def base():
    tables, _ = make_run_tables(SPEC)
    return make_baseline(tables, TOPO)


def _act_bytes(spec):
    return spec.tokens // spec.micro_batches * spec.hidden * 2


def test_pipelines_in_stage_order(base):
    assert pp_chains(base.tables) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_pp_adjacent_takes_pp_off_the_network(base):
    # Stage 0 is ranks 0-3 on host 0, stage 1 ranks 4-7 on host 1: every PP send crosses hosts. Per
    # step, 2 micro-batches x 4 pairs x (forward + backward) = 16 sends of one activation, 2 steps.
    r = placement(base, "pp-adjacent")
    assert r.inter_host_before["PP"] == 2 * 16 * _act_bytes(SPEC)
    assert r.inter_host_after.get("PP", 0) == 0
    assert [r.placement_after.ranks_on(h) for h in (0, 1)] == [[0, 4, 1, 5], [2, 6, 3, 7]]
    assert r.placement_before.slots == base.placement.slots
    assert r.baseline_step_ns == base.result.step_ns


def test_pp_spread_undoes_pp_adjacent(base):
    adjacent = named_placement(base.tables, base.placement, "pp-adjacent")
    spread = named_placement(base.tables, adjacent, "pp-spread")
    assert spread.slots == base.placement.slots


def test_traced_placement_replays_as_the_baseline(base):
    r = placement(base, base.placement)
    assert r.step_ns == r.baseline_step_ns and r.inter_host_after == r.inter_host_before


def test_placement_file(tmp_path, base):
    rows = [{"rank": r, "host": "b" if r in (2, 3, 6, 7) else "a"} for r in range(8)]
    (tmp_path / "p.json").write_text(json.dumps(rows))
    p = read_placement(tmp_path / "p.json")
    assert p.hosts == ("a", "b") and p.ranks_on(0) == [0, 1, 4, 5]
    (tmp_path / "p.csv").write_text("rank,host,gpu\n" + "".join(
        f"{r},{'x' if r % 2 else 'y'},{r // 2}\n" for r in range(8)))
    p = read_placement(tmp_path / "p.csv")
    assert p.hosts == ("y", "x") and p.slots[7] == (1, 3)
    r = placement(base, tmp_path / "p.csv")
    assert r.inter_host_after["PP"] == 0  # pairs (r, r + 4) share parity, so a host
    assert r.details["moved_ranks"] == 6


def test_bad_placements_name_the_problem(tmp_path, base):
    (tmp_path / "short.csv").write_text("rank,host\n0,a\n")
    with pytest.raises(WhatIfError, match=r"no host for rank\(s\) \[1, 2"):
        placement(base, tmp_path / "short.csv")
    (tmp_path / "full.csv").write_text("rank,host\n" + "".join(f"{r},a\n" for r in range(8)))
    with pytest.raises(WhatIfError, match="holds 8 GPUs but topology"):
        placement(base, tmp_path / "full.csv")
    with pytest.raises(WhatIfError, match="neither a named placement"):
        placement(base, tmp_path / "missing.csv")
    (tmp_path / "twice.csv").write_text("rank,host\n0,a\n0,b\n")
    from tracekit.errors import InputError

    with pytest.raises(InputError, match="rank 0 is placed twice"):
        read_placement(tmp_path / "twice.csv")


def test_greedy_keeps_the_heaviest_pairs_together(base):
    # PP pairs exchange 8 activations a step each way; DP all-reduce members 2 x 64 MiB buckets
    # spread over 3 peers... so DP groups (ranks 0-3 and 4-7) are the heaviest: greedy keeps them.
    g = greedy_placement(base.tables, base.placement)
    assert sorted(sorted(g.ranks_on(h)) for h in (0, 1)) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_auto_is_bounded_and_never_worse(base):
    r = placement(base, "auto", max_replays=3)
    assert r.details["replays"] <= 3
    assert r.step_change.after <= r.step_change.before
    assert r.details["tried"][0]["placement"] == "traced"


def test_auto_pulls_heavy_pairs_into_a_host():
    # Ranks 0, 1 on host a and 2, 3 on host b; 0 <-> 2 and 1 <-> 3 exchange 400 MB each way and
    # nothing else: the greedy start puts each pair in one host, and no byte leaves a host.
    from whatif_helpers import RunBuilder

    b = RunBuilder({0: ("a", 0), 1: ("a", 1), 2: ("b", 0), 3: ("b", 1)})
    for pair, group in (((0, 2), "p02"), ((1, 3), "p13"), ((2, 0), "p02"), ((3, 1), "p13")):
        b.collective(group, list(pair), "send", "PP", dur=10_000_000, nbytes=400_000_000, pair=pair)
    base = make_baseline(b.tables(), "rail-optimized:gpus=2")
    r = placement(base, "auto", max_replays=4)
    assert r.inter_host_before == {"PP": 4 * 400_000_000} and r.inter_host_after == {"PP": 0}
    assert {frozenset(r.placement_after.ranks_on(h)) for h in (0, 1)} == {frozenset({0, 2}), frozenset({1, 3})}
    assert r.details["start"] == "greedy" and r.step_change.after < r.step_change.before
