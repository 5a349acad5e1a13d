"""Replay's composition with upstream's features, rehearsed at every shape the launch scripts ship.

Each run is `REHEARSE=all bash examples/scripts/train_grpo_replay.sh <feature flags>`: the method's
command with upstream flags appended, walked step by step on this CPU (openrlhf_replay/rehearsal/)
at its own shape (Qwen3-1.7B, 8 GPUs) and, as shadows, at 3 model scales x every GPU count the
scripts support (1 to 32: 0.6B, 1.7B and 4B on 8 GPUs and on 2 nodes of 8 among them). Every
feature runs twice: as is, and with `--train.async_enable` (async's split: half of each node's GPUs
train, half generate; its shadows split alike). Checks per run:
- complete: every step of every episode walked, at every shape, none crashed;
- ranks equal: at every shape, every rank took the same optimizer steps;
- replay: every step after the warm-up replayed (else the run's report says on which steps not).
A launch that refuses the composition, or one of its shapes (its reason printed), is recorded as
refused there, not as a failure.

One JSON report per run under --out (`<feature>-<sync|async>.json`: the rehearsal's report plus
`matrix`: the checks, the flags, seconds); a run whose report exists is skipped, so rerunning the
same command resumes. `summary.md` (the table, the CPU, the time) is rewritten at the end.

    python benchmarks/rehearsal_matrix.py                       # the whole matrix: 18 runs
    python benchmarks/rehearsal_matrix.py --only refill,critic --modes sync
Data: the first 560 prompts of the scripts' prompt file (4 whole steps of 128 an episode, 48 left
over as in the whole file), the scripts' 4 episodes, the replay warm-up shortened to 6 steps and a
checkpoint every 5, so that replay, the episodes' ends and the rehearsal's resume all happen within
16 steps; --prompts 0 takes the whole file (232 steps a run).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.hardware import cpu_description  # noqa: E402
from openrlhf_replay.rehearsal.cli import completed  # noqa: E402

SCRIPT = ROOT / "examples/scripts/train_grpo_replay.sh"
DATA = ROOT.parent / "shared/data/train/deepscaler_math_train.json"
KL_LOSS = ["--algo.kl.use_loss", "--algo.kl.estimator", "k3"]
FILTER = ["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0", "1"]
# Upstream's DAPO recipe (examples/scripts/train_dapo_ray_hybrid_engine.sh of OpenRLHF): KL as a k3
# loss at 1e-3, dynamic sampling over rewards in (0, 1), DAPO's overlong penalty; its clip-higher
# (0.2 / 0.28) and token-mean loss are the scripts' own already.
DAPO = ["--algo.kl.init_coef", "0.001", *KL_LOSS, *FILTER, "--reward.overlong_buffer_len", "1024",
        "--reward.overlong_penalty_factor", "1.0"]
FEATURES = {
    "replay": [],
    "kl_reward": ["--algo.kl.init_coef", "0.01"],
    "kl_loss": ["--algo.kl.init_coef", "0.01", *KL_LOSS],
    "dynamic_filtering": FILTER,
    "refill": [*FILTER, "--replay.refill"],
    "dynamic_batch": ["--train.dynamic_batch_enable"],
    "cosine_lr": ["--actor.lr_scheduler", "cosine_with_min_lr"],
    "critic": ["--algo.advantage.estimator", "gae", "--critic.model_name_or_path", "Qwen/Qwen3-1.7B-Base"],
    "dapo": DAPO,
}
MODES = ("sync", "async")
SHORT = {"prompts": 560, "REPLAY_WARMUP": "6", "SAVE_STEPS": "5"}


def flags(feature: str, mode: str) -> list[str]:
    """The flags appended to the script: the critic takes as many GPUs per node as the actor."""
    extra = list(FEATURES[feature])
    if feature == "critic":
        extra += ["--critic.num_gpus_per_node", "4" if mode == "async" else "8"]
    return extra + (["--train.async_enable"] if mode == "async" else [])


def checks(report: dict) -> dict:
    """The matrix's verdict on one rehearsal report (see the module docstring)."""
    crash = report.get("crash") or ""
    if crash.startswith("refused before start"):
        return {"verdict": "refused", "why": crash}
    shapes = report.get("shapes", [])
    # A shape the launch refuses (its reason printed; e.g. a critic on 8 GPUs beside a 4-GPU actor)
    # is one the appended flags do not scale to: recorded, not a crash.
    refused = [s["flags"] for s in shapes if (s["crash"] or "").startswith("refused before start")]
    broken = [s["flags"] or "this run" for s in shapes if s["flags"] not in refused and (
        s["crash"] is not None or s["steps_completed"] != report["steps_completed"])]
    unequal = [s["flags"] or "this run" for s in shapes if len(set(s.get("optimizer_steps_per_rank", []))) > 1]
    replay = report.get("replayed_per_step", {})
    after = replay.get("steps_after_warmup", 0)
    without = [i for i, n in enumerate(replay.get("counts", [])) if n == 0 and i >= report["steps_completed"] - after]
    ok = {"complete": not crash and completed(report) and not broken, "ranks_equal": not unequal,
          "replay_after_warmup": after > 0 and not without}
    result = {**ok, "verdict": "pass" if all(ok.values()) else "fail", "shapes": len(shapes)}
    if crash or broken:
        result["why"] = crash or f"crashed or cut short at: {'; '.join(broken)}"
    if unequal:
        result["unequal_ranks_at"] = unequal
    if refused:
        result["refused_at"] = refused
    if without:
        result["steps_without_replay"] = without
    return result


def run_one(feature: str, mode: str, data: Path, prompts_env: dict, python: str) -> dict:
    """One rehearsal, in a scratch RUNS_DIR; its report with the matrix's checks under `matrix`."""
    with tempfile.TemporaryDirectory(prefix="rehearsal_matrix_") as scratch:
        env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "NUM_GPUS", "NUM_NODES", "OUTPUT_DIR")}
        env.update(PYTHON=python, RUNS_DIR=scratch, RAY_ADDRESS="", DATA=str(data), REHEARSE="all",
                   REHEARSE_SOLVE_RATE="0.4", **prompts_env)
        t0 = time.monotonic()
        proc = subprocess.run(["bash", str(SCRIPT), *flags(feature, mode)], env=env, cwd=ROOT,
                              capture_output=True, text=True)
        seconds = round(time.monotonic() - t0, 1)
    lines = proc.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):  # refused by the script or the rehearsal's own checks
        report = {"crash": "refused before start: " + proc.stderr.strip().splitlines()[-1]
                  if proc.stderr.strip() else f"no report (exit status {proc.returncode})"}
    report["matrix"] = {"feature": feature, "mode": mode, "flags": flags(feature, mode), "seconds": seconds,
                        **checks(report)}
    return report


ROW = "| {feature} | {mode} | {steps} | {shapes} | {ranks} | {replay} | {seconds} | {verdict} |"
HEADER = ("| feature | mode | steps completed | shapes without a crash | ranks equal | replayed per step "
          "after the warm-up (min / max; steps with replay) | seconds | verdict |\n|---|---|---|---|---|---|---|---|")


def row(report: dict) -> str:
    m = report["matrix"]
    if m["verdict"] == "refused":
        return ROW.format(feature=m["feature"], mode=m["mode"], steps="-", shapes="-", ranks="-",
                          replay="-", seconds=m["seconds"],
                          verdict="refused: " + " ".join(m["why"].split(": ", 1)[-1].split()))  # one table line
    replay = report.get("replayed_per_step", {})
    shapes = report.get("shapes", [])
    return ROW.format(
        feature=m["feature"], mode=m["mode"], seconds=m["seconds"],
        steps=f"{report.get('steps_completed')} of {report.get('steps_expected') or '?'}",
        shapes=f"{sum(s['crash'] is None for s in shapes)} of {len(shapes)}"
        + (f" ({len(m['refused_at'])} refused)" if m.get("refused_at") else ""),
        ranks="yes" if m["ranks_equal"] else "no: " + "; ".join(m["unequal_ranks_at"]),
        replay=(f"{replay.get('min')} / {replay.get('max')}; {replay.get('steps_with_replay')} of "
                f"{replay.get('steps_after_warmup')}") if replay else "-",
        verdict=m["verdict"] + (f": {m['why']}" if m["verdict"] == "fail" and m.get("why") else ""))


def summary(out: Path, reports: list[dict], data: str, seconds: float) -> str:
    passed = sum(r["matrix"]["verdict"] == "pass" for r in reports)
    refused = sum(r["matrix"]["verdict"] == "refused" for r in reports)
    lines = [f"# Rehearsal matrix, {datetime.date.today().isoformat()}", "",
             f"CPU: {cpu_description()}. Data: {data}. {len(reports)} runs: {passed} pass, {refused} refused, "
             f"{len(reports) - passed - refused} fail; {sum(r['matrix']['seconds'] for r in reports):.0f} s of "
             f"rehearsal ({seconds:.0f} s this invocation). Command: `python benchmarks/rehearsal_matrix.py`.",
             "", HEADER, *map(row, reports), ""]
    text = "\n".join(lines)
    (out / "summary.md").write_text(text, encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/rehearsal_matrix",
                   help="one JSON report per run and summary.md go here (default: %(default)s)")
    p.add_argument("--only", default="", help=f"comma-separated features (default all: {', '.join(FEATURES)})")
    p.add_argument("--modes", default=",".join(MODES), help="sync, async or both (default: %(default)s)")
    p.add_argument("--prompts", type=int, default=SHORT["prompts"],
                   help="the first N prompts of the scripts' file, with the short warm-up and checkpoint "
                   "cadence (default %(default)s); 0: the whole file at the scripts' own settings")
    p.add_argument("--python", default=sys.executable, help="the interpreter the script runs (default: this one)")
    a = p.parse_args(argv)
    features = [f for f in a.only.split(",") if f] or list(FEATURES)
    modes = [m for m in a.modes.split(",") if m]
    unknown = sorted(set(features) - set(FEATURES)) + sorted(set(modes) - set(MODES))
    if unknown:
        p.error(f"unknown feature or mode: {', '.join(unknown)}; features: {', '.join(FEATURES)}; modes: sync, async")
    if not DATA.is_file():
        p.error(f"{DATA} not found: the scripts' prompt file (../shared/data beside the repository)")
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rehearsal_matrix_") as scratch:
        data, env = DATA, {}
        if a.prompts:
            data = Path(scratch) / f"first_{a.prompts}_prompts.json"
            data.write_text(json.dumps(json.loads(DATA.read_text())[: a.prompts]) + "\n", encoding="utf-8")
            env = {k: v for k, v in SHORT.items() if k != "prompts"}
        reports = run_all(features, modes, a.out, data, env, a.python)
    return 0 if all(r["matrix"]["verdict"] != "fail" for r in reports) else 1


def run_all(features: list[str], modes: list[str], out: Path, data: Path, env: dict, python: str) -> list[dict]:
    """Every (feature, mode) run not already reported under `out`, a progress line each; the summary."""
    t0, reports = time.monotonic(), []
    runs = [(f, m) for f in features for m in modes]
    for i, (feature, mode) in enumerate(runs, 1):
        path = out / f"{feature}-{mode}.json"
        if path.is_file():
            reports.append(json.loads(path.read_text()))
            reports[-1]["matrix"].update(checks(reports[-1]))  # the verdict by this code's checks
            print(f"[{i}/{len(runs)}] {feature} {mode}: kept ({path.name})", flush=True)
            continue
        report = run_one(feature, mode, data, env, python)
        path.write_text(json.dumps(report) + "\n", encoding="utf-8")
        reports.append(report)
        m = report["matrix"]
        print(f"[{i}/{len(runs)}] {feature} {mode}: {m['verdict']} in {m['seconds']} s"
              + (f" ({m['why']})" if m.get("why") else ""), flush=True)
    described = data.name + (", warm-up 6, a checkpoint every 5" if env else " (the scripts' settings)")
    print(summary(out, reports, described, time.monotonic() - t0))
    return reports

if __name__ == "__main__":
    sys.exit(main())
