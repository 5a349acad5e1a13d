"""Sample-efficiency lab: does replay beat GRPO per generated rollout, measured on this machine?

Runs the real pipeline (`python -m openrlhf_replay.cli.train_ppo_ray`: Ray + DeepSpeed +
vLLM, on CPU through `openrlhf_replay.cpu`) once per (condition, seed), every condition with
the same number of training steps and so the same number of generated rollouts, on the task of
`se_task.py` (two-digit addition, a 0.53M-parameter Qwen3 warm-started by supervised training to
~30-45% held-out accuracy). Each run saves a Hugging Face checkpoint every `--eval-every`
steps; after the run, each checkpoint is graded on the held-out split with the evaluation
harness's backend and grader (in this process: starting a vLLM engine would cost more than the
generation). Then `se_analysis.summarize` turns the records into the summary, and the plots show
held-out accuracy and training reward against steps, generated rollouts and compute units
(median and IQR over seeds).

    python benchmarks/sample_efficiency.py                 # 6 conditions x 3 seeds
    python benchmarks/sample_efficiency.py --quick         # none, naive, advantage x 1 seed, 6 steps
    python benchmarks/sample_efficiency.py --analyse-only  # re-plot from finished runs

Output dir (default runs/sample_efficiency[_quick]): `model/` (the warm start, cached),
`data/`, `runs/<condition>_seed<N>/` (command.sh, train.log, run.json, DONE), `summary.json`,
`curves.png`, `table.md`. A killed sweep, rerun with the same arguments, reruns only the runs
without DONE (an unfinished run is restarted from its beginning: runs are a few minutes long).
The last line printed is the summary as one JSON object.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import se_analysis  # noqa: E402
from se_task import (PROMPT_TEMPLATE, TaskConfig, WarmStartConfig, evaluate_heldout,  # noqa: E402
                     split_pairs, warm_start, write_prompt_file)

CONDITIONS = ("none", "naive", "uniform", "advantage", "freshness", "none_2epochs")
# The more-updates control: GRPO training each fresh batch twice, 4 optimizer steps per step where
# the replay conditions take 3 (2 fresh + 1 replayed) and GRPO 2. If replay beats it too, the gain
# is not only from taking more gradient steps per generated rollout.
EPOCHS = {"none_2epochs": 2}


@dataclass
class Args:
    """Settings of the sweep; every field is a `--flag` (underscores become dashes)."""

    out_dir: Path = Path(REPO / "runs/sample_efficiency")
    """Where the model cache, the runs and the summary go (`_quick` appended with --quick)."""
    quick: bool = False
    """One seed, 6 steps, and (unless --conditions is given) only none, naive, advantage: the
    smoke test of the whole sweep, under 10 minutes here."""
    conditions: str = ",".join(CONDITIONS)
    """Comma-separated conditions: replay modes, and `none_2epochs` (GRPO with 2 epochs per batch,
    the more-updates control); `none` (GRPO) is the baseline and must be among them."""
    seeds: int = 3
    """Seeds per condition (1 with --quick)."""
    steps: int = 48
    """Training steps per run (= rollout batches): the same for every condition (6 with --quick)."""
    prompts_per_step: int = 16
    """Prompts per step (`--rollout.batch_size`)."""
    group_size: int = 8
    """Responses per prompt (`--rollout.n_samples_per_prompt`)."""
    train_batch: int = 64
    """Rollouts per optimizer step (`--train.batch_size`)."""
    lr: float = 1e-4
    """Actor learning rate (constant after a 3% warm-up, as common.sh)."""
    max_new_tokens: int = 16
    """Response limit: an answer is `\\boxed{NNN}` and the end token, ~7 tokens."""
    eval_every: int = 4
    """Held-out evaluation every N steps (plus step 0, the warm start) (3 with --quick)."""
    replay_ratio: float = 0.5
    """Replayed rollouts per fresh rollout once replay starts (docs/METHOD.md default)."""
    replay_warmup: int = 4
    """Steps before replay starts (docs/METHOD.md: 20 of ~230 steps; here 4 of 48)."""
    replay_max_age: int = 10
    """Age limit (steps) for uniform / advantage (docs/METHOD.md default)."""
    naive_capacity: int = 512
    """naive: FIFO size in rollouts (4 steps' worth of fresh rollouts)."""
    freshness_tau: float = 5.0
    """freshness: decay time in steps (FreshPER used ~500 of many thousands of steps; scaled)."""
    freshness_capacity: int = 1280
    """freshness: FIFO capacity in rollouts (10 steps' worth, as tau_max for the others)."""
    target_accuracy: float = 0.3
    """Warm start: supervised training stops at the first check at or above this accuracy."""
    heldout_size: int = 200
    """Held-out problems (never trained on)."""
    run_timeout_s: int = 900
    """A run that takes longer is killed and reported as failed."""
    analyse_only: bool = False
    """Skip training: summarise and plot the finished runs in out_dir."""
    finalize: str = ""
    """`<condition>_seed<N>`: grade and record that run's existing training (no retraining), then exit."""

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        if self.quick:
            self.seeds, self.steps, self.eval_every = 1, 6, 3
            if self.conditions == ",".join(CONDITIONS):
                # a run costs ~2 min of start-up and shut-down here whatever its length (measured:
                # 133 s of a 240 s run): five would not fit in 10 minutes, three do
                self.conditions = "none,naive,advantage"
            if self.out_dir == Path(REPO / "runs/sample_efficiency"):
                self.out_dir = Path(REPO / "runs/sample_efficiency_quick")
        names = self.condition_list
        unknown = [c for c in names if c not in CONDITIONS]
        if unknown or se_analysis.BASELINE not in names:
            raise SystemExit(f"--conditions {self.conditions}: use some of {', '.join(CONDITIONS)}, "
                             f"including {se_analysis.BASELINE} (the baseline)")
        if self.steps % self.eval_every:
            raise SystemExit(f"--steps {self.steps} must be a multiple of --eval-every {self.eval_every} "
                             "so the last step is evaluated")
        if (self.prompts_per_step * self.group_size) % self.train_batch:
            raise SystemExit(f"fresh rollouts per step ({self.prompts_per_step} x {self.group_size}) must be a "
                             f"multiple of --train-batch {self.train_batch}")

    @property
    def condition_list(self) -> list[str]:
        return [c.strip() for c in self.conditions.split(",") if c.strip()]

    @property
    def rollouts_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


def parse_args(argv=None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    docs = _field_docs()
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", help=docs.get(f.name, "").replace("%", "%%"))
        else:
            kind = {"int": int, "float": float, "str": str, "Path": Path}[str(f.type)]
            parser.add_argument(flag, type=kind, default=default, help=docs.get(f.name, "").replace("%", "%%"))
    return Args(**vars(parser.parse_args(argv)))


def _field_docs() -> dict[str, str]:
    """The docstring under each Args field (for --help)."""
    source = Path(__file__).read_text().split("class Args:", 1)[1].split("def __post_init__", 1)[0]
    return {m[0]: " ".join(m[1].split()) for m in re.findall(r"(\w+): [^\n]+\n\s+\"\"\"(.*?)\"\"\"", source, re.S)}


# --------------------------------------------------------------------------------- one run

def condition_flags(cond: str, a: Args) -> list[str]:
    """`--replay.*` flags of a condition; every other flag is shared (see train_command)."""
    shared = ["--replay.ratio", str(a.replay_ratio), "--replay.warmup", str(a.replay_warmup)]
    return {
        "none": ["--replay.mode", "none"],
        "none_2epochs": ["--replay.mode", "none"],
        "naive": ["--replay.mode", "naive", "--replay.capacity", str(a.naive_capacity), *shared],
        "uniform": ["--replay.mode", "uniform", "--replay.max_age", str(a.replay_max_age), *shared],
        "advantage": ["--replay.mode", "advantage", "--replay.max_age", str(a.replay_max_age),
                      "--replay.alpha", "0.5", "--replay.off_policy", "stale", *shared],
        "freshness": ["--replay.mode", "freshness", "--replay.tau", str(a.freshness_tau),
                      "--replay.capacity", str(a.freshness_capacity), "--replay.beta_steps", str(a.steps),
                      *shared],
    }[cond]


def train_command(a: Args, cond: str, seed: int, model: Path, data: Path, run_dir: Path) -> list[str]:
    """The launcher command: docs/METHOD.md's loss settings, sized for a CPU (see Args)."""
    return [
        sys.executable, "-m", "openrlhf_replay.cli.train_ppo_ray",
        "--actor.model_name_or_path", str(model),
        "--data.prompt_dataset", str(data), "--data.input_key", "prompt", "--data.label_key", "answer",
        "--data.input_template", PROMPT_TEMPLATE, "--data.max_len", "64",
        "--data.max_samples", str(a.steps * a.prompts_per_step),
        "--rollout.max_new_tokens", str(a.max_new_tokens),
        "--reward.remote_url", str(REPO / "evaluation/reward.py"),
        "--algo.advantage.estimator", "group_norm",
        "--rollout.n_samples_per_prompt", str(a.group_size), "--rollout.batch_size", str(a.prompts_per_step),
        "--rollout.micro_batch_size", "64", "--rollout.temperature", "1.0", "--rollout.top_p", "1.0",
        "--train.batch_size", str(a.train_batch), "--train.micro_batch_size", str(a.train_batch),
        "--train.max_epochs", str(EPOCHS.get(cond, 1)), "--train.num_episodes", "1", "--train.seed", str(seed),
        "--actor.policy_loss_type", "ppo", "--actor.eps_clip_low_high", "0.2", "0.28",
        "--actor.dual_clip", "10", "--actor.loss_agg_mode", "token-mean",
        "--actor.adam.lr", str(a.lr), "--actor.adam.weight_decay", "0.01", "--actor.max_norm", "1.0",
        "--actor.lr_scheduler", "constant_with_warmup", "--actor.lr_warmup_ratio", "0.03",
        "--algo.kl.init_coef", "0",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1", "--train.colocate_all",
        "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "1", "--vllm.sync_backend", "gloo",
        "--vllm.enforce_eager", "--ds.zero_stage", "0", "--ds.param_dtype", "bf16",
        "--ds.attn_implementation", "sdpa",
        "--ckpt.path", str(run_dir / "ckpt"), "--ckpt.output_dir", str(run_dir / "model"),
        "--ckpt.save_steps", str(a.eval_every), "--ckpt.save_hf", "--ckpt.disable_ds", "--ckpt.max_num", "1000",
        "--logger.logging_steps", "1",
        "--replay.seed", str(seed),
        *condition_flags(cond, a),
    ]


_STEP_LINE = re.compile(r"Global step (\d+): (\{.*)$")
_RAY_PREFIX = re.compile(r"^(?:\x1b\[\d+m)?\(([^)]*pid=\d+)\)(?:\x1b\[0m)? ?")


def _status(text: str):
    try:
        return eval(text, {"__builtins__": {}}, {"nan": math.nan, "inf": math.inf})  # our own log
    except (SyntaxError, NameError, ValueError, TypeError):
        return None


def parse_step_logs(log_text: str) -> list[dict]:
    """Upstream's per-step status dicts (`✨ Global step N: {...}`), last occurrence per step.

    Ray's log forwarding sometimes splits a long line: the rest comes a few lines later with the
    same `(actor pid=N)` prefix, after other output (progress bars). Such a line is completed by
    appending the following lines of that actor, prefix removed, until the dict parses.
    """
    lines = log_text.splitlines()
    steps = {}
    for i, line in enumerate(lines):
        m = _STEP_LINE.search(line)
        if not m:
            continue
        text, status = m[2].rstrip(), _status(m[2].rstrip())
        prefix = _RAY_PREFIX.match(line)
        for follow in lines[i + 1:i + 12] if status is None and prefix else ():
            p = _RAY_PREFIX.match(follow)
            if p is None or p[1] != prefix[1]:
                continue
            piece = follow[p.end():].rstrip()
            status = _status(text + piece)
            if status is not None:
                break
            if not re.search(r"%\||\bINFO\b|\bWARNING\b", piece):  # not a progress bar or a log record
                text += piece
        if isinstance(status, dict):
            steps[int(m[1])] = status
    return [{"step": k, **steps[k]} for k in sorted(steps)]


def step_record(status: dict, a: Args, epochs: int = 1) -> dict:
    """The fields the analysis uses from one upstream status dict (`epochs` passes per batch)."""
    fresh = status.get("rollout/num_samples", a.rollouts_per_step)
    replayed = status.get("replay/replayed", status.get("replay/replayed_rollouts", 0.0)) or 0.0
    return {
        "step": status["step"],
        "reward": status["rollout/reward_mean"],
        "response_tokens": status["rollout/response_length_mean"],
        "generation_s": status["timing/generation"],
        "make_experience_s": status["timing/make_experience"],
        "ppo_train_s": status["timing/ppo_train"],
        "broadcast_s": status["timing/broadcast"],
        "fresh_rollouts": fresh,
        "replayed_rollouts": replayed,
        "optimizer_steps": epochs * (fresh + replayed) / a.train_batch,
        "replay": {k: v for k, v in status.items() if k.startswith("replay/") and isinstance(v, (int, float))},
    }


def run_one(a: Args, cond: str, seed: int, model: Path, data: Path, heldout, log) -> dict:
    """Train (unless DONE), evaluate its checkpoints, write run.json; returns the run record."""
    run_dir = a.out_dir / "runs" / f"{cond}_seed{seed}"
    cmd = train_command(a, cond, seed, model, data, run_dir)
    script = "#!/usr/bin/env bash\ncd " + str(REPO) + "\n" + " ".join(map(_quote, cmd)) + "\n"
    done = (run_dir / "DONE").is_file() and (run_dir / "run.json").is_file()
    same = (run_dir / "command.sh").is_file() and (run_dir / "command.sh").read_text() == script
    if done and same:
        return json.loads((run_dir / "run.json").read_text())
    if run_dir.exists():
        log(f"{run_dir.name}: {'a run with other settings' if done else 'an unfinished run'} found; redoing it")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "command.sh").write_text(script)
    log(f"{run_dir.name}: training ({a.steps} steps x {a.rollouts_per_step} rollouts)")
    t0 = time.perf_counter()
    with open(run_dir / "train.log", "w") as out:
        try:
            rc = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                timeout=a.run_timeout_s, env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return finalize_run(a, cond, seed, run_dir, heldout, rc, time.perf_counter() - t0, log)


def finalize_run(a: Args, cond: str, seed: int, run_dir: Path, heldout, rc, wall_s: float, log) -> dict:
    """Check a trained run's log, grade its checkpoints, write run.json and DONE.

    Also callable on a run whose training finished but whose log an older parser misread:
    `python benchmarks/sample_efficiency.py --finalize <condition>_seed<N>` (wall time then from
    the files' times)."""
    statuses = parse_step_logs((run_dir / "train.log").read_text(errors="replace"))
    if rc != 0 or len(statuses) != a.steps:
        raise RuntimeError(f"{run_dir.name}: the launcher exited with {rc} after {len(statuses)}/{a.steps} steps; "
                           f"see {run_dir / 'train.log'}")
    t1 = time.perf_counter()
    evals = [{"step": 0, **a.__dict__.get("_step0_eval", {})}]
    for step in range(a.eval_every, a.steps + 1, a.eval_every):
        ckpt = run_dir / "ckpt" / f"global_step{step}_hf"
        result = evaluate_heldout(ckpt, heldout, max_new_tokens=a.max_new_tokens)
        evals.append({"step": step, "accuracy": result.accuracy, "response_tokens": result.mean_response_tokens})
        shutil.rmtree(ckpt)  # graded; the weights are not needed again (the final model stays in model/)
    record = {"condition": cond, "seed": seed, "rollouts_per_step": a.rollouts_per_step,
              "wall_s": wall_s, "eval_s": time.perf_counter() - t1,
              "startup_s": wall_s - sum(s["timing/step_total"] for s in statuses),
              "steps": [step_record(s, a, EPOCHS.get(cond, 1)) for s in statuses], "evals": evals}
    (run_dir / "run.json").write_text(json.dumps(record, indent=1))
    (run_dir / "DONE").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    log(f"{run_dir.name}: done in {wall_s:.0f} s (+{record['eval_s']:.0f} s eval); held-out acc "
        + " ".join(f"{e['accuracy']:.2f}" for e in evals))
    return record


def _quote(word: str) -> str:
    return word if re.fullmatch(r"[\w./,:=@%+-]+", word) else "'" + word.replace("'", "'\\''") + "'"


# ----------------------------------------------------------------------------------- output

REWARD_WINDOW = 5
AXES = (("step", "training step"), ("rollouts", "generated rollouts"), ("compute_units", "compute units"))
COLOURS = {"none": "black", "naive": "tab:orange", "uniform": "tab:blue", "advantage": "tab:red",
           "freshness": "tab:green", "none_2epochs": "tab:grey"}


def plot(runs: list[dict], summary: dict, path: Path) -> None:
    """2 x 3 panels: held-out accuracy / training reward vs steps, rollouts, compute units."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit_s = summary["unit_s"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), sharey="row")
    for cond in summary["conditions"]:
        rs = [r for r in runs if r["condition"] == cond]
        for row, curve_fn in enumerate((se_analysis.eval_curve, se_analysis.reward_curve)):
            for col, (axis, _) in enumerate(AXES):
                curves = [curve_fn(r, unit_s, axis) for r in rs]
                if row == 1:
                    curves = [(x, se_analysis.trailing_mean(y, REWARD_WINDOW)) for x, y in curves]
                agg = se_analysis.aggregate(curves)
                ax = axes[row, col]
                ax.plot(agg["x"], agg["median"], color=COLOURS.get(cond), label=f"{cond} (n={len(rs)})",
                        marker="o" if row == 0 else None, ms=3)
                ax.fill_between(agg["x"], agg["q25"], agg["q75"], color=COLOURS.get(cond), alpha=0.15)
    for col, (_, label) in enumerate(AXES):
        axes[1, col].set_xlabel(label)
    axes[0, 0].set_ylabel("held-out accuracy (greedy)")
    axes[1, 0].set_ylabel(f"training reward (fresh rollouts, mean of last {REWARD_WINDOW} steps)")
    axes[0, 0].axhline(summary["match_fraction"] * summary["baseline_best_acc"], color="grey", ls=":", lw=1)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"median and IQR over seeds; 1 compute unit = one GRPO optimizer step = {unit_s:.2f} s here")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(summary: dict) -> str:
    rows = ["| condition | seeds | best held-out acc (median curve) | final acc | rollouts to 98% of GRPO best "
            "(ratio) | mean response tokens | AES vs GRPO | compute units (train + gen) |",
            "|---|---|---|---|---|---|---|---|"]
    for c in summary["conditions"]:
        s = summary[c]
        ratio = "never" if s["rollouts_to_match_ratio"] is None else f"{s['rollouts_to_match_ratio']:.2f}"
        aes = "n/a" if s["aes_vs_grpo"] is None else f"{s['aes_vs_grpo']:+.3f}"
        rows.append(f"| {c} | {len(s['seeds'])} | {s['best_acc']:.3f} | {s['final_acc']:.3f} | {ratio} | "
                    f"{s['mean_response_tokens']:.2f} | {aes} | {s['compute_units']:.0f} "
                    f"({s['train_units']:.0f} + {s['generation_units']:.0f}) |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> dict:
    a = parse_args(argv)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    log_file = open(a.out_dir / "sweep.log", "a")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    task = TaskConfig(heldout_size=a.heldout_size)
    heldout, train = split_pairs(task)
    runs = []
    if a.finalize:
        cond, seed = a.finalize.rsplit("_seed", 1)
        run_dir = a.out_dir / "runs" / a.finalize
        base = evaluate_heldout(a.out_dir / "model", heldout, max_new_tokens=a.max_new_tokens)
        a._step0_eval = {"accuracy": base.accuracy, "response_tokens": base.mean_response_tokens}
        wall_s = (run_dir / "train.log").stat().st_mtime - (run_dir / "command.sh").stat().st_mtime
        return finalize_run(a, cond, int(seed), run_dir, heldout, 0, wall_s, log)
    if not a.analyse_only:
        t0 = time.perf_counter()
        model = warm_start(a.out_dir / "model", task, WarmStartConfig(target_accuracy=a.target_accuracy), log)
        data = write_prompt_file(a.out_dir / "data" / "train.jsonl", train)
        base = evaluate_heldout(model, heldout, max_new_tokens=a.max_new_tokens)
        a._step0_eval = {"accuracy": base.accuracy, "response_tokens": base.mean_response_tokens}
        log(f"warm start ready ({time.perf_counter() - t0:.0f} s): held-out acc {base.accuracy:.3f}, "
            f"{base.mean_response_tokens:.2f} tokens, eval {base.seconds:.1f} s")
        failed = []
        for seed in range(1, a.seeds + 1):  # seed-major: a cut-short sweep still has every condition
            for cond in a.condition_list:
                try:
                    runs.append(run_one(a, cond, seed, model, data, heldout, log))
                except RuntimeError as e:
                    log(f"FAILED: {e}")
                    failed.append(f"{cond}_seed{seed}")
        if failed:
            log(f"{len(failed)} run(s) failed: {', '.join(failed)}; rerun to retry them")
    else:
        for f in sorted((a.out_dir / "runs").glob("*/run.json")):
            if (f.parent / "DONE").is_file():
                runs.append(json.loads(f.read_text()))
    order = a.condition_list  # the baseline first, as given
    runs = sorted((r for r in runs if r["condition"] in order), key=lambda r: (order.index(r["condition"]), r["seed"]))
    summary = se_analysis.summarize(runs)
    summary["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()
                           if not k.startswith("_")}
    summary["timing"] = {"run_wall_s_median": float(_median([r["wall_s"] for r in runs])),
                         "startup_s_median": float(_median([r["startup_s"] for r in runs])),
                         "eval_s_median": float(_median([r["eval_s"] for r in runs]))}
    (a.out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=_jsonable))
    (a.out_dir / "table.md").write_text(table(summary))
    plot(runs, summary, a.out_dir / "curves.png")
    log(f"wrote {a.out_dir / 'summary.json'}, table.md, curves.png")
    print(table(summary))
    print(json.dumps(summary, default=_jsonable))
    return summary


def _median(values):
    import numpy as np

    return np.median(values) if values else math.nan


def _jsonable(value):
    import numpy as np

    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(type(value))


if __name__ == "__main__":
    main()
