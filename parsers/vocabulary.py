"""The parsers' shared vocabulary: the `op` names of the `collectives` table and what each format
calls them, bytes per element of dtype names, and rank lists. One place, so that every parser maps
a name the same way (see docs/architecture.md "The parser registry")."""

from __future__ import annotations

import re
from typing import Any

from tracekit._limits import MAX_WORLD_SIZE, checked_int

#: c10 / torch dtype names, lower case -> bytes per element (`dtype_bytes` reads a name).
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "bfloat16": 2, "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "int16": 2,
    "char": 1, "int8": 1, "byte": 1, "uint8": 1, "bool": 1, "complexfloat": 8,
    "complexdouble": 16, "complexhalf": 4, "uint16": 2, "uint32": 4, "uint64": 8,
}

#: PyTorch's collective names (c10d, record_param_comms, Flight Recorder) -> the `op` vocabulary.
COLLECTIVE_OPS = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "_all_gather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_base": "reduce_scatter",
    "all_to_all": "all_to_all", "all_to_allv": "all_to_all", "alltoall": "all_to_all",
    "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all", "alltoallv": "all_to_all",
    "send": "send", "recv": "recv", "recvanysource": "recv", "recv_any_source": "recv",
    "broadcast": "broadcast", "reduce": "reduce", "barrier": "barrier",
    "gather": "gather", "scatter": "scatter", "coalesced": "other",
}

#: The collective part of an NCCL kernel name (`ncclDevKernel_AllReduce_...`) -> the `op` vocabulary.
KERNEL_OPS = {
    "AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast", "Reduce": "reduce", "SendRecv": "other", "Send": "send",
    "Recv": "recv", "AllToAll": "all_to_all", "AllToAllPivot": "all_to_all",
    "AllToAllv": "all_to_all", "Gather": "gather", "Scatter": "scatter",
}

#: NCCL function names (COLL lines, Inspector, profiler) -> the `op` vocabulary of `collectives`.
NCCL_OPS = {
    "AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast", "Reduce": "reduce", "Send": "send", "Recv": "recv", "AlltoAll": "all_to_all",
    "AllToAll": "all_to_all", "AllToAllPivot": "all_to_all", "AllToAllv": "all_to_all", "Gather": "gather",
    "Scatter": "scatter", "SendRecv": "other",
}

_INTS = re.compile(r"-?\d+")


def dtype_bytes(dtype: str | None) -> int | None:
    """Bytes per element of a c10 dtype name (Float 4, BFloat16 2, Float8_* 1, ...)."""
    if not dtype:
        return None
    key = dtype.strip().lower().removeprefix("c10::").removeprefix("torch.")
    if key.startswith("float8"):
        return 1
    if key.startswith("float4"):
        return 1
    return DTYPE_BYTES.get(key)


def parse_rank_list(value: Any) -> tuple[list[int], bool]:
    """Ranks from a JSON list or a (possibly truncated, "[0, ..., 28, ..., 299]") string, and
    whether the list is complete."""
    if isinstance(value, list):
        out = [checked_int(v, "rank") for v in value[:MAX_WORLD_SIZE]]
        kept = [v for v in out if v is not None]
        return kept, len(kept) == len(value)
    if isinstance(value, str):
        found = _INTS.findall(value)
        kept = [v for v in (checked_int(x, "rank") for x in found[:MAX_WORLD_SIZE]) if v is not None]
        return kept, "..." not in value and len(kept) == len(found)
    return [], False
