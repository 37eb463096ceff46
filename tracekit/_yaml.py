"""YAML from untrusted files (link maps, topology specs) with an alias budget.

A YAML anchor can be referenced many times, and an alias can name an anchor that itself holds
aliases: nine levels of nine aliases ("billion laughs") are a few hundred bytes that expand into
387 M nodes the moment anything walks or prints the result. The document is composed first (one
node per anchor, whatever the number of aliases to it), its expanded size and depth are counted
over the node graph in time linear in the distinct nodes, and it is only constructed when both
are within budget. Recursive aliases (an anchor inside itself) are refused.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import yaml

from tracekit._limits import MAX_DEPTH, json_depth

#: libyaml's safe loader when present: the pure-Python one takes tens of seconds on a few MB.
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: Expanded nodes allowed beyond the distinct ones, per distinct node: anchors used for shared
#: defaults expand a file a few times, an alias bomb by a factor of millions.
ALIAS_EXPANSION = 16
#: Expanded nodes allowed whatever the ratio (a small file with a few anchors).
ALIAS_FREE_NODES = 10_000


class YAMLBudgetError(ValueError):
    """A YAML document over its alias budget, recursive, or nested too deeply through aliases."""


def load(text: str, *, expansion: int = ALIAS_EXPANSION, free: int = ALIAS_FREE_NODES,
         max_depth: int = MAX_DEPTH, repeated: list[list[str]] | None = None) -> Any:
    """The YAML document in `text` (safe tags only), refused with `YAMLBudgetError` when its
    aliases would expand it beyond `expansion` x its distinct nodes + `free`, or beyond
    `max_depth` levels; yaml.YAMLError for a syntax error. A mapping that gives a key twice
    keeps the last value (as PyYAML does); each such mapping appends its repeated keys to
    `repeated` (issue 22)."""
    # libyaml recurses (and can crash) on deeply nested input: refuse it first, in linear time
    if json_depth(text, max_depth) > max_depth or _max_indent(text) > 8 * max_depth:
        raise YAMLBudgetError(f"YAML nested deeper than {max_depth} levels")
    loader = LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        distinct, expanded, deepest = _measure(node, cap=(expansion + 1) * (len(text) + 1) + free + 1)
        if deepest > max_depth:
            raise YAMLBudgetError(f"YAML nested deeper than {max_depth} levels through aliases")
        budget = expansion * distinct + free
        if expanded > budget:
            raise YAMLBudgetError(f"YAML aliases expand {distinct:,} nodes into more than {budget:,} "
                                  f"(an alias bomb; the budget is {expansion} x the distinct nodes + {free:,})")
        if repeated is not None:
            _tally_repeated_keys(node, repeated)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _max_indent(text: str) -> int:
    return max((len(m.group()) for m in _INDENT.finditer(text)), default=0)


_INDENT = re.compile(r"(?m)^[ \t]+")
_MERGE = "tag:yaml.org,2002:merge"


def _measure(root: yaml.Node, *, cap: int) -> tuple[int, int, int]:
    """(distinct nodes, expanded nodes, expanded depth) of a composed node graph, without
    recursion; the expanded count stops growing past `cap`. A cycle raises YAMLBudgetError."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            kids = _children(node)
            size[key] = min(cap, 1 + sum(size[id(k)] for k in kids))
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            open_nodes.discard(key)
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise YAMLBudgetError("YAML alias refers to an anchor that contains it (a recursive document)")
        open_nodes.add(key)
        stack.append((node, True))
        for kid in _children(node):
            if id(kid) in open_nodes:
                raise YAMLBudgetError("YAML alias refers to an anchor that contains it (a recursive document)")
            if id(kid) not in size:
                stack.append((kid, False))
    return len(size), size[id(root)], depth[id(root)]


def _tally_repeated_keys(root: yaml.Node, repeated: list[list[str]]) -> None:
    """The keys given twice by each distinct mapping node of the graph, appended to `repeated`."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE]
            if len(set(keys)) != len(keys):
                repeated.append(sorted(k for k, n in Counter(keys).items() if n > 1))
        stack.extend(_children(node))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []
