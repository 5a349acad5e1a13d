"""Sample-efficiency lab: does replay beat GRPO per generated rollout, and why? Trains each
(condition, seed) through the real pipeline (the command of `python -m
openrlhf_replay.cli.train_ppo_ray`: Ray + DeepSpeed + vLLM, on CPU through `openrlhf_replay.cpu`;
see `se_session.py` for how runs share processes), every condition with the same prompts per step
and the same steps, so the same generated rollouts, on the task of `se_task.py` (by default five
arithmetic bands of spread difficulty, a 0.53M-parameter Qwen3 warm-started by supervised
training). Seed s of every condition has the same prompt order (`--train.seed s`) and the same
warm start. The prompts come from a pool passed over once every `--pool-steps` steps (the fifth
edition's default: every 10 of 50 steps, so that pre-rollout skipping reads each prompt's
history; the fourth's: once in the run, so `success`, RLEP, replays from an offline pool that
GRPO seed 1's final model decoded). A skipping run's loader holds more passes, and every run
ends once it has drawn `--steps` steps' prompts: every condition generates the same rollouts. Each run saves a Hugging Face checkpoint every `--eval-every`
steps; after the run, each checkpoint is graded on the held-out split with the evaluation
harness's backend and bounded grader. `se_analysis.summarize` turns the records into the summary
(per condition, and paired differences over seeds), the plots show held-out accuracy and training
reward against steps, generated rollouts and compute units (median and IQR over seeds).

    python benchmarks/lab/sample_efficiency.py                 # the fifth edition: 5 conditions, 16 or 8 seeds
    python benchmarks/lab/sample_efficiency.py --edition 4     # the fourth edition: 11 conditions, 16 or 12 seeds
    python benchmarks/lab/sample_efficiency.py --quick         # none, uniform, none_df x 1 seed, 10 steps
    python benchmarks/lab/sample_efficiency.py --task add2     # the first edition (two-digit addition)
    python benchmarks/lab/sample_efficiency.py --analyse-only  # re-summarise and re-plot finished runs

Output dir (default runs/sample_efficiency[_e5|_add2][_quick]): `data/`, `warm_start.json` (held-out
accuracy per band and the spread of per-prompt success rates after the warm start),
`runs/<condition>_seed<N>/` (command.sh, steps.json, run.json, DONE), `session.log`,
`summary.json`, `table.md`, `curves.png`, `curves_all.png`, `bands.png`, `spread.png`. The
warm-started model is cached by recipe under runs/sample_efficiency_models/, shared by every
output dir. The runs are trained one after another in one session (`se_session.py`: one Ray
instance, one vLLM engine, one policy actor for all, each run starting from the warm start
again; RLEP's `success` trains last, its offline pool decoded just before it by GRPO seed 1's
final model), because a launch of its own spends about as long starting its processes as a run
trains; each run's `command.sh` is the same run as a launch of its own (ended after `--steps`
steps' prompts). A killed sweep, rerun with the same arguments, grades the runs it trained and did not
grade, and reruns only the runs without a finished training or whose command changed (an
unfinished run restarts from its beginning: runs are a minute or two long); `--archive FILE`
carries finished runs to a later session's checkout (se_archive.py). The last line printed is
the summary as one JSON object.
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks/lab")]

import se_analysis  # noqa: E402
import se_archive  # noqa: E402
import se_report  # noqa: E402
from se_report import jsonable, summarize  # noqa: E402
from infra.hardware import cpu_description  # noqa: E402
from se_command import (command_script, condition_flags, step_record, success_pool_path,  # noqa: E402,F401
                        train_command)
from se_settings import (CONDITIONS, DYNAMIC_FILTERING, EDITION, FIFTH_EDITION,  # noqa: E402,F401
                         FIRST_EDITION, ROLLOUT_TEMPERATURE, SKIPPING, Args, parse_args)
from se_task import (PROMPT_TEMPLATE, evaluate_heldout, rate_histogram, split_problems, success_rates,  # noqa: E402
                     warm_start, write_prompt_file)


def run_dir_of(a: Args, cond: str, seed: int) -> Path:
    return a.out_dir / "runs" / f"{cond}_seed{seed}"


def finished_record(a: Args, cond: str, seed: int, cmd: list[str]) -> dict | str | None:
    """The run's record if it is DONE with this command; "trained" if this command trained it and
    its grading did not finish (a session that ended between the two: graded now, not retrained);
    otherwise None, and its folder emptied."""
    run_dir = run_dir_of(a, cond, seed)
    same = (run_dir / "command.sh").is_file() and (run_dir / "command.sh").read_text() == command_script(cmd)
    if same and (run_dir / "DONE").is_file() and (run_dir / "run.json").is_file():
        return json.loads((run_dir / "run.json").read_text())
    if same and (run_dir / "steps.json").is_file() and (run_dir / "model").is_dir():
        return "trained"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    return None


def train_in_session(a: Args, jobs: list[tuple[str, int, list[str]]], log, prepare: dict) -> tuple[list, list]:
    """Train these (condition, seed, command) runs in one `se_session.py` process (one Ray
    instance, one vLLM engine, one policy actor for all; see its docstring). Returns (the runs
    whose steps.json it wrote, the run that failed if one did: the session stops there)."""
    for cond, seed, cmd in jobs:
        run_dir = run_dir_of(a, cond, seed)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "command.sh").write_text(command_script(cmd))
    spec = a.out_dir / "session_jobs.json"
    spec.write_text(json.dumps([{"name": f"{c}_seed{s}", "command": cmd, "out": str(run_dir_of(a, c, s)),
                                 "timeout_s": a.run_timeout_s, "max_prompts": a.steps * a.prompts_of(c),
                                 **({"prepare": prepare[f"{c}_seed{s}"]} if f"{c}_seed{s}" in prepare else {})}
                                for c, s, cmd in jobs],
                               indent=1))
    log(f"training {len(jobs)} run(s) in one session ({a.steps} steps x "
        f"{'/'.join(sorted({str(a.rollouts_of(c)) for c, _, _ in jobs}))} rollouts); "
        f"log: {a.out_dir / 'session.log'}")
    with open(a.out_dir / "session.log", "a") as out:
        try:
            rc = subprocess.run([sys.executable, str(REPO / "benchmarks/lab/se_session.py"), str(spec)], cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, timeout=a.run_timeout_s * (len(jobs) + 1),
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    trained = [job for job in jobs if (run_dir_of(a, job[0], job[1]) / "steps.json").is_file()]
    failed = [job for job in jobs if (run_dir_of(a, job[0], job[1]) / "error.txt").is_file()]
    if rc != 0:
        log(f"the session ended with {rc} after {len(trained)} of {len(jobs)} run(s)")
    return trained, failed


def finalize_run(a: Args, cond: str, seed: int, heldout, log) -> dict:
    """Grade a trained run's checkpoints on the held-out split, write run.json and DONE."""
    run_dir = run_dir_of(a, cond, seed)
    trained = json.loads((run_dir / "steps.json").read_text())
    statuses = trained["steps"]
    if not (0 < len(statuses) <= a.steps and a.generated_all(statuses, cond)):  # filtering can end a run early
        raise RuntimeError(f"{run_dir.name}: {len(statuses)}/{a.steps} steps trained, not every planned rollout "
                           f"generated; see {a.out_dir / 'session.log'}")
    t1 = time.perf_counter()
    evals = [{"step": 0, **a.__dict__["_step0_eval"]}]
    for step in range(a.eval_every, len(statuses) + 1, a.eval_every):
        ckpt = run_dir / "ckpt" / f"global_step{step}_hf"
        evals.append({"step": step, **eval_record(evaluate_heldout(ckpt, heldout, **eval_settings(a)))})
    if evals[-1]["step"] != len(statuses):  # a run that ended with the pool: its final model
        evals.append({"step": len(statuses),
                      **eval_record(evaluate_heldout(run_dir / "model", heldout, **eval_settings(a)))})
    wall_s = trained["wall_s"]
    record = {"condition": cond, "seed": seed, "rollouts_per_step": a.rollouts_of(cond),
              "wall_s": wall_s, "eval_s": time.perf_counter() - t1,
              "startup_s": wall_s - sum(s["timing/step_total"] for s in statuses),
              "session": trained.get("session"), "cpu": trained.get("cpu"),  # None in older runs
              "session_startup_s": trained["session_startup_s"],
              "load_avg_1min_start_end": trained["load_avg_1min_start_end"],
              "steps": [step_record(s, a, cond) for s in statuses], "evals": evals}
    (run_dir / "run.json").write_text(json.dumps(record, indent=1))
    (run_dir / "DONE").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    shutil.rmtree(run_dir / "ckpt", ignore_errors=True)  # graded and recorded (the final model stays in model/)
    replayed = sum(s["replayed_rollouts"] for s in record["steps"])
    log(f"{run_dir.name}: trained in {wall_s:.0f} s (+{record['eval_s']:.0f} s eval), {replayed:.0f} replayed; "
        f"held-out avg@{a.eval_samples} " + " ".join(f"{e['accuracy']:.2f}" for e in evals))
    return record


def eval_settings(a: Args) -> dict:
    return {"samples": a.eval_samples, "temperature": ROLLOUT_TEMPERATURE, "max_new_tokens": a.max_new_tokens}


def eval_record(result) -> dict:
    """The fields of one held-out evaluation that a run record keeps (se_analysis's docstring)."""
    return {"accuracy": result.accuracy, "accuracy_greedy": result.accuracy_greedy,
            "response_tokens": result.mean_response_tokens, "by_band": result.by_band,
            "by_band_greedy": result.by_band_greedy}


# ------------------------------------------------------------------------ warm start and data

def prepare(a: Args, log) -> tuple[Path, Path, list, dict]:
    """The warm-started model (cached by recipe), the prompt pool file, the held-out problems, and
    the warm start's report: held-out accuracy (overall, per band) and the spread of per-prompt
    success rates over the pool (`group_size` samples at the rollout temperature, 1.0)."""
    task, ws = a.task_config, a.warm_start_config
    split = split_problems(task)
    recipe = json.dumps([dataclasses.asdict(task), dataclasses.asdict(ws)], sort_keys=True)
    model_dir = REPO / "runs/sample_efficiency_models" / f"{a.task}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"
    t0 = time.perf_counter()
    model = warm_start(model_dir, task, ws, log)
    warm_s = time.perf_counter() - t0
    pool = split.pool(a.pool_size)
    data = write_prompt_file(a.out_dir / "data" / "train.jsonl", pool)
    report_path = a.out_dir / "warm_start.json"
    settings = {"model": str(model), "pool_size": len(pool), "samples_per_prompt": a.group_size,
                "max_new_tokens": a.max_new_tokens, "eval": eval_settings(a)}
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError):
        report = {}
    if all(report.get(k) == v for k, v in settings.items()):
        log(f"warm start: its evaluation read from {report_path} (same model and settings)")
    else:
        base = eval_record(evaluate_heldout(model, split.heldout, **eval_settings(a)))
        t1 = time.perf_counter()
        rates = success_rates(model, pool, n=a.group_size, temperature=1.0, max_new_tokens=a.max_new_tokens)
        hist = rate_histogram(pool, rates, a.group_size)
        history = json.loads((model / "warm_start.json").read_text())["history"]
        report = {**settings, "supervised_steps": history[-1]["step"], "heldout": base,
                  "success_rate_histogram": hist, "share_all_wrong": hist["all"][0] / len(pool),
                  "share_all_right": hist["all"][-1] / len(pool),
                  "share_mixed": 1 - (hist["all"][0] + hist["all"][-1]) / len(pool),
                  "seconds": {"warm_start_this_call": warm_s, "spread": time.perf_counter() - t1}}
        report_path.write_text(json.dumps(report, indent=1))  # a torn one is measured again
    a._step0_eval = report["heldout"]
    base = report["heldout"]
    log(f"warm start ready ({warm_s:.0f} s, {report['supervised_steps']} supervised steps): held-out "
        f"avg@{a.eval_samples} {base['accuracy']:.3f} "
        f"({', '.join(f'{b} {v:.2f}' for b, v in base['by_band'].items())}), "
        f"greedy {base['accuracy_greedy']:.3f}; "
        f"pool of {len(pool)}: "
        f"{report['share_all_wrong']:.0%} all wrong, {report['share_all_right']:.0%} all right, "
        f"{report['share_mixed']:.0%} mixed in {a.group_size} samples")
    return model, data, split.heldout, report


def main(argv=None) -> dict:
    a = parse_args(argv)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    # --analyse-only writes nothing but its figures (a results folder holds no log of re-analyses)
    log_file = None if a.analyse_only else open(a.out_dir / "sweep.log", "a")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        if log_file:
            log_file.write(line + "\n")
            log_file.flush()

    t_start, load_start = time.perf_counter(), os.getloadavg()
    if a.finalize:
        cond, seed = a.finalize.rsplit("_seed", 1)
        _, _, heldout, _ = prepare(a, log)
        return finalize_run(a, cond, int(seed), heldout, log)
    if a.analyse_only:
        runs = analysed_runs(a)
    else:
        log(f"sweep on {cpu_description()}; load average {' '.join(f'{x:.2f}' for x in load_start)}")
        runs = sweep(a, log)
    order = a.condition_list  # the baseline first, as given
    runs = sorted((r for r in runs if r["condition"] in order), key=lambda r: (order.index(r["condition"]), r["seed"]))
    summary = summarize(a, runs)
    summary["timing"]["this_call"] = None if a.analyse_only else {
        "wall_s": time.perf_counter() - t_start, "load_avg_start": list(load_start),
        "load_avg_end": list(os.getloadavg())}
    (a.out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=jsonable))
    with gzip.GzipFile(a.out_dir / "runs.json.gz", "wb", mtime=0) as f:  # the same runs give the same bytes
        f.write(json.dumps(runs).encode())
    (a.out_dir / "table.md").write_text(se_report.table(summary))
    se_report.write_plots(runs, summary, a.out_dir, order)
    log(f"wrote {a.out_dir / 'summary.json'}, table.md, runs.json.gz and the plots")
    if a.archive and not a.analyse_only:
        warm = Path(json.loads((a.out_dir / "warm_start.json").read_text())["model"])
        kept = se_archive.save(a.archive, a.out_dir, se_archive.weights_sha(warm))
        log(f"archive {a.archive}: {kept} finished run(s)")
    print(se_report.table(summary))
    print(json.dumps(summary, default=jsonable))
    return summary


def analysed_runs(a: Args) -> list[dict]:
    """`--analyse-only`'s runs: the finished runs in out_dir, or with `--archive` the archive's (a
    results folder's committed record), as many seeds of each condition as the call plans."""
    if not a.archive:
        return [json.loads(f.read_text()) for f in sorted((a.out_dir / "runs").glob("*/run.json"))
                if (f.parent / "DONE").is_file()]
    kept = {}
    for (cond, seed, _), record in se_archive.load(a.archive).items():
        if cond in a.condition_list and seed <= a.seeds_of(cond):
            if (cond, seed) in kept:
                raise SystemExit(f"--archive {a.archive} holds two runs of {cond} seed {seed} (two commands); "
                                 "analyse their output dir instead (--analyse-only without --archive)")
            kept[cond, seed] = record
    return list(kept.values())


def sweep(a: Args, log) -> list[dict]:
    """Train and evaluate every planned run not finished yet (one session at a time, retrying
    what a dead session left; a run in `--archive` with the same fingerprint is restored, not
    trained); the records of every finished run, in plan order."""
    model, data, heldout, _ = prepare(a, log)
    weights, archived, restored = se_archive.weights_sha(model), se_archive.load(a.archive), 0
    planned = [(cond, seed) for seed in range(1, max(a.seeds_of(c) for c in a.condition_list) + 1)
               for cond in a.condition_list if seed <= a.seeds_of(cond)]  # seed-major: a cut-short sweep has them all
    records, pending, ungraded = {}, [], []
    for cond, seed in planned:
        cmd = train_command(a, cond, seed, model, data, run_dir_of(a, cond, seed))
        record = finished_record(a, cond, seed, cmd)
        if record == "trained":
            ungraded.append((cond, seed, cmd))
            continue
        kept = archived.get((cond, seed, se_archive.fingerprint(command_script(cmd), a.out_dir, weights)))
        if record is None and kept is not None:
            record, restored = se_archive.restore(run_dir_of(a, cond, seed), command_script(cmd), kept), restored + 1
        if record is None:
            pending.append((cond, seed, cmd))
        else:
            records[cond, seed] = record
    if a.archive:
        log(f"{restored} finished run(s) restored from {a.archive} (same command, same warm-start weights)")
    if ungraded:
        log(f"{len(ungraded)} run(s) trained by an earlier call and not graded: graded now")
    failed = grade_all(a, ungraded, records, heldout, log)
    # `success` trains last, in the same session: its pool is decoded by GRPO seed 1's final model
    # just before its first run, so that run must be finished already or train first.
    later = [job for job in pending if str(success_pool_path(a)) in job[2]]  # its command reads the pool
    first = [job for job in pending if job not in later]
    grpo_trains_now = any(job[:2] == (se_analysis.BASELINE, 1) for job in first)
    if later and not grpo_trains_now and (se_analysis.BASELINE, 1) not in records:
        log(f"success: not trained, its pool needs a finished {se_analysis.BASELINE}_seed1")
        failed += [f"success_seed{seed}" for _, seed, _ in later]
        later = []
    failed += train_all(a, first + later, records, heldout, log, pool_step(a, data, later, grpo_trains_now, log))
    if failed:
        log(f"{len(failed)} run(s) failed: {', '.join(failed)}; rerun to retry them")
    return [records[key] for key in planned if key in records]


def train_all(a: Args, pending: list, records: dict, heldout, log, prepare: dict) -> list[str]:
    """Train and grade the pending (condition, seed, command) runs, one session at a time until
    none is left or a session dies before its first run ends; records of the finished runs go
    to `records`. `prepare`: run name -> what its session runs just before it (se_session.py).
    Returns the names of the runs that failed."""
    failed = []
    while pending:
        trained, broken = train_in_session(a, pending, log, prepare)
        failed += grade_all(a, trained, records, heldout, log)
        for cond, seed, _ in broken:
            log(f"FAILED: {cond}_seed{seed}; see {run_dir_of(a, cond, seed) / 'error.txt'} and the session log")
            failed.append(f"{cond}_seed{seed}")
        if not trained and not broken:  # the session died before its first run ended
            failed += [f"{c}_seed{s}" for c, s, _ in pending]
            break
        done = {(c, s) for c, s, _ in trained + broken}
        pending = [job for job in pending if (job[0], job[1]) not in done]
    return failed


def grade_all(a: Args, trained: list, records: dict, heldout, log) -> list[str]:
    """Grade these trained (condition, seed, command) runs into `records`; the names of those that failed."""
    failed = []
    for cond, seed, _ in trained:
        try:
            records[cond, seed] = finalize_run(a, cond, seed, heldout, log)
        except RuntimeError as e:
            log(f"FAILED: {e}")
            failed.append(f"{cond}_seed{seed}")
    return failed


def pool_step(a: Args, data: Path, later: list, grpo_trains_now: bool, log) -> dict[str, dict]:
    """RLEP's offline pool for `success`, built as RLEP builds it (a finished GRPO run decodes
    every training prompt; the verified successes are kept: Kwai-Klear/RLEP, README and
    recipe/rlep/rlep_training.sh): GRPO seed 1's final model samples `group_size` answers to each
    prompt of the RL pool at the rollout temperature. So `success` has something to replay even
    when no prompt returns within a run. The command, keyed by the first `success` run it comes
    before in the session; nothing when GRPO's seed 1 is not trained now and the pool is newer."""
    pool, grpo = success_pool_path(a), run_dir_of(a, se_analysis.BASELINE, 1)
    fresh = pool.is_file() and not grpo_trains_now and pool.stat().st_mtime > (grpo / "DONE").stat().st_mtime
    if not later or fresh:
        return {}
    name = f"{later[0][0]}_seed{later[0][1]}"
    log(f"success: RLEP's pool from {grpo.name}'s model, decoded in the session just before {name}: {pool}")
    command = [sys.executable, "-m", "openrlhf_replay.cli.build_success_pool", "--model", str(grpo / "model"),
               "--prompts", str(data), "--input-key", "prompt", "--label-key", "answer",
               "--input-template", PROMPT_TEMPLATE, "--max-samples", str(a.pool_size),
               "--samples-per-prompt", str(a.group_size), "--temperature", str(ROLLOUT_TEMPERATURE),
               "--max-len", "64", "--max-new-tokens", str(a.max_new_tokens), "--backend", "hf",
               "--out", str(pool), "--overwrite"]
    return {name: {"command": command, "makes": [str(pool)]}}


if __name__ == "__main__":
    main()
