"""One lab run as a launcher command: each condition's `--replay.*` flags, the command every
condition shares (`train_command`), the fields the analysis keeps from a step's status
(`step_record`), and the command's text as `command.sh` holds it."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from se_settings import EPOCHS, LR_SCALE, ROLLOUT_TEMPERATURE, SKIPPING, Args
from se_task import PROMPT_TEMPLATE

REPO = Path(__file__).resolve().parents[2]
LR_WARMUP_RATIO = 0.03
"""Of the LR schedule's optimizer steps (common.sh's); a skipping run's schedule is sized from
SKIP_PASSES times the passes, so its ratio is divided by that, for the same warm-up steps."""
SKIP_PASSES = 3
"""A skipping run's loader gets this many times the passes the others do: skipped prompts shorten
a pass, and the run must still generate `--steps` steps' prompts (the session ends it there,
`max_prompts`)."""


def condition_flags(cond: str, a: Args) -> list[str]:
    """`--replay.*` flags of a condition; every other flag is shared (see train_command)."""
    shared = ["--replay.ratio", str(a.replay_ratio), "--replay.warmup", str(a.replay_warmup)]
    uniform = ["--replay.mode", "uniform", "--replay.max_age", str(a.replay_max_age), *shared]
    filtering = ["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0", "1"]

    def advantage(alpha: float, max_age: int) -> list[str]:
        return ["--replay.mode", "advantage", "--replay.max_age", str(max_age), "--replay.alpha", str(alpha),
                "--replay.off_policy", "stale", *shared]

    return {
        "none": ["--replay.mode", "none"],
        "none_half_lr": ["--replay.mode", "none"],
        "none_half_prompts": ["--replay.mode", "none"],
        "none_2epochs": ["--replay.mode", "none"],
        "none_matched": ["--replay.mode", "none"],
        "none_df": ["--replay.mode", "none", *filtering],
        "uniform": uniform,
        "uniform_df": [*uniform, *filtering],
        "refill": [*uniform, *filtering, "--replay.refill"],
        "age0": ["--replay.mode", "age0", *shared],
        "advantage": advantage(0.5, a.replay_max_age),
        "advantage_alpha1": advantage(1.0, a.replay_max_age),
        "advantage_alpha2": advantage(2.0, a.replay_max_age),
        # ExGRPO's own store and draw (replay/modes.py): successes of partly solved questions, no age limit
        "exgrpo": ["--replay.mode", "exgrpo", "--replay.success_threshold", "0.5", *shared],
        "advantage_tau2": advantage(0.5, 2),
        "advantage_tau40": advantage(0.5, 40),
        "naive": ["--replay.mode", "naive", "--replay.capacity", str(a.naive_capacity), *shared],
        "freshness": ["--replay.mode", "freshness", "--replay.tau", str(a.freshness_tau),
                      "--replay.capacity", str(a.freshness_capacity), "--replay.beta_steps", str(a.steps),
                      *shared],
        # RLEP keeps every success (no age limit) and replays per_prompt per fresh prompt, from the
        # offline pool a finished GRPO run of this sweep decoded (`build_success_pool`)
        "success": ["--replay.mode", "success", "--replay.per_prompt", str(a.success_per_prompt),
                    "--replay.warmup", str(a.replay_warmup), "--replay.success_pool", str(success_pool_path(a))],
        # GRESO's pre-rollout skipping with its reference script's settings (replay/config.py's
        # defaults): alone, under uniform replay, and under uniform replay with refill
        "skip": ["--replay.mode", "none", "--replay.skip"],
        "skip_uniform": [*uniform, "--replay.skip"],
        "skip_refill": [*uniform, *filtering, "--replay.refill", "--replay.skip"],
    }[cond]


def train_command(a: Args, cond: str, seed: int, model: Path, data: Path, run_dir: Path) -> list[str]:
    """The launcher command: docs/METHOD.md's loss settings, sized for a CPU (see Args)."""
    passes = SKIP_PASSES if cond in SKIPPING else 1
    return [
        sys.executable, "-m", "openrlhf_replay.cli.train_ppo_ray",
        "--actor.model_name_or_path", str(model),
        "--data.prompt_dataset", str(data), "--data.input_key", "prompt", "--data.label_key", "answer",
        "--data.input_template", PROMPT_TEMPLATE, "--data.max_len", "64",
        "--data.max_samples", str(a.pool_steps * a.prompts_of(cond)),
        "--rollout.max_new_tokens", str(a.max_new_tokens),
        "--reward.remote_url", str(REPO / "evaluation/reward.py"),
        "--algo.advantage.estimator", "group_norm",
        "--rollout.n_samples_per_prompt", str(a.group_size), "--rollout.batch_size", str(a.prompts_of(cond)),
        "--rollout.micro_batch_size", "64", "--rollout.temperature", str(ROLLOUT_TEMPERATURE), "--rollout.top_p", "1.0",
        "--train.batch_size", str(a.train_batch_of(cond)), "--train.micro_batch_size", str(a.train_batch_of(cond)),
        "--train.max_epochs", str(EPOCHS.get(cond, 1)),
        "--train.num_episodes", str(passes * a.steps // a.pool_steps),
        "--train.seed", str(seed),
        "--actor.policy_loss_type", "ppo", "--actor.eps_clip_low_high", "0.2", "0.28",
        "--actor.dual_clip", "10", "--actor.loss_agg_mode", "token-mean",
        "--actor.adam.lr", str(a.lr * LR_SCALE.get(cond, 1.0)),
        "--actor.adam.weight_decay", "0.01", "--actor.max_norm", "1.0",
        "--actor.lr_scheduler", "constant_with_warmup", "--actor.lr_warmup_ratio", f"{LR_WARMUP_RATIO / passes:g}",
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


def step_record(status: dict, a: Args, cond: str = "none") -> dict:
    """The fields the analysis uses from one upstream status dict of a `cond` run.

    `train_tokens`: response tokens entering the policy loss in the step, over all its passes
    (fresh rows' mean length x fresh rows + replayed rows' mean length x replayed rows).
    `optimizer_steps`: the rows trained over the training batch, in whole batches (upstream's loader
    drops a remainder), inert rows included (they carry no loss but complete a last training batch,
    which is an optimizer step all the same). `generated_rollouts`: the dropped groups included:
    the session counts the prompts each step consumed (`lab/prompts_consumed`, which also holds
    those of a call that trained nothing); without it, replay's count, or upstream's filtering pass
    rate (accepted rollouts per consumed prompt x 100: the fresh rollouts over it are the prompts).
    `generated_tokens`, `groups`, `zero_variance_groups`: the response tokens and the groups the
    step's generation made, dropped ones included, and those of them whose rewards were all equal
    (counted by the session as each response is turned into a sample; absent in older runs)."""
    epochs = EPOCHS.get(cond, 1)  # passes over each batch
    fresh = status.get("rollout/num_samples", a.rollouts_of(cond))
    replayed = status.get("replay/replayed", status.get("replay/replayed_rollouts", 0.0)) or 0.0
    inert = status.get("replay/inert_rows", 0.0) or 0.0
    fresh_len = status.get("response_length", status["rollout/response_length_mean"])
    replay_len = status.get("replay/response_length_replay", fresh_len)
    generated = status.get("replay/generated_rollouts")
    if "lab/prompts_consumed" in status:
        generated = status["lab/prompts_consumed"] * a.group_size
    elif generated is None and status.get("dynamic_filtering_pass_rate"):
        generated = round(fresh * 100 / status["dynamic_filtering_pass_rate"]) * a.group_size
    counted = {k: status[f"lab/{k}"] for k in ("generated_tokens", "groups", "zero_variance_groups")
               if f"lab/{k}" in status}
    return {
        "step": status["step"],
        "reward": status["rollout/reward_mean"],
        "response_tokens": status["rollout/response_length_mean"],
        "generation_s": status["timing/generation"],
        "make_experience_s": status["timing/make_experience"],
        "ppo_train_s": status["timing/ppo_train"],
        "broadcast_s": status["timing/broadcast"],
        "fresh_rollouts": fresh,
        "generated_rollouts": fresh if generated is None else generated,
        "replayed_rollouts": replayed,
        "optimizer_steps": epochs * ((fresh + replayed + inert) // a.train_batch_of(cond)),
        "train_tokens": epochs * (fresh * fresh_len + replayed * replay_len),
        **counted,
        "replay": {k: v for k, v in status.items() if k.startswith("replay/") and isinstance(v, (int, float))},
    }


def command_script(cmd: list[str]) -> str:
    return "#!/usr/bin/env bash\ncd " + str(REPO) + "\n" + " ".join(map(_quote, cmd)) + "\n"


def _quote(word: str) -> str:
    return word if re.fullmatch(r"[\w./,:=@%+-]+", word) else "'" + word.replace("'", "'\\''") + "'"


def success_pool_path(a: Args) -> Path:
    return a.out_dir / "data" / "success_pool.npz"
