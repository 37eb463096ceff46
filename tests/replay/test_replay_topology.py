import pytest

from tracekit.errors import TracekitError
from tracekit.present import topology_description
from tracekit.replay.topology import (
    TopologyError,
    build,
    describe,
    parse_spec,
    presets,
    sized,
)
from tracekit.schema import validate


def test_preset_string_parameters():
    spec = parse_spec("rail-optimized:hosts=2,gpus=8,nic_gbps=400,oversub=2")
    assert (spec.kind, spec.hosts, spec.gpus, spec.nic_gbps, spec.oversub) == (
        "rail-optimized", 2, 8, 400.0, 2.0)


def test_dgx_h100_superpod_matches_reference_architecture():
    info = describe(parse_spec("dgx-h100-superpod"))
    assert info.gpus == 256
    assert info.leaves == 8 and info.spines == 4
    tiers = info.links_per_tier
    assert tiers["nic-leaf"].cables == 256
    assert tiers["leaf-spine"].cables == 256
    assert info.oversubscription == {"leaf": 1.0}
    assert info.bisection_gbps == pytest.approx(128 * 400)


def test_tables_conform_to_schema():
    topo = build(parse_spec("fat-tree:hosts=8,tiers=3,leaf_radix=16"))
    assert validate("topology_nodes", topo.nodes) == []
    assert validate("topology_links", topo.links) == []
    assert topo.links.column("link").to_pylist() == sorted(set(topo.links.column("link").to_pylist()),
                                                           key=topo.links.column("link").to_pylist().index)
    assert topo.cap.size == 2 * topo.n_cables + int((topo.res_cable_ptr.size - 1) - 2 * topo.n_cables)


def test_oversubscription_halves_leaf_uplinks():
    full = describe(parse_spec("fat-tree:hosts=16,gpus=1,leaf_radix=8"))
    half = describe(parse_spec("fat-tree:hosts=16,gpus=1,leaf_radix=8,oversub=2"))
    assert half.links_per_tier["leaf-spine"].gbps == pytest.approx(
        full.links_per_tier["leaf-spine"].gbps / 2)
    assert half.bisection_gbps == pytest.approx(full.bisection_gbps / 2)
    assert half.oversubscription["leaf"] == 2.0


@pytest.mark.parametrize("kind", ["rail-optimized", "fat-tree"])
def test_uplinks_follow_the_hosts_attached_not_the_radix(kind):
    """A leaf with fewer hosts than ports gets uplinks for what is attached, so oversub holds."""
    info = describe(parse_spec(f"{kind}:hosts=4,gpus=4,nic_gbps=400,oversub=2,leaf_radix=16"))
    tiers = info.links_per_tier
    assert tiers["leaf-spine"].gbps == pytest.approx(tiers["nic-leaf"].gbps / 2)


@pytest.mark.parametrize("text, field", [
    ("rail-optimized:oversub=0.5", "oversub"),
    ("rail-optimized:gpus=zero", "gpus"),
    ("rail-optimized:bogus=1", "bogus"),
    ("rail-optimized:routing=random", "routing"),
    ("rail-optimized:tiers=4", "tiers"),
    ("rail-optimized:hosts=0", "hosts"),
    ("no-such-preset", "preset"),
    ("fat-tree:nic_gbps=-1", "nic_gbps"),
    ("fat-tree:sharp=maybe", "sharp"),
])
def test_invalid_specs_name_the_field(text, field):
    with pytest.raises(TopologyError) as info:
        parse_spec(text)
    assert info.value.field == field
    assert repr(field) in str(info.value)
    assert isinstance(info.value, TracekitError)


def test_yaml_file(tmp_path):
    path = tmp_path / "net.yaml"
    path.write_text("preset: dgx-h100-superpod\nhosts: 4\noversub: 2\nrouting: spray\n")
    spec = parse_spec(str(path))
    assert (spec.hosts, spec.oversub, spec.routing, spec.name) == (4, 2.0, "spray", "net")
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts: [1, 2]\n")
    with pytest.raises(TopologyError, match="'hosts'"):
        parse_spec(str(bad))


def test_sized_from_run():
    spec = parse_spec("rail-optimized")
    assert sized(spec, hosts=4, gpus=8).hosts == 4
    small = parse_spec("rail-optimized:hosts=1")
    assert sized(small, hosts=3, gpus=8).hosts == 3
    assert sized(parse_spec("dgx-h100-superpod"), hosts=2, gpus=8).hosts == 32


def test_every_preset_builds_and_formats():
    for name in presets():
        spec = parse_spec(name)
        text = topology_description(describe(sized(spec, hosts=spec.hosts or 2)))
        assert "GPUs" in text and "bisection" in text


def test_impossible_specs_name_the_field():
    from tracekit.replay.topology import TopologyError, build, parse_spec

    with pytest.raises(TopologyError) as exc:
        parse_spec("fat-tree:gpus=8,leaf_radix=8")
    assert exc.value.field == "leaf_radix"
    with pytest.raises(TopologyError) as exc:
        build(parse_spec("rail-optimized:hosts=2,gpus=8,nvlink_domain=32"))
    assert exc.value.field == "nvlink_domain"


def test_physics_caps_are_reported_when_they_bind():
    from tracekit.replay.topology import parse_spec, physics_caps

    [cap] = physics_caps(parse_spec("rail-optimized:nic_gbps=800"))
    assert cap.kind == "physics_cap" and cap.data["field"] == "pcie_gbps"
    assert cap.text == "NIC 800 Gb/s is capped by PCIe 512 Gb/s; set pcie_gbps"
    assert physics_caps(parse_spec("rail-optimized:nic_gbps=400")) == []
    fields = [f.data["field"] for f in physics_caps(parse_spec("fat-tree:oversub=2,tiers=3,core_oversub=4"))]
    assert fields == ["oversub", "core_oversub"]


def test_placement_keeps_hosts_or_packs_and_says_how():
    from tracekit.replay.topology import parse_spec, place

    hosts = [list(range(8)), list(range(8, 16))]
    gmap, note = place(parse_spec("rail-optimized"), hosts)
    assert gmap == {r: r for r in range(16)} and note is None
    gmap, note = place(parse_spec("rail-optimized:gpus=16,nvlink_domain=16"), hosts)
    assert gmap[8] == 16 and "keep their 2 hosts" in note.text
    gmap, note = place(parse_spec("rail-optimized:gpus=4"), hosts)
    assert gmap == {r: r for r in range(16)} and "re-placed on 4 hosts of 4" in note.text
    _, note = place(parse_spec("rail-optimized:nvlink_domain=32"), hosts)
    assert "joins 4 hosts" in note.text


def test_the_description_reads_back_equal_and_keeps_its_key_order():
    from tracekit.replay.topology import TopologyDescription
    from tracekit.results import from_builtins, to_builtins

    for name in presets():
        spec = parse_spec(name)
        info = describe(sized(spec, hosts=spec.hosts or 2))
        doc = to_builtins(info)
        assert list(doc)[:4] == ["name", "kind", "hosts", "gpus"] and list(doc)[-3:] == ["profile", "frontend",
                                                                                         "storage"]
        assert from_builtins(doc, TopologyDescription) == info
