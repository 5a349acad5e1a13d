"""`python -m evaluation run|compare|sweep`: evaluate a model, compare runs, sweep checkpoints.

`run` writes into its output directory:
- `run_config.json`: the generation settings (fixed for the directory), the latest selection,
  and the run's provenance (`evaluation.provenance`: data and model hashes, versions, grader);
- `samples.jsonl`: one graded `SampleRecord` per line, appended and fsynced batch by batch;
- `summary.json` (metrics with bootstrap CIs, breakdowns, provenance), `report.md` and
  `breakdown.md` / `breakdown.csv` once every selected sample is present.
Rerunning the same command resumes: finished (benchmark, problem_id, sample_index) triples are
skipped, a torn last line is dropped, and settings that would change the samples are refused, as
are a changed benchmark file or changed model files.

`compare` reads finished runs (summary.json, samples.jsonl) and writes the table with CIs, the
paired comparison against the baseline, breakdowns side by side and the runs' provenance.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from evaluation.runner import RunOptions, compare, run, sweep
from infra.errors import UserError

logger = logging.getLogger("evaluation")


# ---- argument parsing -------------------------------------------------------------------------

def _add_options(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One flag per RunOptions field, typed from its default, help from its metadata."""
    for f in dataclasses.fields(RunOptions):
        if f.name in skip:
            continue
        flag, meta = "--" + f.name.replace("_", "-"), dict(f.metadata)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else (
            f.default if f.default is not dataclasses.MISSING else f.default_factory())
        if f.type == "bool":
            parser.add_argument(flag, action="store_true", help=meta["help"])
            continue
        kind = {"int": int, "float": float, "Path": Path}.get(
            f.type.split(" |")[0], str)
        suffix = "" if required else f" (default: {default})"
        parser.add_argument(flag, type=kind, required=required, default=default,
                            choices=meta.get("choices"), help=meta["help"] + suffix,
                            metavar=None if meta.get("choices") else f.name.upper())


def build_parser() -> argparse.ArgumentParser:
    """The `python -m evaluation` parser with its three subcommands."""
    parser = argparse.ArgumentParser(prog="python -m evaluation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="evaluate one model on benchmarks (resumable)",
                           description="Generate, grade and summarise; rerun to resume.")
    _add_options(p_run)
    p_cmp = sub.add_parser("compare", help="compare finished runs against a baseline",
                           description="compare.md + CSVs + plots: accuracy per benchmark, "
                           "five-benchmark average, mean tokens and AES vs the baseline, each "
                           "with a 95% bootstrap CI; each run's paired difference from the "
                           "baseline (matched by problem id, with its CI, an exact McNemar / "
                           "sign test and the problems that flipped); across-seed spread for "
                           "runs named <condition>_seed<N>; breakdowns side by side; and the "
                           "runs' provenance, with a warning when they differ in more than "
                           "the model.")
    p_cmp.add_argument("--baseline", required=True, metavar="DIR",
                       help="finished run directory that AES is measured against (e.g. the base "
                       "model or the GRPO run)")
    p_cmp.add_argument("--runs", required=True, nargs="+", metavar="DIR",
                       help="finished run directories to compare")
    p_cmp.add_argument("--output", default="compare", metavar="DIR",
                       help="where compare.md, the CSVs and the PNG plots go (default: "
                       "./compare)")
    p_sweep = sub.add_parser("sweep", help="evaluate every checkpoint of a training run",
                             description="Evaluate each checkpoint subdirectory (config.json + "
                             "weights, ordered by the step number in its name) into its own "
                             "resumable output subdirectory, then plot accuracy and tokens "
                             "against training step. Takes every `run` option but --model.")
    p_sweep.add_argument("--checkpoints", required=True, metavar="DIR",
                         help="directory whose subdirectories are HF-format checkpoints, e.g. "
                         "OpenRLHF's global_step*_hf saves")
    _add_options(p_sweep, skip=("model",))
    return parser


def _run_options(args: argparse.Namespace, **override) -> RunOptions:
    names = [f.name for f in dataclasses.fields(RunOptions)]
    return RunOptions(**{**{n: getattr(args, n) for n in names if hasattr(args, n)}, **override})


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 for a usage error, with a message)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logger.setLevel(logging.INFO)  # this package's progress notes, without everyone else's
    try:
        if args.command == "run":
            run(_run_options(args))
        elif args.command == "compare":
            compare(args.baseline, args.runs, args.output)
        else:
            sweep(args.checkpoints, _run_options(args, model="<sweep>"))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to resume", file=sys.stderr)
        return 130
    return 0
