"""EPLB as published by DeepSeek, checked against the worked example in its README and by hand."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.whatif.eplb import EplbError, balanced_packing, rebalance_experts, replicate


def test_published_example():
    # github.com/deepseek-ai/EPLB README: two layers of 12 experts, 4 groups, 16 slots, 2 nodes x 4 GPUs;
    # the printed plan (hierarchical policy).
    weight = np.array([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                       [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]])
    plan = rebalance_experts(weight, 16, 4, 2, 8)
    assert plan.policy == "hierarchical"
    assert plan.phy2log.tolist() == [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                                     [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]


def test_balanced_inputs_stay_put():
    plan = rebalance_experts(np.full(8, 5.0), 8, 1, 2, 8)
    assert plan.phy2log[0].tolist() == list(range(8))
    doubled = rebalance_experts(np.full(8, 5.0), 16, 1, 2, 8)
    assert doubled.replicas_on(0).tolist() == (2 * np.eye(8, dtype=int)).tolist()


def test_a_40_percent_expert_is_split():
    # 8 experts, expert 0 has 40% of the load, 8 redundant slots (2 per GPU). By hand: expert 0 gets
    # 5 replicas of 0.08, experts 1-4 two of 0.6/14, experts 5-7 stay whole (0.6/7); the packing puts
    # a 0.6/14 half with each: 3 GPUs carry 0.6/7 + 0.6/14 = 0.9/7, 5 carry 0.08 + 0.6/14.
    weight = np.array([0.4] + [0.6 / 7] * 7)
    plan = rebalance_experts(weight, 16, 1, 2, 8)
    assert plan.count[0].tolist() == [5, 2, 2, 2, 2, 1, 1, 1]
    load = plan.gpu_load(weight)[0]
    assert sorted(load) == pytest.approx(sorted([0.9 / 7] * 3 + [0.08 + 0.6 / 14] * 5))
    assert load.max() / load.mean() == pytest.approx((0.9 / 7) / 0.125)
    assert load.max() / load.mean() < 1.3
    no_spare = rebalance_experts(weight, 8, 1, 2, 8)
    assert no_spare.gpu_load(weight)[0].max() == pytest.approx(0.4)


def test_global_policy_when_nodes_do_not_divide_groups():
    weight = np.arange(1, 13, dtype=float)
    assert rebalance_experts(weight, 16, 3, 2, 8).policy == "global"
    assert rebalance_experts(weight, 16, 4, 2, 8).policy == "hierarchical"


def test_hierarchical_keeps_each_group_inside_one_node():
    rng = np.random.default_rng(3)
    weight = rng.gamma(0.5, size=(3, 32))
    plan = rebalance_experts(weight, 48, 8, 4, 16)
    per_node = 48 // 4
    for layer in range(3):
        for node in range(4):
            groups = set(plan.phy2log[layer, node * per_node:(node + 1) * per_node] // 4)
            assert len(groups) == 2


def test_bad_shapes_name_the_problem():
    with pytest.raises(EplbError, match="split evenly over 8 GPUs"):
        rebalance_experts(np.ones(8), 12, 1, 1, 8)
    with pytest.raises(EplbError, match="cannot hold"):
        rebalance_experts(np.ones(8), 4, 1, 1, 4)
    with pytest.raises(EplbError, match="non-negative"):
        rebalance_experts(-np.ones(8), 8, 1, 1, 8)


def test_packing_and_replication_by_hand():
    pack, pos = balanced_packing(np.array([5.0, 1.0, 4.0, 2.0]), 2)
    # 5 -> pack 0, 4 -> pack 1, 2 -> the lighter pack 1 (6), 1 -> pack 0 (6)
    assert pack.tolist() == [0, 0, 1, 1] and pos.tolist() == [0, 1, 0, 1]
    slots, count = replicate(np.array([6.0, 2.0, 3.0]), 5)
    assert slots.tolist() == [0, 1, 2, 0, 0] and count.tolist() == [3, 1, 1]


@st.composite
def shapes(draw):
    nodes = draw(st.sampled_from([1, 2, 4]))
    gpus = nodes * draw(st.integers(1, 4))
    groups = nodes * draw(st.integers(1, 3))
    experts = groups * draw(st.integers(1, 4))
    slots_per_gpu = -(-experts // gpus) + draw(st.integers(0, 3))
    layers = draw(st.integers(1, 3))
    weight = np.array(draw(st.lists(st.floats(0, 1000), min_size=layers * experts, max_size=layers * experts)))
    return weight.reshape(layers, experts), slots_per_gpu * gpus, draw(st.sampled_from([groups, 1])), nodes, gpus


@settings(max_examples=150, deadline=None)
@given(shapes())
def test_replicas_never_exceed_the_slots(case):
    weight, slots, groups, nodes, gpus = case
    plan = rebalance_experts(weight, slots, groups, nodes, gpus)
    assert plan.phy2log.shape == (weight.shape[0], slots)
    for layer in range(weight.shape[0]):
        assert plan.count[layer].sum() == slots and (plan.count[layer] >= 1).all()
        assert np.bincount(plan.phy2log[layer], minlength=weight.shape[1]).tolist() == plan.count[layer].tolist()
        assert plan.replicas_on(layer).sum(axis=0).tolist() == [slots // gpus] * gpus
    assert plan.gpu_load(weight).sum() == pytest.approx(weight.sum(), rel=1e-9, abs=1e-9)
