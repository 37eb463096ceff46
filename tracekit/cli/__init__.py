"""The `tracekit` command line: a thin layer over the library, one module per command."""

from __future__ import annotations

import importlib

import click

from tracekit import __version__

# command name -> "module:attribute"; modules are imported only when their command runs.
COMMANDS: dict[str, str] = {
    "ingest": "tracekit.cli.ingest:ingest",
    "info": "tracekit.cli.info:info",
    "analyze": "tracekit.cli.analyze:analyze",
    "hang": "tracekit.cli.hang:hang",
    "replay": "tracekit.cli.replay:replay",
    "report": "tracekit.cli.report:report",
    "topology": "tracekit.cli.topology:topology",
    "synth": "tracekit.cli.synth:synth",
    "whatif": "tracekit.cli.whatif:whatif",
    "export": "tracekit.cli.export:export",
    "diff": "tracekit.cli.diff:diff",
}

# command name -> the first paragraph of its help, which is all `tracekit --help` shows of it: listing
# the commands from here imports none of their modules (tests/core/test_cli_commands.py keeps it current).
SUMMARIES: dict[str, str] = {
    "analyze": "Match collectives, align clocks, classify dims, and report root causes, stragglers, EP and PP.",
    "diff": "Compare run B against run A: the step-time change split into parts that add up (compute, communication "
            "per dim, idle), the collective buckets whose speed changed beyond each run's own step-to-step "
            "variation, the ranks and hosts behind it, and what differs in the setup.",
    "export": "Export RUN as one trace: a process per rank, a thread per lane, collectives linked by arrows, stalls "
              "as slices, and replayed timelines as extra processes. RUN|PATH is a run directory, or a trace file "
              "or folder, ingested first into the run `tracekit replay` keeps for it (with the timelines a replay "
              "stored there).",
    "hang": "Say why a job hung: per process group, the last seq each rank reached, the first seq where the ranks "
            "diverge, the ranks that never issued it, and op/dtype/size mismatches.",
    "info": "Ranks, hosts, groups, steps, time span, formats and per-source counts of RUN.",
    "ingest": "Ingest trace files, directories and globs (format detected by content) into OUT.",
    "replay": "Replay the communication of RUN (a run directory, or raw trace paths) on each --topology and compare "
              "step time, exposed communication per dim and the hottest link with the baseline.",
    "report": "Write one standalone HTML report (summary, timeline, overlap, EP, links, replay, hang).",
    "synth": "Make a synthetic DP x PP x EP run (with clock skew, a straggler and EP skew) and its truth.json.",
    "topology": "Describe a topology SPEC (a preset string such as `rail-optimized:hosts=16,oversub=2`, or a YAML "
                "file): GPUs, links per tier, bisection bandwidth and oversubscription per tier.",
    "whatif": "Replay RUN (a run directory or raw traces) changed by each SCENARIO and compare step time, exposed "
              "communication per dim, EP load and inter-host bytes with the baseline replay of the unchanged run "
              "on the same topology (model vs model, never vs the trace).",
}


class LazyGroup(click.Group):
    """A click group that imports each command's module on first use (keeps `--help` fast)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from SUMMARIES, worded and cut exactly as click would from each command's help."""
        stand_ins = {name: click.Command(name, help=SUMMARIES[name]) for name in COMMANDS}
        click.Group.format_commands(click.Group(commands={**stand_ins, **self.commands}), ctx, formatter)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracekit")
def main() -> None:
    """Postmortem analysis of the network side of distributed training."""
    from tracekit import _progress

    short_lived_gc()
    _progress.enable()


#: The cyclic collector's thresholds for one command (Python's default is 700, 10, 10).
GC_THRESHOLDS = (20_000, 20, 100)
_gc_set = False


def short_lived_gc() -> None:
    """Tune the cyclic garbage collector for a process that runs one command and exits: collect
    young objects less often, and freeze the heap at exit so that Python's shutdown does not walk
    it. The heap is mostly imported modules, Bokeh models and numba types, hundreds of thousands of
    long-lived objects that each default full collection scans again: the main job spent 0.5 s of
    CPU collecting while it ran and 0.4-0.9 s more at shutdown (benchmarks/bench_startup.py)."""
    global _gc_set
    if _gc_set:
        return
    import atexit
    import gc

    _gc_set = True
    gc.set_threshold(*GC_THRESHOLDS)
    atexit.register(gc.freeze)
