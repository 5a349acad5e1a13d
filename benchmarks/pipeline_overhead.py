"""What the replay work costs inside the real CPU pipeline, per GRPO step.

    python benchmarks/pipeline_overhead.py                    # tiny random Qwen3, 8 steps (~3 min)
    python benchmarks/pipeline_overhead.py --model smollm2 --steps 4

Runs `python -m openrlhf_replay.cli.train_ppo_ray --replay.mode advantage` on the CPU platform
(Ray, a vLLM CPU engine, DeepSpeed ZeRO-2, weight sync to vLLM), nothing stubbed, and reads from
its TensorBoard log, per step:

- `replay/overhead_s`: wall time of the replay work in the experience maker (turning the fresh
  experiences into rollout records, age eviction, the prioritised draw, storing, and turning the
  drawn rollouts into Experience micro-batches). Training on the replayed rollouts is the point
  of replay, not overhead, and is not counted.
- `timing/step_total`: upstream's wall time of the whole step (generation, reward, experience,
  training, weight broadcast).

The reward is a coin flip per response (a random model solves nothing, and without reward variance
nothing would be stored or drawn); the replay work does not depend on what the reward means.
Steps before the warm-up ends store but draw nothing: the figures are over the steps that draw.
The last line printed is one JSON object: step_s, replay_overhead_s, overhead_fraction (medians
over the measured steps) and the per-step lists.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.datasources import GSM8K_TRAIN_FILE, data_root  # noqa: E402
from openrlhf_replay.cpu.quickstart import prepare_data, prepare_model, read_scalars  # noqa: E402

COIN_REWARD = '''import torch


def reward_func(queries, prompts, labels):
    rewards = torch.tensor([float(len(q) % 2 == 0) for q in queries])
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": {}}
'''


def _prompts(path: Path, n: int) -> None:
    source = data_root() / GSM8K_TRAIN_FILE
    if source.is_file():
        prepare_data(source, path, n)
        return
    with open(path, "w") as f:  # no GSM8K here: simple sums, same shape of work
        for i in range(n):
            f.write(json.dumps({"prompt": f"What is {i} + {2 * i}? Put the answer in \\boxed{{}}.",
                                "label": str(3 * i)}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny (random 4M Qwen3), smollm2, or a model directory")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--samples-per-prompt", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=2, help="replay warm-up steps (not measured)")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the run here (default: a temp dir)")
    args = parser.parse_args()

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="pipeline_overhead_"))
    work.mkdir(parents=True, exist_ok=True)
    model = prepare_model(args.model)
    (work / "coin_reward.py").write_text(COIN_REWARD)
    _prompts(work / "prompts.jsonl", args.steps * args.prompts_per_step)
    fresh = args.prompts_per_step * args.samples_per_prompt
    env = dict(os.environ, OPENRLHF_REPLAY_DEVICE="cpu")
    env.pop("RAY_ADDRESS", None)
    print(f"pipeline_overhead: {args.steps} steps of {fresh} fresh rollouts, model {model}; log: {work / 'train.log'}",
          flush=True)
    t0 = time.monotonic()
    with open(work / "train.log", "w") as log:
        proc = subprocess.run(_command(args, model, work), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    if proc.returncode:
        sys.exit(f"pipeline_overhead: the run failed ({proc.returncode}); see {work / 'train.log'}")
    result = {"model": str(model)} | _measure(read_scalars(work / "tensorboard" / "run"), fresh)
    print(json.dumps(result | {"run_wall_s": round(time.monotonic() - t0, 1)}))


def _command(args: argparse.Namespace, model: Path, work: Path) -> list[str]:
    """The CPU training run measured: advantage replay, every other setting fixed."""
    fresh = args.prompts_per_step * args.samples_per_prompt
    return [
        sys.executable, "-m", "openrlhf_replay.cli.train_ppo_ray",
        "--actor.model_name_or_path", str(model),
        "--data.prompt_dataset", str(work / "prompts.jsonl"), "--data.input_key", "prompt",
        "--data.label_key", "label", "--data.apply_chat_template",
        "--data.max_len", str(args.max_new_tokens + 256),
        "--reward.remote_url", str(work / "coin_reward.py"),
        "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "1", "--vllm.sync_backend", "gloo",
        "--vllm.enforce_eager", "--ds.attn_implementation", "sdpa", "--ds.zero_stage", "2",
        "--ds.param_dtype", "bf16", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
        "--actor.eps_clip_low_high", "0.2", "0.28", "--actor.adam.lr", "1e-6", "--actor.lr_scheduler", "constant",
        "--rollout.batch_size", str(args.prompts_per_step),
        "--rollout.n_samples_per_prompt", str(args.samples_per_prompt),
        "--rollout.micro_batch_size", "8", "--rollout.max_new_tokens", str(args.max_new_tokens),
        "--train.batch_size", str(fresh // 2), "--train.micro_batch_size", "8", "--train.num_episodes", "1",
        "--replay.mode", "advantage", "--replay.warmup", str(args.warmup), "--replay.ratio", "0.5",
        "--ckpt.path", str(work / "ckpt"), "--ckpt.output_dir", str(work / "model"),
        "--logger.tensorboard_dir", str(work / "tensorboard"), "--logger.wandb.run_name", "run",
    ]


def _measure(scalars: dict, fresh: int) -> dict:
    """Per replaying step, the step's time and the replay work in it; their medians and shares."""
    overhead = scalars["train/replay/overhead_s"]
    step_total = scalars["train/timing/step_total"]
    replayed = scalars["train/replay/replayed"]
    measured = [s for s in sorted(step_total) if replayed.get(s, 0) > 0]
    if not measured:
        sys.exit("pipeline_overhead: no step drew replayed rollouts; raise --steps or lower --warmup")
    rows = [(s, step_total[s], overhead[s]) for s in measured]
    for s, total, over in rows:
        print(f"step {s}: step {total:7.2f} s, replay work {over * 1e3:7.2f} ms ({100 * over / total:.3f} %), "
              f"replayed {replayed[s]:.0f} + fresh {fresh}", flush=True)
    step_s = statistics.median(total for _, total, _ in rows)
    overhead_s = statistics.median(over for _, _, over in rows)
    return {
        "steps_measured": len(rows), "fresh_per_step": fresh,
        "replayed_per_step": statistics.median(replayed[s] for s in measured),
        "step_s": round(step_s, 4), "replay_overhead_s": round(overhead_s, 6),
        "overhead_fraction": round(overhead_s / step_s, 6),
        "overhead_fraction_max": round(max(over / total for _, total, over in rows), 6),
        "per_step_s": [round(total, 3) for _, total, _ in rows],
        "per_step_overhead_s": [round(over, 6) for _, _, over in rows],
    }


if __name__ == "__main__":
    main()
