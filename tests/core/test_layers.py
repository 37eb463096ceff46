"""The layers of docs/architecture.md, checked on the code: an import walk (ast) over the package.

A stage (analysis, replay, hang, what-if, export, telemetry, the report) reads a run through the
store's public API and never imports ingest, the front door or the CLI; no module imports another
stage's (or the store's) private names, and no module imports a private name of a parser module
(shared vocabulary lives in `tracekit.parsers.vocabulary`); only the front door (`tracekit.workflows`) writes
RUN/results/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
#: installed package -> folder (pyproject's package-dir)
FOLDERS = {"tracekit": ROOT / "tracekit", "tracekit.parsers": ROOT / "parsers", "tracekit.viz": ROOT / "viz"}
STAGES = ("tracekit.analysis", "tracekit.replay", "tracekit.hang", "tracekit.whatif", "tracekit.export",
          "tracekit.telemetry", "tracekit.viz", "tracekit.microbench", "tracekit.diff")
#: what a stage must not import: ingest (raw traces -> a run), the front door and the commands
ABOVE_OR_INGEST = ("tracekit.ingest", "tracekit.parsers", "tracekit.synth", "tracekit.workflows", "tracekit.cli")
FRONT_DOOR = "tracekit.workflows"
PARSERS = "tracekit.parsers"
#: the bottom layer: it imports nothing but itself
CORE = tuple(f"tracekit.{m}" for m in ("store", "schema", "results", "finding", "errors", "atomic", "manifest",
                                       "executors", "validity", "nccl_fabric", "_text", "_progress", "_jit",
                                       "_private_dir", "_limits", "_yaml"))
#: calls that write RUN/results/ (the store's own methods are where they are defined)
RESULT_WRITERS = ("write_json", "claim_results")
#: the run directory's layout, which only the store (and ingest, which lays it out) spells out
LAYOUT = ("sources", "events", "results", "rank=")
#: who else may spell out the layout or write results, and why
EXCEPTIONS = {
    # ingest lays the run out, and commits results/telemetry.json (the counters' rates) with the data
    # it was computed from, removing the results of an older generation
    "tracekit.ingest": {"layout", "results"},
    "tracekit.ingest.plan": {"layout"},
    "tracekit.ingest.parse": {"layout"},
    "tracekit.ingest.merge": {"layout"},
    "tracekit.store": {"layout", "results", "private"},
    # the counters' rating runs inside ingest (`ingest.merge.rate_telemetry`) and shares the parsers' port
    # names; issue 19 item 5's shared-vocabulary module is where `normal_port` belongs
    "tracekit.telemetry": {"ingest"},
}


def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            if package == "tracekit" and parts and parts[0] in ("parsers", "viz"):
                continue
            out[name] = path
    return out


def _within(name: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def stage_of(name: str) -> str | None:
    return next((s for s in STAGES if _within(name, s)), None)


def imports(tree: ast.AST, module: str) -> list[tuple[int, str, str | None]]:
    """(line, imported module, imported name or None) for every import, type-only ones included."""
    out: list[tuple[int, str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".")[: -node.level] if not module.endswith("__init__") else module.split(".")
                base = ".".join([*pkg, base]) if base else ".".join(pkg)
            for a in node.names:
                out.append((node.lineno, base, a.name))
    return out


def _is_private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def violations(mods: dict[str, Path] | None = None, root: Path = ROOT) -> list[str]:
    mods = modules() if mods is None else mods
    found: list[str] = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        allowed = EXCEPTIONS.get(name, set())
        where = path.relative_to(root)
        mine = stage_of(name)
        for line, target, imported in imports(tree, name):
            full = f"{target}.{imported}" if imported else target
            if not _within(full, "tracekit"):
                continue
            if mine is not None and _within(full, ABOVE_OR_INGEST) and not (
                    "ingest" in allowed and _within(full, "tracekit.parsers")):
                found.append(f"{where}:{line}: the {mine} stage imports {full} (ingest, the front door or the CLI)")
            if _within(name, CORE) and not _within(full, CORE) and full != "tracekit.__version__":
                found.append(f"{where}:{line}: the core module {name} imports {full}, a layer above it")
            other = stage_of(target)
            private = [p for p in full.split(".")[1:] if _is_private(p)]
            if private and "private" not in allowed:
                owner = other or ("tracekit.store" if _within(target, "tracekit.store") else None)
                if owner is not None and owner != mine:
                    found.append(f"{where}:{line}: imports {full}, a private name of {owner}")
        found.extend(f"{where}:{line}: {what}" for line, what in _parser_privates(tree, name))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                fn = node.func
                called = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                saves_result = called == "save" and node.args and _text(node.args[0]).startswith("results/")
                if (called in RESULT_WRITERS or saves_result) and name != FRONT_DOOR and "results" not in allowed:
                    found.append(f"{where}:{node.lineno}: writes RUN/results/ ({called}); only {FRONT_DOOR} does")
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and "layout" not in allowed:
                for side in (node.left, node.right):
                    text = _text(side)
                    if any(text == p or text.startswith(p + "/") or (text.startswith(p) and p.endswith("="))
                           for p in LAYOUT):
                        found.append(f"{where}:{node.lineno}: spells out the run directory's layout ({text!r}); "
                                     "use the store's Run methods")
    return found


def _parser_privates(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """(line, what) for each private name of another parser module that `module` imports or reads
    as an attribute of an imported parser module (private helper modules such as `_stream` are
    shared: importing one is fine, taking its private names is not)."""
    every = modules()
    out: list[tuple[int, str]] = []
    aliases: dict[str, str] = {}
    renamed: dict[tuple[int, str], str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for a in node.names:
                if a.asname and isinstance(node, ast.Import) and _within(a.name, PARSERS):
                    aliases[a.asname] = a.name
                elif a.asname:
                    renamed[(node.lineno, a.name)] = a.asname
    for line, target, imported in imports(tree, module):
        if not _within(target, PARSERS) or target == module:
            continue
        full = f"{target}.{imported}" if imported else target
        if imported and full in every:
            aliases[renamed.get((line, imported), imported)] = full
        elif imported and _is_private(imported):
            out.append((line, f"imports {full}, a private name of the parser module {target}"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _is_private(node.attr)
                and node.value.id in aliases and aliases[node.value.id] != module):
            owner = aliases[node.value.id]
            out.append((node.lineno, f"uses {owner}.{node.attr}, a private name of the parser module {owner}"))
    return out


def _text(node: ast.AST) -> str:
    """A string constant, or the constant start of an f-string ("" for anything else)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return ""


def test_the_package_keeps_its_layers():
    assert violations() == []


def test_the_walk_sees_every_package():
    names = modules()
    assert {"tracekit.workflows", "tracekit.parsers.kineto", "tracekit.viz.report", "tracekit.replay.engine",
            "tracekit.cli.replay"} <= set(names)


@pytest.mark.parametrize(("module", "source", "says"), [
    ("tracekit.replay.fake", "from tracekit.ingest import open_run\n", "imports tracekit.ingest.open_run"),
    ("tracekit.viz.fake", "def f():\n    from tracekit import workflows\n", "imports tracekit.workflows"),
    ("tracekit.export", "from tracekit.analysis._frames import frame\n", "private name of tracekit.analysis"),
    ("tracekit.hang", "from tracekit.store import _read\n", "private name of tracekit.store"),
    ("tracekit.analysis.core", "def f(run):\n    run.write_json('analysis', {})\n", "writes RUN/results/"),
    ("tracekit.export", "def f(run, w):\n    run.save(f'results/{x}', w)\n", "writes RUN/results/"),
    ("tracekit.hang", "def f(run, k):\n    return run.path / 'sources' / k\n", "layout ('sources')"),
    ("tracekit.export", "def f(p):\n    return p / f'rank={3}'\n", "layout ('rank=')"),
    ("tracekit.store", "from tracekit.replay import replay\n", "the core module tracekit.store imports"),
    ("tracekit.parsers.nsys", "from tracekit.parsers.kineto import _Pass1\n", "private name of the parser module"),
    ("tracekit.parsers.nsys", "from tracekit.parsers import kineto\nx = kineto._pass2\n",
     "uses tracekit.parsers.kineto._pass2"),
    ("tracekit.ingest", "def f():\n    from tracekit.parsers.telemetry import _common as c\n    return c._x\n",
     "a private name of the parser module tracekit.parsers.telemetry._common"),
])
def test_each_rule_catches_its_breach(tmp_path, module, source, says):
    path = tmp_path / "fake.py"
    path.write_text(source)
    found = violations({module: path}, tmp_path)
    assert len(found) == 1 and says in found[0], found


def test_the_front_door_may_write_results(tmp_path):
    path = tmp_path / "fake.py"
    path.write_text("def f(run):\n    run.write_json('replay', {})\n")
    assert violations({"tracekit.workflows": path}, tmp_path) == []


def _type_only_lines(tree: ast.AST) -> set[int]:
    """The lines inside `if TYPE_CHECKING:` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _text(node.test) == "" and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for child in node.body:
                out.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return out


def test_the_analysis_takes_the_hang_verdict_and_never_computes_it():
    """Issue 19: the front door computes the hang verdict and hands it to the analysis; the
    analysis names `HangResult` for its type only."""
    found = []
    for name, path in modules().items():
        if not _within(name, "tracekit.analysis"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        typed = _type_only_lines(tree)
        found += [f"{name}:{line}: imports {target}" for line, target, imported in imports(tree, name)
                  if _within(f"{target}.{imported}" if imported else target, "tracekit.hang") and line not in typed]
    assert found == []
