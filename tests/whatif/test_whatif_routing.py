"""`routing:nodes=M` (node-limited routing): the closed form of evenly spread traffic, the invariants
of the rewrite, and the scenario on a synth run whose EP groups span two hosts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit import workflows
from tracekit.synth import SynthSpec, make_run_tables, write_run
from tracekit.whatif import WhatIfError, make_baseline, parse_scenario, run_scenario
from tracekit.whatif.routing import cross_node_bytes, limit_nodes


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_even_traffic_over_h_nodes_keeps_m_minus_1_over_m_off_node(m):
    """8 ranks on 4 nodes of 2, every rank sending b to every rank: a sender's share off its node
    is (H-1)/H = 3/4 traced and (M-1)/M limited to M nodes (its own node and the lowest others)."""
    b, h = 1000.0, 4
    node = [i // 2 for i in range(8)]
    d = np.full((8, 8), b)
    assert cross_node_bytes(d, node) == pytest.approx(64 * b * (h - 1) / h)
    new = limit_nodes(d, node, m)
    assert cross_node_bytes(new, node) == pytest.approx(64 * b * (m - 1) / m)
    assert new.sum(axis=1) == pytest.approx(d.sum(axis=1))
    kept = {node[j] for j in np.flatnonzero(new[2])}  # rank 2 sits on node 1: it keeps node 1, then 0, 2, ...
    assert kept == {1, *[n for n in (0, 2, 3)][:m - 1]}


def test_a_hot_remote_node_takes_everything_at_m_1():
    """A sender on node 1 whose tokens go 70% to node 0: limited to one node, all go to node 0."""
    d = np.array([[0.0, 70.0, 20.0, 10.0]])
    out = limit_nodes(d, [0, 0, 1, 1], 1)  # columns: node 0, node 0, node 1, node 1
    assert out.tolist() == [[0.0, 100.0, 0.0, 0.0]]


@settings(max_examples=80, deadline=None)
@given(n=st.integers(2, 10), m=st.integers(1, 5), seed=st.integers(0, 2**31), data=st.data())
def test_rows_keep_their_bytes_on_at_most_m_nodes(n, m, seed, data):
    node = data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    d = np.random.default_rng(seed).integers(0, 1000, (n, n)).astype(float)
    new = limit_nodes(d, node, m)
    assert np.allclose(new.sum(axis=1), d.sum(axis=1))
    assert (new >= 0).all() and ((d == 0) <= (new == 0)).all()  # no bytes to an expert that had none
    for i in range(n):
        assert len({node[j] for j in np.flatnonzero(new[i])}) <= m
    if m >= len(set(node)):
        assert np.allclose(new, d)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """EP groups of 8 over 2 hosts of 4 (pp=1), the hot expert on rank 0 (host 0)."""
    spec = SynthSpec(hosts=2, gpus_per_host=4, pp=1, ep=8, steps=2, straggler_rank=None)
    tables, truth = make_run_tables(spec)
    run = write_run(tables, tmp_path_factory.mktemp("routing") / "run", truth=truth)
    return make_baseline(workflows.replay_tables(run), "rail-optimized")


def test_one_node_pulls_the_remote_senders_onto_the_hot_node(base):
    """Hot share p on rank 0 (host 0), (1-p)/7 on each other rank. Traced, a host-1 sender sends
    p + 3(1-p)/7 of its bytes across and a host-0 sender 4(1-p)/7: half of all bytes, whatever p.
    Limited to one node, host-1 senders send everything to host 0 and host-0 senders nothing
    across: still half, but all of it now lands on host 0's NICs, so the all-to-alls slow down."""
    result = run_scenario(base, "routing:nodes=1")
    cross = result.details["cross_node_bytes"]
    assert result.details["ep_nodes"] == [2]
    assert cross["after"] == pytest.approx(cross["before"], rel=0.01)
    assert result.a2a_ns is not None and result.a2a_ns.after > result.a2a_ns.before
    assert any("per-token routing is not in the trace" in n for n in result.notes)


def test_as_many_nodes_as_the_groups_span_changes_nothing(base):
    result = run_scenario(base, "routing:nodes=2")
    assert result.step_ns == result.baseline_step_ns
    assert result.details["cross_node_bytes"]["before"] == result.details["cross_node_bytes"]["after"]
    assert any("changes nothing" in n for n in result.notes)


@pytest.mark.parametrize(("text", "message"), [("routing:", "give nodes=N"), ("routing:nodes=0", ">= 1"),
                                               ("routing:experts=2", "unknown field")])
def test_bad_routing_scenarios(text, message):
    with pytest.raises(WhatIfError, match=message):
        parse_scenario(text)
