"""North-south flows: traffic between ranks and storage nodes (checkpoint writes, data loading)
that the trace does not hold as collectives, routed on the front-end or the back-end network.

A rank reaches the front-end through its host's front-end NIC (NIC `local GPU mod frontend_nics`)
and its ToR, under the aggregation switch the storage nodes hang from. On the back-end it uses its
GPU's first NIC (GPUDirect Storage: GPU -> PCIe -> NIC), its leaf, a spine chosen by a hash of the
flow, the storage leaf and the storage node (or the only leaf when the fabric has no spines). The
copy from GPU to host memory on the front-end path is not modelled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tracekit.replay.topology import Topology, TopologyError

STORAGE_DIM = "storage"


@dataclass
class StorageFlows:
    """Flows between ranks and storage nodes, released at fixed times on the run's common clock
    (`ts_ns + clock_offset_ns`); `tag` indexes `tags` (one tag per checkpoint or load)."""

    rank: np.ndarray
    storage: np.ndarray
    nbytes: np.ndarray
    release_ns: np.ndarray
    write: np.ndarray
    tag: np.ndarray
    tags: Sequence[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.rank.size)

    @classmethod
    def from_lists(cls, rank, storage, nbytes, release_ns, write, tag, tags) -> StorageFlows:
        return cls(np.asarray(rank, np.int64), np.asarray(storage, np.int64), np.asarray(nbytes, np.float64),
                   np.asarray(release_ns, np.float64), np.asarray(write, bool), np.asarray(tag, np.int64),
                   list(tags))


def route_storage(topology: Topology, gpu_of_rank: Mapping[int, int], flows: StorageFlows
                  ) -> tuple[np.ndarray, np.ndarray]:
    """CSR paths (indptr, resource ids) of storage flows on the topology."""
    r = topology.route
    st, t = r.storage, r.tables
    n_storage = int(st.n_storage)
    if n_storage == 0 and len(flows):
        raise TopologyError("storage", "the topology has no storage nodes; set storage=N")
    if len(flows) and (flows.storage.min() < 0 or flows.storage.max() >= n_storage):
        raise TopologyError("storage", f"flows name storage nodes outside 0..{n_storage - 1}")
    per_host = r.gpus_per_host
    k = r.nics_per_gpu
    frontend = st.storage_on == "frontend"
    paths: list[list[int]] = []
    for rank, s, write in zip(flows.rank.tolist(), flows.storage.tolist(), flows.write.tolist(), strict=True):
        gpu = int(gpu_of_rank[rank])
        if frontend:
            host, local = divmod(gpu, per_host)
            nic = local % st.fe_up.shape[1]
            tor = int(st.fe_tor[host])
            path = [int(st.fe_up[host, nic]), int(st.tor_up[tor]), int(st.storage_in[s])]
            if not write:
                path = [int(st.storage_out[s]), int(st.tor_down[tor]), int(st.fe_down[host, nic])]
        else:
            nic = gpu * k
            leaf = int(t.nic_leaf[nic, 0])
            if st.spine_to_store.size:
                n_sp = t.leaf_spine_up.shape[1]
                sp = (gpu * 2654435761 + s * 40503) % n_sp
                spine = int(t.leaf_pod[leaf]) * n_sp + sp
                middle_up = [int(t.leaf_spine_up[leaf, sp]), int(st.spine_to_store[spine])]
                middle_down = [int(st.store_to_spine[spine]), int(t.spine_leaf_down[leaf, sp])]
            elif leaf == 0:
                middle_up = middle_down = []
            else:
                raise TopologyError("storage_network", "back-end storage needs spines or a single leaf")
            if write:
                path = [int(t.pcie_up[nic]), int(t.nic_leaf_up[nic, 0]), *middle_up, int(st.storage_in[s])]
            else:
                path = [int(st.storage_out[s]), *middle_down, int(t.leaf_nic_down[nic, 0]),
                        int(t.pcie_down[nic])]
        paths.append(path)
    indptr = np.zeros(len(paths) + 1, np.int64)
    indptr[1:] = np.cumsum([len(p) for p in paths])
    ids = np.asarray([x for p in paths for x in p], np.int64)
    return indptr, ids
