"""Every parser on structurally mutated real and sample files: a clean one-line error or a
salvage, never a crash, a hang, a broken count or a time out of range (issue 14)."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import fuzzing
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracekit.parsers import registry

EXAMPLES = fuzzing.env_int("TRACEKIT_FUZZ_EXAMPLES", 200)
MODULES = fuzzing.parsers()
#: the short CI profile keeps cases small (benchmarks/fuzz.py goes up to fuzzing.MAX_CASE)
fuzzing.MAX_CASE = 256 << 10


@pytest.mark.parametrize("fmt", sorted(registry.MODULES))
def test_every_parser_has_seeds(repo_seeds, fmt: str) -> None:
    """Seeds from the repository alone (a clone without ../shared fuzzes every parser too)."""
    assert repo_seeds[fmt], f"no seed for {fmt}: add a file to sample_traces or a built-in seed in fuzzing.py"


@pytest.mark.parametrize("fmt", sorted(registry.MODULES))
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(pick=st.integers(0, 10**6), rnd_seed=st.integers(0, 2**32 - 1))
def test_mutated_inputs_never_crash(tmp_path_factory, fmt: str, pick: int, rnd_seed: int) -> None:
    pool = fuzzing.cached_seeds()[fmt]
    seed = pool[pick % len(pool)]
    case, gz = fuzzing.make_case(seed, random.Random(rnd_seed))
    work = tmp_path_factory.getbasetemp() / f"fuzz-{fmt}"
    out = fuzzing.run_case(fmt, MODULES[fmt], case, gz, work, timeout=60, name=seed.name)
    assert out.kind in ("ok", "salvage", "error"), f"{out.signature}\n{out.detail}"


@pytest.mark.parametrize("fmt", sorted(registry.MODULES))
def test_cli_on_mutated_inputs(seeds, tmp_path: Path, fmt: str) -> None:
    """A few cases per parser through `tracekit ingest` and `tracekit info`: exit codes and
    one-line errors only."""
    rnd = random.Random(f"cli:{fmt}")
    for i in range(3):
        seed = rnd.choice(seeds[fmt])
        case, gz = fuzzing.make_case(seed, rnd)
        out = fuzzing.run_cli(case, gz, tmp_path / str(i), name=seed.name)
        assert out.kind == "ok", f"{out.signature}\n{out.detail}"


def test_mutators_cover_the_issue_list() -> None:
    """The mutators produce each class the issue names (a mutator that never fires tests nothing)."""
    import gzip
    import json

    seed = fuzzing.Seed("kineto", "x.json", json.dumps({"traceEvents": [{"ph": "X", "ts": 1, "a": [1, 2]}],
                                                        "k": "v", "n": 5}).encode(), True, "json")
    seen: set[str] = set()
    rnd = random.Random(0)
    for _ in range(3000):
        case, gz = fuzzing.make_case(seed, rnd)
        try:
            data = gzip.decompress(case) if gz else case
        except Exception:
            seen.add("gzip_corrupt")
            continue
        if data.startswith(b"\xef\xbb\xbf"):
            seen.add("bom")
        if b"NaN" in data or b"Infinity" in data:
            seen.add("nan_inf")
        if b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[" in data:
            seen.add("deep")
        if b"9223372036854775808" in data or b"18446744073709551616" in data:
            seen.add("huge")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            seen.add("invalid_utf8")
        try:
            doc = json.loads(data)
        except Exception:
            seen.add("truncated_or_corrupt")
            continue
        if not isinstance(doc, dict):
            seen.add("non_object_top")
        elif "k" not in doc or "n" not in doc:
            seen.add("deleted_key")
        elif isinstance(doc.get("n"), (str, list, dict, bool)) or doc.get("n") is None:
            seen.add("wrong_type")
    assert seen >= {"gzip_corrupt", "bom", "nan_inf", "deep", "huge", "invalid_utf8", "truncated_or_corrupt",
                    "non_object_top", "deleted_key", "wrong_type"}, seen


def test_mutators_stay_near_the_case_limit() -> None:
    """A line repeated 2,000 times, then 100 times, once built gigabytes before the cut to
    MAX_CASE: the campaign's peak RSS was the mutator's (ibnetdiscover's 1,063 MiB)."""
    line = b"x" * (64 << 10)
    data = b"\n".join([b"head", line, b"tail"])
    rnd = random.Random(3)
    for _ in range(300):
        out = fuzzing.mutate_lines(data, rnd)
        assert len(out) <= 2 * fuzzing.MAX_CASE
    tree = [{"k": "v" * (64 << 10)}] * 3
    for _ in range(300):
        enc = fuzzing._json_encode(fuzzing.mutate_tree(list(tree), rnd, max_copies=fuzzing._copies(200, 3 << 16)))
        assert len(enc) <= 2 * fuzzing.MAX_CASE


CLASS_EXAMPLES = fuzzing.env_int("TRACEKIT_FUZZ_CLASS_EXAMPLES", 12)


@pytest.mark.parametrize("cls", sorted(fuzzing.CLASSES))
def test_every_hostile_class_applies_to_some_parser(repo_seeds, cls: str) -> None:
    """Each class mutator of issue 22 makes cases from the repository's own seeds (one that never
    applies would test nothing)."""
    rnd = random.Random(cls)
    made = [fmt for fmt, pool in repo_seeds.items()
            if fuzzing.make_class_case(pool, rnd, [cls], tries=40) is not None]
    assert made, f"{cls} applies to no seed"


@pytest.mark.parametrize("fmt", sorted(registry.MODULES))
def test_hostile_class_cases_never_fail(tmp_path_factory, fmt: str) -> None:
    """A few cases of every applicable class per parser, with each class's own oracle (both
    arrays of a duplicated key read, an over-long line counted) on top of the usual ones."""
    pool = fuzzing.cached_seeds()[fmt]
    reads: dict[str, int] = {}
    work = tmp_path_factory.getbasetemp() / f"fuzz-class-{fmt}"
    rnd = random.Random(f"class:{fmt}")
    for _ in range(CLASS_EXAMPLES):
        picked = fuzzing.make_class_case(pool, rnd)
        if picked is None:
            continue
        cls, seed, case = picked
        if seed.name not in reads:
            raw = gzip.compress(seed.data, mtime=0) if seed.gz else seed.data
            fuzzing.run_case(fmt, MODULES[fmt], raw, seed.gz, work, timeout=60, name=seed.name,
                             on_stats=lambda d, n=seed.name: reads.__setitem__(n, d["stats"].read))
        out = fuzzing.run_class_case(fmt, MODULES[fmt], case, work, timeout=60, name=seed.name,
                                     seed_read=reads.get(seed.name))
        assert out.kind in ("ok", "salvage", "error"), f"{cls}: {out.signature}\n{out.detail}"


def test_received_run_attacks_write_nothing_outside(tmp_path: Path) -> None:
    """Links planted at random entries of a run, then a random command (issue 22)."""
    from tracekit.ingest import ingest

    traces = sorted(str(p) for p in (fuzzing.SAMPLES / "gloo_moe_8rank").glob("rank[0-1]*.json.gz"))
    base = tmp_path / "base"
    ingest(traces, base, jobs=1)
    rnd = random.Random("runs")
    for i in range(fuzzing.env_int("TRACEKIT_FUZZ_RUN_EXAMPLES", 4)):
        out = fuzzing.run_run_case(base, traces, tmp_path / f"w{i}", rnd)
        assert out.kind in ("ok", "error"), f"{out.signature}\n{out.detail}"


def test_text_output_check_finds_a_name_that_starts_a_line() -> None:
    assert fuzzing.check_text_output("hosts 1: node\\x0aINJECTED line") is None
    assert fuzzing.check_text_output("hosts 1: node\nINJECTED line") is not None
    assert fuzzing.check_text_output("group \x1b[2J") is not None


def test_nvtx_payload_class_oracle_sees_a_repeated_key(repo_seeds, tmp_path: Path) -> None:
    """The nvtx_payload class's repeat cases are read by nsys and warned (its oracle passes)."""
    rnd = random.Random("nvtx")
    seeds = [s for s in repo_seeds["nsys"] if s.encoding == "sqlite"]
    cases = [c for c in (fuzzing.CLASSES["nvtx_payload"](rnd.choice(seeds), rnd) for _ in range(40))
             if c is not None and c.expect is not None]
    assert cases
    out = fuzzing.run_class_case("nsys", MODULES["nsys"], cases[0], tmp_path, timeout=120, name="x.sqlite")
    assert out.kind in ("ok", "salvage"), out


def test_plant_links_never_replaces_a_directory_around_a_planted_link(tmp_path: Path) -> None:
    """A link planted at a file, then the directory holding it picked: skipped (copying the
    directory met the dangling link and killed the received_run campaign)."""
    run, outside = tmp_path / "run", tmp_path / "outside"
    (run / "events" / "rank=1").mkdir(parents=True)
    (run / "events" / "rank=1" / "k.parquet").write_bytes(b"x")
    outside.mkdir()

    picks = [run / "events" / "rank=1" / "k.parquet", run / "events" / "rank=1"]

    class Scripted(random.Random):
        def choice(self, seq):  # type: ignore[override]
            return picks.pop(0)

        def random(self) -> float:
            return 0.9  # a dangling link

    assert fuzzing.plant_links(run, outside, Scripted(), 2) == ["events/rank=1/k.parquet"]


@pytest.mark.parametrize("fmt", ["nccl_profiler", "nccl_inspector", "link_map", "gnmic", "flight_recorder",
                                 "nccl_tests"])
def test_inner_keys_applies_to_each_reader_that_counts_repeats(repo_seeds, fmt: str) -> None:
    """inner_keys makes cases for every reader that warns of a repeated key (a filter that left a
    reader no pair to repeat would silently stop testing it)."""
    rnd = random.Random(fmt)
    assert fuzzing.make_class_case(repo_seeds[fmt], rnd, ["inner_keys"], tries=40) is not None


def test_inner_keys_on_kineto_checks_the_count(repo_seeds) -> None:
    """Kineto events are read with a repeated key's last value but not warned (a known gap,
    test_duplicate_keys.py): its inner_keys cases must read as many events as the seed."""
    from types import SimpleNamespace

    picked = fuzzing.make_class_case(repo_seeds["kineto"], random.Random("kineto"), ["inner_keys"], tries=40)
    assert picked is not None
    _, _, case = picked
    assert case.expect(SimpleNamespace(read=10, warnings=[]), 10) is None
    assert case.expect(SimpleNamespace(read=9, warnings=["1 object with keys given more than once"]), 10)
