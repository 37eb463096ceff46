"""YAML from received files: anchors allowed within a budget, alias bombs and recursive aliases
refused before anything walks the document (issue 22)."""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from tracekit import _yaml
from tracekit.errors import InputError
from tracekit.parsers.telemetry import link_map
from tracekit.replay.topology import TopologyError, load_yaml
from tracekit.store import SourceSink


def laughs(levels: int, fanout: int = 9) -> str:
    """The billion-laughs document: `levels` anchors of `fanout` aliases to the one before."""
    rows = [f"l0: &l0 [{', '.join(['lol'] * fanout)}]"]
    rows += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]" for i in range(1, levels)]
    return "\n".join(rows) + f"\nlinks:\n  - {{host: node7, device: *l{levels - 1}, port: 1, peer_device: leaf3, " \
                             "peer_port: 17}\n"


def test_anchors_for_shared_defaults_still_load() -> None:
    text = "base: &base {gbps: 400, network: rail}\nlinks:\n" + "".join(
        f"  - {{<<: *base, device: mlx5_{i}, port: 1, link: l{i}}}\n" for i in range(50))
    doc = _yaml.load(text)
    assert doc["links"][7] == {"gbps": 400, "network": "rail", "device": "mlx5_7", "port": 1, "link": "l7"}


@pytest.mark.parametrize("levels", [4, 9])
def test_alias_bomb_is_refused_before_it_expands(levels: int) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.process_time()
    with pytest.raises(_yaml.YAMLBudgetError, match="alias bomb"):
        _yaml.load(laughs(levels))
    assert time.process_time() - t0 < 5  # a bound, not a benchmark: expanding 9 levels takes minutes
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 << 10


def test_budget_counts_expanded_nodes_exactly() -> None:
    """4 anchors of 9: l0 is 1 + 9 nodes, each next one 1 + 9 x the one before (10, 91, 820, 7,381),
    plus the root mapping and its 4 keys: 8,307 nodes expanded."""
    text = laughs(4).split("\nlinks:")[0]
    assert _yaml.load(text, expansion=0, free=8_307) is not None
    with pytest.raises(_yaml.YAMLBudgetError):
        _yaml.load(text, expansion=0, free=8_306)


@pytest.mark.parametrize("text", ["a: &a [1, *a]\n", "a: &a {k: *a}\n"])
def test_recursive_alias_is_refused(text: str) -> None:
    with pytest.raises(_yaml.YAMLBudgetError, match="recursive"):
        _yaml.load(text)


def test_depth_through_aliases_is_bounded() -> None:
    """Each anchor nests the previous one: 200 levels deep in 200 short lines."""
    text = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 200))
    with pytest.raises(_yaml.YAMLBudgetError, match="deeper"):
        _yaml.load(text)


def test_link_map_alias_bomb_is_a_clean_error(tmp_path: Path) -> None:
    path = tmp_path / "map.yaml"
    path.write_text(laughs(9))
    with pytest.raises(InputError, match="alias bomb") as err:
        link_map.parse(path, SourceSink(tmp_path / "run", "k"))
    assert "map.yaml" in str(err.value) and "\n" not in str(err.value)


def test_topology_alias_bomb_is_a_clean_error(tmp_path: Path) -> None:
    path = tmp_path / "net.yaml"
    path.write_text(laughs(9).split("\nlinks:")[0] + "\nname: *l8\n")
    with pytest.raises(TopologyError, match="alias bomb"):
        load_yaml(path)


def test_syntax_errors_are_still_yaml_errors() -> None:
    with pytest.raises(yaml.YAMLError):
        _yaml.load("a: [1, 2\n")


def test_repeated_mapping_keys_are_listed_once_per_distinct_mapping() -> None:
    repeated: list[list[str]] = []
    doc = _yaml.load("a: &a {k: 1, k: 2, j: 0, j: 1}\nb: *a\nc: [{x: 1}, {x: 1, y: 2, x: 3}]\n"
                     "p: &p {m: 1}\nq: &q {n: 2}\nr: {<<: *p, <<: *q, z: 1}\n", repeated=repeated)
    assert doc["a"] == {"k": 2, "j": 1} and doc["c"][1] == {"x": 3, "y": 2} and doc["r"] == {"m": 1, "n": 2, "z": 1}
    assert sorted(repeated) == [["j", "k"], ["x"]]  # the alias is the same mapping; merge keys merge


def _link_rows(tmp_path: Path, name: str, text: str) -> tuple[Any, list[dict]]:
    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / ("run_" + name)
    sink = SourceSink(out, "k")
    try:
        res = link_map.parse(path, sink)
    finally:
        sink.close()
    return res.stats, pq.read_table(out / "sources" / "k" / "topology_links.parquet").to_pylist()


def test_link_map_yaml_key_given_twice_keeps_the_last_and_warns(tmp_path: Path) -> None:
    plain = "links:\n  - {host: node7, device: mlx5_0, port: 1, peer_device: leaf3, peer_port: 17, gbps: 400}\n"
    hostile = plain.replace("gbps: 400", "gbps: 1, gbps: 400").replace("{host: node7", "{host: evil, host: node7")
    a, rows_a = _link_rows(tmp_path, "a.yaml", plain)
    b, rows_b = _link_rows(tmp_path, "b.yaml", hostile)
    assert rows_a == rows_b and b.read == a.read == b.stored + sum(b.skipped.values())
    assert b.warnings == ["1 mapping with keys given more than once, the last value kept (['gbps', 'host'])"]
    assert not a.warnings


def test_link_map_csv_column_named_twice_keeps_the_last_and_warns(tmp_path: Path) -> None:
    a, rows_a = _link_rows(tmp_path, "a.csv", "host,device,port,link\nnode7,mlx5_0,1,r0\n,leaf3,17,r0\n")
    b, rows_b = _link_rows(tmp_path, "b.csv", "host,device,port,link,link\nnode7,mlx5_0,1,x,r0\n,leaf3,17,y,r0\n")
    assert rows_a == rows_b and b.read == a.read
    assert b.warnings == ["the CSV header names ['link'] more than once: the last column kept"]


@pytest.mark.parametrize("gbps", ["1e400", "-1", "0", ".nan", "1e30"])
def test_link_map_speed_out_of_range_is_dropped_and_counted(tmp_path: Path, gbps: str) -> None:
    text = f"links:\n  - {{host: node7, device: mlx5_0, port: 1, peer_device: leaf3, peer_port: 17, gbps: {gbps}}}\n"
    st, rows = _link_rows(tmp_path, "a.yaml", text)
    assert [r["gbps"] for r in rows] == [None] and st.stored == 1
    assert st.warnings == ["1 row with gbps not a number in (0, 100,000]: stored without a speed"]
    _, ok = _link_rows(tmp_path, "b.yaml", text.replace(f"gbps: {gbps}", "gbps: 1600"))
    assert [r["gbps"] for r in ok] == [1600.0]
