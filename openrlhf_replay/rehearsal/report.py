"""What the rehearsal's reports say about replay and compute, as JSON figures and as tables. The
driver adds a run's figures up here (`run_report`, `shape_report`, from its record of each step).

`python -m openrlhf_replay.rehearsal.report table REPORT.json ...` prints the rehearsal
table of docs/GPU_RUNS.md, one row per report (named after the file).

`python -m openrlhf_replay.rehearsal.report beside --compare DIR --rehearsals DIR` puts each
compared run's optimizer steps per rollout step (from `<rehearsals>/<run>.json`, the report
`REHEARSE=1` writes for that run) beside its results (from `<compare>/compare.csv`): written as
compare_steps.md and compare_steps.csv, and appended to compare.md. Equal rollout steps are not
equal compute: replay trains on more rows per step than GRPO, so each condition's results are
read beside its optimizer steps.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from collections import Counter
from pathlib import Path

from openrlhf_replay.utils import world_size
from replay import ReplayConfig


def spread(values: list[float]) -> dict:
    """min / median / max of `values` (all None when empty)."""
    if not values:
        return {"min": None, "median": None, "max": None}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def off_policy(config) -> str | None:
    """How a run treats replayed rows' pi_old (`--replay.off_policy` as the run resolves it), or
    None when it replays nothing."""
    return config.effective_off_policy if config.enabled else None


def replay_distribution(steps: list[dict], after_warmup: list[dict]) -> dict:
    """Replayed rollouts per step: their spread and histogram over the steps after the warm-up;
    `counts` and `candidates` list every rollout step from step 1 (the warm-up's zeros included).
    `candidates`: the stored rollouts the step's draw could choose from (RLEP: the stored successes
    of the step's prompts; 0 when the step did not draw). `when_pool_has_candidates`: of the steps
    after the warm-up whose draw had at least one candidate, how many replayed."""
    counts = [s["replayed"] for s in after_warmup]
    able = [s for s in after_warmup if s["candidates"] >= 1]
    replayed_when_able = sum(1 for s in able if s["replayed"])
    return spread(counts) | {
        "steps_with_replay": sum(1 for c in counts if c),
        "steps_after_warmup": len(counts),
        "share_with_replay": _share(sum(1 for c in counts if c), len(counts)),
        "histogram": {str(c): n for c, n in sorted(Counter(counts).items())},
        "when_pool_has_candidates": {"steps": len(able), "steps_with_replay": replayed_when_able,
                                     "share": _share(replayed_when_able, len(able))},
        "counts": [s["replayed"] for s in steps],
        "candidates": [s["candidates"] for s in steps],
    }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


# ------------------------------------------------------------------------------ a run's figures


def step_figures(status: dict, ranks: list) -> dict:
    """One step's figures, from the controller's status and what each stand-in rank trained."""
    per_rank = [r.steps[-1] for r in ranks]
    return {
        "fresh": int(status.get("rollout/num_samples", 0)),
        "replayed": int(status.get("replay/replayed", 0)),
        # Dynamic filtering: rollouts generated (the filtered ones included), filtered, refilled by replay.
        "generated": int(status.get("replay/generated_rollouts", status.get("rollout/num_samples", 0))),
        "filtered": int(status.get("replay/filtered_rollouts", 0)),
        "refilled": int(status.get("replay/refilled_rows", 0)), "inert": int(status.get("replay/inert_rows", 0)),
        # --replay.skip: prompts not generated, skipped by its rule or deferred at a pass's short tail
        "skipped": int(status.get("replay/skip_skipped_prompts", 0)),
        "deferred": int(status.get("replay/skip_deferred_prompts", 0)),
        "age_mean": status.get("replay/age_mean"), "age_max": status.get("replay/age_max"),
        # What the step's draw could choose from (RLEP: stored successes of the step's prompts).
        "candidates": int(status.get("replay/candidates", 0)),
        "buffer": status.get("replay/size"), "buffer_bytes": status.get("replay/nbytes"),
        "ranks": {k: [r[k] for r in per_rank] for k in per_rank[0]},
    }


def warmup_steps(args, max_steps: int) -> int:
    """The LR warm-up's optimizer steps, as upstream's strategy sizes it."""
    return math.ceil(max_steps * args.actor.lr_warmup_ratio)


def shape_report(args, flags: str, ranks: list, crash, crash_step, steps: int) -> dict:
    """One shape's figures: crash, and per rank what it trained (these must be equal over ranks)."""
    out = {"flags": flags, "crash": crash, "crash_step": crash_step, "steps_completed": steps}
    if args is None or not ranks:
        return out
    return out | {
        "gpus": world_size(args), "model": args.actor.model_name_or_path,
        "micro_batches": [args.train.micro_batch_size, args.rollout.micro_batch_size],
        "optimizer_steps_per_rank": [sum(s["optimizer_steps"] for s in r.steps) for r in ranks],
        "micro_batches_per_rank": {kind: [sum(s[f"{kind}_micro_batches"] for s in r.steps) for r in ranks]
                                   for kind in ("fresh", "replayed")},
        "rows_dropped_per_rank": [sum(s["dropped_rows"] for s in r.steps) for r in ranks],
        "micro_batches_carried_at_end": [r.pending for r in ranks],
    }


def run_report(args, replay, record, ranks: list, max_steps: int, prompts_per_episode: int,
               seconds: float) -> dict:
    """The figures of a whole run, from the driver's `Record` of it and its stand-in ranks."""
    steps = record.steps
    # The buffer's step (one less than the logged step) at or past the warm-up.
    after_warmup = [s for s in steps if s["step"] > replay.effective_warmup] if replay.enabled else []
    per_step_opt = [sum(s["ranks"]["optimizer_steps"]) / max(len(ranks), 1) for s in steps]
    ages = [s["age_max"] for s in after_warmup if s["replayed"]]
    age_means = [s["age_mean"] for s in after_warmup if s["replayed"]]
    return {
        # Dynamic filtering spends replacement prompts, pre-rollout skipping skips some: a step's count
        # per episode is what they keep.
        "steps_expected": None if args.algo.dynamic_filtering_enable or ReplayConfig.from_namespace(args).skip
        else math.ceil(prompts_per_episode / args.rollout.batch_size) * args.train.num_episodes,
        "steps_completed": len(steps),
        "episodes_expected": args.train.num_episodes,
        "episodes_completed": record.episodes_done,
        # Each episode generates every prompt once (a resume that walked an episode again, more).
        "prompts_planned": prompts_per_episode * args.train.num_episodes, "batch_prompts": args.rollout.batch_size,
        "prompts_generated": record.prompts_generated,
        "steps_per_episode": [sum(1 for s in steps if s["episode"] == e) for e in range(record.episode + 1)],
        "crash": record.crash,
        "crash_step": record.crash_step,
        "shape": {"ranks": len(ranks), "train_micro_batch": args.train.micro_batch_size,
                  "rollout_micro_batch": args.rollout.micro_batch_size,
                  "accumulation": ranks[0].accumulation if ranks else None},
        "fresh_per_step": spread([s["fresh"] for s in steps]),
        "rollouts_generated": sum(s["generated"] for s in steps),
        "rollouts_generated_by_engines": sum(g.generated for g in record.generations),  # the stand-in vLLM's own count
        "rollouts_filtered": sum(s["filtered"] for s in steps),
        "rows_refilled": sum(s["refilled"] for s in steps),
        "prompts_skipped": sum(s["skipped"] for s in steps), "prompts_deferred": sum(s["deferred"] for s in steps),
        "replayed_per_step": replay_distribution(steps, after_warmup),
        "optimizer_steps_per_step": spread(per_step_opt) | {
            "mean": statistics.fmean(per_step_opt) if per_step_opt else None},
        "optimizer_steps_per_rank": [sum(r.steps[i]["optimizer_steps"] for i in range(len(r.steps))) for r in ranks],
        "micro_batches_per_rank": {kind: [sum(s[f"{kind}_micro_batches"] for s in r.steps) for r in ranks]
                                   for kind in ("fresh", "replayed")},
        "rows_dropped_per_rank": [sum(s["dropped_rows"] for s in r.steps) for r in ranks],
        "micro_batches_carried_at_end": [r.pending for r in ranks],
        **_lr_figures(args, ranks, max_steps),
        "replay_age": {"max": max(ages) if ages else None, "mean": statistics.fmean(age_means) if ages else None},
        "buffer_max_rollouts": max((s["buffer"] or 0 for s in steps), default=0),
        "checkpoints": record.checkpoints,
        "resumed_at": record.resumed_at,
        "seconds": round(seconds, 1),
    }


def _lr_figures(args, ranks: list, max_steps: int) -> dict:
    """The LR schedule as rank 0 walked it: its size, its warm-up in optimizer and rollout steps, the
    optimizer steps taken and the LR after the warm-up."""
    warmup_opt = warmup_steps(args, max_steps)
    positions, lrs = (ranks[0].lr_positions, ranks[0].lrs) if ranks else ([], [])
    taken = sum(s["optimizer_steps"] for s in ranks[0].steps) if ranks else 0
    return {
        "lr_schedule_optimizer_steps": max_steps,
        "lr_warmup_optimizer_steps": warmup_opt,
        "lr_warmup_rollout_steps": next((i + 1 for i, p in enumerate(positions) if p >= warmup_opt), None),
        "optimizer_steps_taken": taken,
        "lr_after_warmup": spread([lr for p, lr in lrs if p >= warmup_opt]) if ranks else None,
        # Where the schedule stands after the run (its end: lr_schedule_optimizer_steps), and the LR
        # and position the last optimizer step ran at (within one step of the end).
        "lr_schedule_position_at_end": positions[-1] if positions else None,
        "lr_last_optimizer_step": {"position": lrs[-1][0], "lr": lrs[-1][1]} if lrs else None,
    }


# ------------------------------------------------------------------------------ the rehearsal table

TABLE_HEADER = ("script", "steps (per episode)", "replayed rows' pi_old",
                "replayed per step after warm-up (min / median / max; steps with replay)",
                "steps with replay once the pool holds candidates (RLEP: successes of the step's prompts)",
                "optimizer steps per rollout step: mean (min / median / max)", "per rank, whole run",
                "LR warm-up (optimizer / rollout steps)", "replay age max", "buffer max", "shapes without a crash")


def _fraction(part: int, whole: int) -> str:
    return f"{part} of {whole}" + (f" ({100 * part / whole:.0f}%)" if whole else "")


def _number(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{int(value):,}" if float(value).is_integer() else f"{value:.{digits}f}"


def table_row(name: str, report: dict) -> list[str]:
    """One row of `TABLE_HEADER` for the report of `name` (a script or a run)."""
    replayed, opt = report["replayed_per_step"], report["optimizer_steps_per_step"]
    able = replayed.get("when_pool_has_candidates", {})
    per_rank = report["optimizer_steps_per_rank"]
    shapes = report.get("shapes", [report])
    replays = bool(replayed["steps_after_warmup"])
    return [
        f"`{name}.sh`" if name.startswith("train_") else name,
        f"{report['steps_completed']} of {report['steps_expected'] or 'as filtered'} "
        f"({', '.join(map(str, report['steps_per_episode']))})",
        report.get("off_policy") or "-",
        (f"{' / '.join(_number(replayed[k]) for k in ('min', 'median', 'max'))}; "
         f"{_fraction(replayed['steps_with_replay'], replayed['steps_after_warmup'])}") if replays else "-",
        _fraction(able["steps_with_replay"], able["steps"]) if replays and able else "-",
        f"{_number(opt.get('mean'))} ({' / '.join(_number(opt[k]) for k in ('min', 'median', 'max'))})",
        f"{_number(per_rank[0])} on each of {len(per_rank)}" if len(set(per_rank)) == 1 else
        " / ".join(map(_number, per_rank)),
        f"{report['lr_warmup_optimizer_steps']} / {report['lr_warmup_rollout_steps']}",
        _number(report["replay_age"]["max"]) if replays else "-",
        _number(report["buffer_max_rollouts"]),
        f"{sum(s['crash'] is None for s in shapes)} of {len(shapes)}",
    ]


def markdown(header, rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def table(paths: list[Path]) -> str:
    """The markdown table of the reports at `paths`, one row each, named after the file."""
    return markdown(TABLE_HEADER, [table_row(p.stem, _read(p)) for p in paths])


def _read(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SystemExit(f"rehearsal_report: {path} not found: rehearse the script first "
                         "(REHEARSE=1 bash examples/scripts/<script>.sh)") from None
    except json.JSONDecodeError as e:
        raise SystemExit(f"rehearsal_report: {path} is not a rehearsal report (JSON): {e}") from None


# ------------------------------------------------------------------------------ beside the results

BESIDE_NOTE = (
    "Each run's optimizer steps per rollout step, from its rehearsal (`REHEARSE=1` with the run's own "
    "settings writes `<rehearsals>/<run>.json`). Every condition generates the same rollouts per step; "
    "replay trains on more rows, so a condition's results are read beside its training steps. Fixed-ratio "
    "replay counts are exact; RLEP's count follows how often the model solves a prompt, so its figure "
    "holds at the rehearsal's stand-in solve rate, named in the last column.")
BESIDE_CSV = ("run", "avg", "avg_ci_lo", "avg_ci_hi", "tokens", "AES", "optimizer_steps_per_rollout_step",
              "optimizer_steps_min", "optimizer_steps_max", "replayed_per_step_median", "share_of_steps_replaying",
              "off_policy", "rehearsal_solve_rate", "rehearsal")


def beside(compare_dir: Path, rehearsals: Path) -> list[dict]:
    """One row per run of `compare_dir/compare.csv`: its average accuracy, tokens and AES with its
    rehearsal's optimizer steps and replay counts (empty where the run has no rehearsal)."""
    path = compare_dir / "compare.csv"
    if not path.is_file():
        raise SystemExit(f"rehearsal_report: {path} not found: run `python -m evaluation compare` first")
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        avg = header[header.index("tokens") - 1]  # "avg", or "avg(N)" over the benchmarks all runs share
        rows = [dict(zip(header, r)) for r in reader]
    out = []
    for row in rows:
        report_path = rehearsals / f"{row['run'].split('#')[0]}.json"
        report = _read(report_path) if report_path.is_file() else None
        out.append({"run": row["run"], "avg": row[avg], "avg_ci_lo": row.get(f"{avg}_ci_lo", ""),
                    "avg_ci_hi": row.get(f"{avg}_ci_hi", ""), "tokens": row["tokens"], "AES": row["AES"],
                    **_compute_columns(report), "rehearsal": str(report_path) if report else "",
                    "avg_name": avg})
    return out


def _compute_columns(report: dict | None) -> dict:
    if report is None:
        return {k: "" for k in BESIDE_CSV[6:13]}
    opt, replayed = report["optimizer_steps_per_step"], report["replayed_per_step"]
    return {"optimizer_steps_per_rollout_step": opt.get("mean"), "optimizer_steps_min": opt["min"],
            "optimizer_steps_max": opt["max"], "replayed_per_step_median": replayed["median"],
            "share_of_steps_replaying": replayed.get("share_with_replay"),
            "off_policy": report.get("off_policy") or "", "rehearsal_solve_rate": report.get("settings", {}).get(
                "solve_rate", "")}


def _beside_markdown(rows: list[dict]) -> str:
    avg = rows[0]["avg_name"] if rows else "avg"
    header = ("run", f"{avg} %", "tokens", "AES", "optimizer steps per rollout step: mean (min / max)",
              "replayed per step after warm-up: median; share of steps", "replayed rows' pi_old",
              "rehearsal solve rate")
    lines = []
    for r in rows:
        ci = f" [{r['avg_ci_lo']}, {r['avg_ci_hi']}]" if r["avg_ci_lo"] != "" else ""
        if r["rehearsal"]:
            steps = (f"{_number(r['optimizer_steps_per_rollout_step'])} "
                     f"({_number(r['optimizer_steps_min'])} / {_number(r['optimizer_steps_max'])})")
            share = r["share_of_steps_replaying"]
            replay = "-" if share is None else f"{_number(r['replayed_per_step_median'])}; {100 * share:.0f}%"
            rest = [steps, replay, r["off_policy"] or "-", str(r["rehearsal_solve_rate"])]
        else:
            rest = [_missing(r["run"]), "", "", ""]
        lines.append([r["run"], f"{r['avg']}{ci}", r["tokens"], r["AES"] or "-", *rest])
    return markdown(header, lines)


def _missing(run: str) -> str:
    """Why a run has no figures: a model that was not trained here, or a run not yet rehearsed."""
    stem, _, seed = run.split("#")[0].rpartition("_seed")
    if not stem or not seed.isdigit():
        return "not trained by a launch script"
    return f"not rehearsed: `REHEARSE=1 SEED={seed} bash examples/scripts/train_{stem}.sh`"


def write_beside(compare_dir: Path, rehearsals: Path) -> Path:
    """compare_steps.md and compare_steps.csv in `compare_dir`, the table also appended to
    compare.md (once: a rerun of compare rewrites compare.md first)."""
    rows = beside(compare_dir, rehearsals)
    text = f"## Optimizer steps per rollout step\n\n{BESIDE_NOTE}\n\n{_beside_markdown(rows)}"
    (compare_dir / "compare_steps.md").write_text(text, encoding="utf-8")
    with open(compare_dir / "compare_steps.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, BESIDE_CSV, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    md = compare_dir / "compare.md"
    body = md.read_text(encoding="utf-8") if md.is_file() else ""
    cut = body.find("\n## Optimizer steps per rollout step\n")
    md.write_text((body if cut < 0 else body[:cut]).rstrip("\n") + "\n\n" + text, encoding="utf-8")
    return compare_dir / "compare_steps.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openrlhf_replay.rehearsal.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_table = sub.add_parser("table", help="print the rehearsal table of the given reports")
    p_table.add_argument("reports", nargs="+", type=Path, help="rehearsal reports (JSON), one row each")
    p_beside = sub.add_parser("beside", help="each compared run's optimizer steps beside its results")
    p_beside.add_argument("--compare", required=True, type=Path, metavar="DIR",
                          help="the output folder of `python -m evaluation compare` (holds compare.csv)")
    p_beside.add_argument("--rehearsals", required=True, type=Path, metavar="DIR",
                          help="the folder of rehearsal reports, one <run>.json per compared run")
    args = parser.parse_args(argv)
    if args.command == "table":
        print(table(args.reports), end="")
    else:
        print(f"rehearsal_report: {write_beside(args.compare, args.rehearsals)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
