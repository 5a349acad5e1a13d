"""The rehearsal's command line: `python -m openrlhf_replay.rehearsal [settings] -- <training command>`
(its help is the package docstring); it prints the report's table and, last, the report as JSON."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import openrlhf_replay.rehearsal as package
from openrlhf_replay.cli.validate import Invalid
from openrlhf_replay.rehearsal.driver import rehearse
from openrlhf_replay.rehearsal.report import TABLE_HEADER, markdown, table_row
from openrlhf_replay.rehearsal.standins import Settings
from replay.config import field_help


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openrlhf_replay.rehearsal", description=package.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in vars(Settings()).items():
        if name == "shape":
            parser.add_argument("--shape", action="append", default=[], metavar="FLAGS", help=_field_doc(name))
            continue
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default,
                            help=_field_doc(name))
    parser.add_argument("--report", type=Path, metavar="PATH",
                        help="also write the JSON report to PATH (its folder is created); "
                        "`python -m openrlhf_replay.rehearsal.report` reads such files")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the training command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: pass -- python -m <launcher> <arguments>")
    try:
        settings = Settings(**{k: tuple(v) if k == "shape" else v for k, v in vars(args).items()
                               if k not in ("command", "report")})
        report = rehearse(command, settings, log=lambda text: print(text, file=sys.stderr, flush=True))
    except (Invalid, ValueError) as e:
        print(f"rehearse: {e}", file=sys.stderr)
        return 2
    if "replayed_per_step" in report:  # a run refused before its start has no figures to tabulate
        print(markdown(TABLE_HEADER, [table_row("this run", report)]), file=sys.stderr)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(report) + "\n", encoding="utf-8")
    print(json.dumps(report))
    ok = all(s["crash"] is None for s in report.get("shapes", [report]))
    return 0 if ok and completed(report) else 1


def completed(report: dict) -> bool:
    """Every step walked, and none twice: as many episodes as asked for, every prompt of each
    generated once (the plan, dynamic filtering's replacement prompts included) or skipped or
    deferred by pre-rollout skipping, and as many steps as the prompts make where that is known in
    advance (not under dynamic filtering or skipping). Skipping's last deferred tail, shorter than
    a batch, is drawn after the run's last step and never logged (docs/METHOD.md section 11)."""
    accounted = report["prompts_generated"] + report.get("prompts_skipped", 0) + report.get("prompts_deferred", 0)
    unlogged_tail = report["prompts_planned"] - accounted
    tail_allowed = report.get("batch_prompts", 1) if report.get("prompts_skipped", 0) else 1
    return (report["steps_completed"] > 0 and report["episodes_completed"] == report["episodes_expected"]
            and 0 <= unlogged_tail < tail_allowed
            and report["steps_expected"] in (None, report["steps_completed"]))


def _field_doc(name: str) -> str:
    return field_help(Settings)[name].replace("%", "%%")

