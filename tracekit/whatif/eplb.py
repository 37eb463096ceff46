"""Expert-parallel load balancing (EPLB) as published by DeepSeek for DeepSeek-V3.

Written here from the published description (github.com/deepseek-ai/EPLB, README): heavy experts
get redundant replicas, and the replicas are packed onto GPUs so that GPU loads are balanced.

- Hierarchical policy, used when the number of nodes divides the number of expert groups: pack
  the expert groups onto nodes (balanced, the same number of groups per node), replicate experts
  within each node, then pack each node's replicas onto its GPUs.
- Global policy, otherwise: replicate experts over all slots regardless of groups, then pack the
  replicas onto all GPUs.

Packing is greedy: items in decreasing weight, each to the lightest pack that still has room
(every pack takes the same number of items). Replication repeatedly adds one replica to the
expert whose load per replica is largest. Ties go to the lower index, so plans are deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit.errors import TracekitError


class EplbError(TracekitError):
    """The expert counts, groups, nodes and slots do not fit together."""


@dataclass(frozen=True)
class ExpertPlan:
    """Where each physical expert slot lives: `phy2log[layer, slot]` is the logical expert held by
    slot `slot` (slots are numbered GPU-major: GPU g holds slots g*slots_per_gpu ...), and
    `count[layer, expert]` the number of replicas of each logical expert."""

    phy2log: np.ndarray
    count: np.ndarray
    n_gpus: int
    policy: str  # "hierarchical" | "global"

    @property
    def slots_per_gpu(self) -> int:
        return self.phy2log.shape[1] // self.n_gpus

    def gpu_load(self, weight: np.ndarray) -> np.ndarray:
        """Load per GPU (layers x GPUs) when each expert's load is split evenly over its replicas."""
        weight = np.atleast_2d(np.asarray(weight, np.float64))
        per_slot = np.take_along_axis(weight / self.count, self.phy2log, axis=1)
        return per_slot.reshape(weight.shape[0], self.n_gpus, self.slots_per_gpu).sum(axis=2)

    def replicas_on(self, layer: int = 0) -> np.ndarray:
        """(experts x GPUs) number of replicas of each logical expert on each GPU."""
        n_experts = self.count.shape[1]
        gpu = np.arange(self.phy2log.shape[1]) // self.slots_per_gpu
        out = np.zeros((n_experts, self.n_gpus), np.int64)
        np.add.at(out, (self.phy2log[layer], gpu), 1)
        return out


def balanced_packing(weight: np.ndarray, n_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack `len(weight)` items into `n_packs` packs of equal item count, heaviest item first into
    the lightest pack that has room. Returns each item's pack and its position in the pack."""
    weight = np.asarray(weight, np.float64)
    n = weight.size
    if n_packs < 1 or n % n_packs:
        raise EplbError(f"{n} items do not split evenly into {n_packs} packs")
    capacity = n // n_packs
    load = np.zeros(n_packs)
    filled = np.zeros(n_packs, np.int64)
    pack = np.empty(n, np.int64)
    position = np.empty(n, np.int64)
    for item in np.argsort(-weight, kind="stable"):
        p = int(np.argmin(np.where(filled < capacity, load, np.inf)))
        pack[item], position[item] = p, filled[p]
        load[p] += weight[item]
        filled[p] += 1
    return pack, position


def replicate(weight: np.ndarray, n_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Fill `n_slots` slots with the experts: each once, then one more replica at a time of the
    expert whose load per replica is largest. Returns (slot -> expert, replicas per expert)."""
    weight = np.asarray(weight, np.float64)
    n = weight.size
    if n_slots < n:
        raise EplbError(f"{n_slots} slots cannot hold {n} experts")
    count = np.ones(n, np.int64)
    slots = list(range(n))
    for _ in range(n_slots - n):
        e = int(np.argmax(weight / count))
        slots.append(e)
        count[e] += 1
    return np.asarray(slots, np.int64), count


def rebalance_experts(weight: np.ndarray, n_slots: int, n_groups: int, n_nodes: int, n_gpus: int
                      ) -> ExpertPlan:
    """Plan replicas and their GPUs for `weight` (experts, or layers x experts) on `n_gpus` GPUs
    in `n_nodes` nodes with `n_slots` expert slots in all; hierarchical when `n_nodes` divides
    `n_groups`, global otherwise."""
    weight = np.atleast_2d(np.asarray(weight, np.float64))
    layers, n_experts = weight.shape
    if n_gpus < 1 or n_slots % n_gpus:
        raise EplbError(f"{n_slots} expert slots do not split evenly over {n_gpus} GPUs")
    if n_slots < n_experts:
        raise EplbError(f"{n_slots} expert slots cannot hold {n_experts} experts")
    if (weight < 0).any() or not np.isfinite(weight).all():
        raise EplbError("expert loads must be finite and non-negative")
    hierarchical = n_groups >= 1 and n_nodes >= 1 and n_groups % n_nodes == 0
    if hierarchical:
        if n_experts % n_groups:
            raise EplbError(f"{n_experts} experts do not split into {n_groups} groups")
        if n_gpus % n_nodes:
            raise EplbError(f"{n_gpus} GPUs do not split evenly over {n_nodes} nodes")
    else:
        n_groups = n_nodes = 1
    phy2log = np.empty((layers, n_slots), np.int64)
    count = np.zeros((layers, n_experts), np.int64)
    for layer in range(layers):
        phy2log[layer], count[layer] = _plan_layer(weight[layer], n_slots, n_groups, n_nodes, n_gpus)
    return ExpertPlan(phy2log=phy2log, count=count, n_gpus=n_gpus,
                      policy="hierarchical" if hierarchical else "global")


def _plan_layer(w: np.ndarray, n_slots: int, n_groups: int, n_nodes: int, n_gpus: int
                ) -> tuple[np.ndarray, np.ndarray]:
    n_experts = w.size
    per_group = n_experts // n_groups
    group_node, group_pos = balanced_packing(w.reshape(n_groups, per_group).sum(axis=1), n_nodes)
    slots_per_node = n_slots // n_nodes
    gpus_per_node = n_gpus // n_nodes
    slots_per_gpu = n_slots // n_gpus
    phy2log = np.empty(n_slots, np.int64)
    count = np.zeros(n_experts, np.int64)
    for node in range(n_nodes):
        groups = np.nonzero(group_node == node)[0]
        groups = groups[np.argsort(group_pos[groups], kind="stable")]
        experts = np.concatenate([np.arange(g * per_group, (g + 1) * per_group) for g in groups])
        slot_expert, replicas = replicate(w[experts], slots_per_node)
        count[experts] = replicas
        gpu, pos = balanced_packing(w[experts][slot_expert] / replicas[slot_expert], gpus_per_node)
        physical = (node * gpus_per_node + gpu) * slots_per_gpu + pos
        phy2log[physical] = experts[slot_expert]
    return phy2log, count
