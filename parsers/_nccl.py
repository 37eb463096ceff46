"""NCCL's enums and names, shared by the NCCL log, Inspector and profiler-plugin parsers.

From NVIDIA/nccl `src/nccl.h.in` (ncclDataType_t, ncclRedOp_t) and `src/include/device.h`
(NCCL_ALGO_*, NCCL_PROTO_*), stable from 2.4 to 2.30 for the values listed here.
"""

from __future__ import annotations

from tracekit._limits import checked_int
from tracekit.parsers.vocabulary import NCCL_OPS

#: ncclDataType_t value -> (c10 dtype name, bytes per element). 9 (bfloat16) is 2.10+, 10-11 (fp8) 2.24+.
DATATYPES: dict[int, tuple[str, int]] = {
    0: ("Char", 1), 1: ("Byte", 1), 2: ("Int", 4), 3: ("UInt32", 4), 4: ("Long", 8), 5: ("UInt64", 8),
    6: ("Half", 2), 7: ("Float", 4), 8: ("Double", 8), 9: ("BFloat16", 2), 10: ("Float8_e4m3fn", 1),
    11: ("Float8_e5m2", 1),
}
#: NCCL type names (`ncclFloat32`, `ncclBfloat16`, profiler-plugin strings) -> the same pair.
TYPE_NAMES: dict[str, tuple[str, int]] = {
    "ncclint8": DATATYPES[0], "ncclchar": DATATYPES[0], "ncluint8": DATATYPES[1], "ncclint32": DATATYPES[2],
    "ncclint": DATATYPES[2], "ncluint32": DATATYPES[3], "ncclint64": DATATYPES[4], "ncluint64": DATATYPES[5],
    "ncclfloat16": DATATYPES[6], "ncclhalf": DATATYPES[6], "ncclfloat32": DATATYPES[7], "ncclfloat": DATATYPES[7],
    "ncclfloat64": DATATYPES[8], "nccldouble": DATATYPES[8], "ncclbfloat16": DATATYPES[9],
    "ncclfloat8e4m3": DATATYPES[10], "ncclfloat8e5m2": DATATYPES[11],
}
#: ncclRedOp_t value -> name; values >= 5 are user-created (ncclRedOpCreatePreMulSum) handles.
REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
#: NCCL_ALGO_* -> the name NCCL 2.24+ prints.
ALGOS = {0: "TREE", 1: "RING", 2: "COLLNET_DIRECT", 3: "COLLNET_CHAIN", 4: "NVLS", 5: "NVLS_TREE", 6: "PAT"}
PROTOS = {0: "LL", 1: "LL128", 2: "SIMPLE"}

def datatype(value: int | str | None) -> tuple[str | None, int | None]:
    """(c10 name, bytes per element) of an ncclDataType_t value or NCCL type name."""
    if value is None:
        return None, None
    if isinstance(value, int):
        got = DATATYPES.get(value)
    else:
        key = str(value).strip().lower()
        got = TYPE_NAMES.get(key) or TYPE_NAMES.get("nccl" + key)
        if got is None:
            got = DATATYPES.get(checked_int(key, "int32"))
    return got if got is not None else (None, None)


def op_of(name: str | None) -> str:
    """The `op` of an NCCL function name (unknown names are "other")."""
    return NCCL_OPS.get(name or "", "other")


#: NCCL's `count` is the whole buffer (AllReduce, Broadcast, Reduce, Send/Recv), one rank's share
#: (AllGather send, ReduceScatter receive, Gather, Scatter) or one peer's share (AlltoAll): per op,
#: whether the input and the output are `nranks` times `count`.
TIMES_NRANKS: dict[str, tuple[bool, bool]] = {
    "all_gather": (False, True), "gather": (False, True), "reduce_scatter": (True, False),
    "scatter": (True, False), "all_to_all": (True, True),
}


def bytes_of(op: str, count: int | None, width: int | None, nranks: int | None) -> tuple[int | None, int | None]:
    """(in_bytes, out_bytes) of one call from NCCL's `count` (see TIMES_NRANKS)."""
    if count is None or width is None:
        return None, None
    n = count * width
    k = nranks or 1
    times_in, times_out = TIMES_NRANKS.get(op, (False, False))
    return n * k if times_in else n, n * k if times_out else n


def bus_id(raw: str | None) -> str | None:
    """NCCL's busId (`4f000`, `0x1a000`, `18100000`) as a PCI address `0000:4f:00.0`."""
    if not raw:
        return None
    text = raw.strip().lower().removeprefix("0x")
    if not text or any(c not in "0123456789abcdef" for c in text) or len(text) > 12:
        return None
    text = text.rjust(9, "0")
    return f"{text[:-5].rjust(4, '0')[-8:]}:{text[-5:-3]}:{text[-3:-1]}.{text[-1]}"


def version_of(code: int | None) -> str | None:
    """NCCL_VERSION_CODE (22703, or 2703 before 2.9) as "2.27.3"."""
    if code is None or code <= 0:
        return None
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"
