"""YAML from received files: anchors allowed within a budget, alias bombs and recursive aliases
refused before anything walks the document (issue 22)."""

from __future__ import annotations

import resource
import time
from pathlib import Path

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
