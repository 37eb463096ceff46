"""tracekit.nccl_fabric's column-wise peer resolution against a naive row-by-row twin."""

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit import nccl_fabric


def naive_resolve_peers(table, maps, pairs):
    """Row by row, in Python: what `nccl_fabric.resolve_peers` must compute."""
    if table.num_rows == 0 or not maps or "group" not in table.column_names:
        return table, 0
    groups = table.column("group").cast(pa.string()).to_pylist()
    unknown = 0
    for glob_col, local_col in pairs:
        if glob_col not in table.column_names or local_col not in table.column_names:
            continue
        glob = table.column(glob_col).to_pylist()
        local = table.column(local_col).to_pylist()
        changed = False
        for i, (g, v, loc) in enumerate(zip(groups, glob, local, strict=True)):
            if v is not None or loc is None:
                continue
            rm = maps.get(g or "")
            if rm is not None and 0 <= loc < len(rm) and rm[loc] is not None:
                glob[i] = rm[loc]
                changed = True
            else:
                unknown += 1
        if changed:
            idx = table.schema.get_field_index(glob_col)
            typ = table.schema.field(glob_col).type
            table = table.set_column(idx, table.schema.field(glob_col), pa.array(glob, typ))
    return table, unknown


GROUPS = ["", "world", "tp0", "ep1"]
rank_map = st.lists(st.one_of(st.none(), st.integers(0, 4095)), max_size=6)
row = st.tuples(st.one_of(st.none(), st.sampled_from(GROUPS)), st.one_of(st.none(), st.integers(0, 4095)),
                st.one_of(st.none(), st.integers(-2, 7)))


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(row, max_size=40), maps=st.dictionaries(st.sampled_from(GROUPS), rank_map, max_size=4),
       dictionary=st.booleans(), chunks=st.integers(1, 3))
def test_resolve_peers_matches_the_row_by_row_twin(rows, maps, dictionary, chunks):
    group = pa.array([r[0] for r in rows], pa.string())
    if dictionary:
        group = group.dictionary_encode()
    cols = {"group": group, "peer": pa.array([r[1] for r in rows], pa.int32()),
            "peer_local": pa.array([r[2] for r in rows], pa.int32())}
    table = pa.table(cols)
    if chunks > 1 and table.num_rows > 1:  # several chunks, as a merged table has
        cut = table.num_rows // chunks
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    got, unknown = nccl_fabric.resolve_peers(table, maps, [("peer", "peer_local"), ("absent", "peer_local")])
    want, want_unknown = naive_resolve_peers(table, maps, [("peer", "peer_local"), ("absent", "peer_local")])
    assert unknown == want_unknown
    assert got.schema == want.schema
    assert got.column("peer").to_pylist() == want.column("peer").to_pylist()


def test_resolve_peers_fills_from_the_communicator_map():
    table = pa.table({"group": pa.array(["tp0", "tp0", "world", None, "tp0"]).dictionary_encode(),
                      "peer": pa.array([None, 9, None, None, None], pa.int32()),
                      "peer_local": pa.array([1, 0, 0, 0, 5], pa.int32())})
    got, unknown = nccl_fabric.resolve_peers(table, {"tp0": [4, 6], "world": [None], "": [3]}, [("peer", "peer_local")])
    assert got.column("peer").to_pylist() == [6, 9, None, 3, None]
    assert unknown == 2
