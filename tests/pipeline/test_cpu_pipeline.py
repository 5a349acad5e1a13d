"""The real GRPO pipeline on the CPU platform, end to end, with a tiny random Qwen3.

Four runs of `python -m openrlhf_replay.cli.train_ppo_ray` (Ray, vLLM CPU engine, DeepSpeed
ZeRO-2 over gloo, weight broadcast to vLLM), nothing stubbed:

- `replay`: advantage-prioritised replay (warm-up 1) with two DeepSpeed ranks and one vLLM
  engine, over two episodes of a prompt file whose size is not a multiple of the batch (cut to
  whole batches by the launch policy), checked from the ranks' own reports; final HF model; a
  cosine LR schedule whose warm-up spans the first replayed step; KL as a loss (k3, a reference
  model), so replayed rows train with their stored reference log-probs; dynamic batching
  (token-budget micro-batches, replayed rows packed as fresh ones); PPO with a critic (`gae`, the
  tiny model as critic, one rank), so replayed rows get the current critic's values and GAE
  advantages, and the critic trains on them; its batches dumped (`OPENRLHF_REPLAY_DEBUG_DUMP_DIR`);
- `filter`: dynamic filtering with `--replay.refill`, uniform replay, two ranks, a reward that
  makes half the prompts' groups constant (`filter_reward.py`), so the filter drops them; with
  pre-rollout skipping (`--replay.skip`) over three episodes, so that from the second on the
  constant prompts are skipped and others take their place, its state saved every step;
- `control`: `--replay.mode none` with vLLM told to receive the broadcast weights but not load
  them (`OPENRLHF_REPLAY_DEBUG_SKIP_WEIGHT_LOAD=1`), the baseline for the weight-sync check.
- `rlep`: `--replay.mode success` (RLEP) with an offline pool that the pool script builds from the
  tiny model (the seed checkpoint), one rank, replaying from step 1 (an offline pool has no
  warm-up, whatever --replay.warmup says); each step's batch is dumped and the second's
  (`OPENRLHF_REPLAY_DEBUG_DUMP_DIR`) checked against the weights saved after step 1; a cosine
  LR schedule that decays to 0 over the run.

Resuming from a checkpoint (the buffer restored as saved, the step counter going on) is tested
by the runs of tests/faults/test_pipeline_faults.py, each of which resumes from the one before;
one rank with replay runs there and in the quickstart's tests.

The reward is `parity_reward.py` (a coin flip per response): a random model's math answers are
all wrong, which would leave every group without advantage and the buffer empty. Metrics are read
from the TensorBoard event files the runs write; log lines only where a metric cannot say it.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from openrlhf_replay.cpu.quickstart import read_scalars
from tiny_run import BATCHES, LARGE_LR, PLATFORM, read_histograms  # tests/support

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
REWARD = Path(__file__).with_name("parity_reward.py")
FILTER_REWARD = Path(__file__).with_name("filter_reward.py")
RUN_TIMEOUT_S = 600
STEPS_PER_EPISODE = 2  # data.max_samples / rollout.batch_size

COMMON = [
    "--reward.remote_url", str(REWARD), *PLATFORM, *BATCHES,
    "--algo.kl.init_coef", "0", "--algo.advantage.estimator", "group_norm",
    # vLLM's own log-probs travel with each sample; the actor logs their gap to its own as vllm_kl.
    "--algo.advantage.is_correction_level", "token",
    "--data.max_samples", str(4 * STEPS_PER_EPISODE),
    # A large step, so that a vLLM engine left with the old weights is far from the actor.
    *LARGE_LR,
    "--logger.wandb.run_name", "tb",
]
REPLAY = ["--replay.mode", "advantage", "--replay.warmup", "1", "--replay.ratio", "0.5"]
# Decaying LR schedules (after COMMON's constant one: the last flag wins). The replay run's 8 fresh
# optimizer steps warm up over 4 (rollout steps 1 and 2, step 2 replaying) and decay to 10 %; RLEP's
# 2 decay from the first step, at the full LR as before, to 0.
REPLAY_LR = ["--actor.lr_scheduler", "cosine_with_min_lr", "--actor.lr_warmup_ratio", "0.5"]
RLEP_LR = ["--actor.lr_scheduler", "cosine"]
KL_LOSS = ["--algo.kl.init_coef", "0.001", "--algo.kl.use_loss", "--algo.kl.estimator", "k3"]  # the replay run's
# Dynamic batching (upstream packs the samples; sdpa on CPU): rows of ~75 tokens, two to a budget of
# 160, so a rank's 4-row share of a training batch of 8 trains as 2 micro-batches, replayed rows too.
DYNAMIC_BATCH = ["--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", "160"]
# PPO with a critic: the tiny model with a value head, one rank (it divides the policy's two), a
# large step so its values move between steps.
CRITIC = ["--algo.advantage.estimator", "gae", "--critic.num_gpus_per_node", "1", "--critic.adam.lr", "1e-3"]


def _prompts(path: Path, n: int = 32) -> list[str]:
    """Small arithmetic word problems with their answers (also the tokenizer's corpus)."""
    rng = np.random.default_rng(0)
    texts = []
    with open(path, "w") as f:
        for _ in range(n):
            a, b = (int(x) for x in rng.integers(2, 50, 2))
            question = f"Sam has {a} apples and buys {b} more. How many apples does Sam have?"
            f.write(json.dumps({"prompt": question + "\nPut your final answer within \\boxed{}.",
                                "label": str(a + b)}) + "\n")
            texts += [question, f"Sam has {a + b} apples. The answer is \\boxed{{{a + b}}}."]
    return texts


def _run(tmp: Path, name: str, argv: list[str], env_extra: dict | None = None) -> dict:
    out = tmp / name
    out.mkdir(exist_ok=True)
    env = dict(os.environ, OPENRLHF_REPLAY_DEVICE="cpu", PYTHONUNBUFFERED="1", **(env_extra or {}))
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "openrlhf_replay.cli.train_ppo_ray", *COMMON, *argv,
           "--logger.tensorboard_dir", str(out / "tensorboard"), "--ckpt.output_dir", str(out / "final")]
    t0 = time.monotonic()
    with open(out / "log.txt", "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=RUN_TIMEOUT_S, start_new_session=True)
    text = (out / "log.txt").read_text(errors="replace")
    assert proc.returncode == 0, f"{name} run failed ({proc.returncode}); log tail:\n" + text[-6000:]
    return {"dir": out, "log": text, "scalars": read_scalars(out / "tensorboard" / "tb"),
            "histograms": read_histograms(out / "tensorboard" / "tb"),
            "seconds": time.monotonic() - t0}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from infra.models import build_tiny_qwen3

    tmp = tmp_path_factory.mktemp("cpu_pipeline")
    texts = _prompts(tmp / "prompts.jsonl")
    model = build_tiny_qwen3(tmp / "tiny-qwen3", corpus=texts, vocab_size=512)
    base = ["--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(tmp / "prompts.jsonl")]
    control = _run(tmp, "control", base + ["--replay.mode", "none", "--train.num_episodes", "1"],
                   env_extra={"OPENRLHF_REPLAY_DEBUG_SKIP_WEIGHT_LOAD": "1"})
    replay = _run(tmp, "replay", _two_rank_argv(tmp, model),
                  env_extra={"OPENRLHF_REPLAY_DEBUG_DUMP_DIR": str(tmp / "replay" / "dump")})
    rlep = _run(tmp, "rlep", _rlep_argv(tmp, model, _build_pool(tmp, model)),
                env_extra={"OPENRLHF_REPLAY_DEBUG_DUMP_DIR": str(tmp / "rlep" / "dump")})
    filtered = _run(tmp, "filter", _filter_argv(tmp, model))
    runs = {"replay": replay, "control": control, "rlep": rlep, "filter": filtered}
    for name, run in runs.items():
        print(f"{name}: {run['seconds']:.0f} s")
    return {"model": model, **runs}


def _two_rank_argv(tmp: Path, model: Path) -> list[str]:
    """10 prompts, batches of 4: the launch policy trains on the first 8, two steps an episode."""
    from openrlhf_replay.cli.prompts import count_rows, whole_batches

    data = tmp / "ten_prompts.jsonl"
    data.write_text("".join((tmp / "prompts.jsonl").read_text().splitlines(keepends=True)[:10]))
    return ["--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(data),
            "--data.max_samples", str(whole_batches(count_rows(str(data)), 4)),
            "--actor.num_gpus_per_node", "2", "--train.micro_batch_size", "4", "--train.num_episodes", "2",
            "--ckpt.path", str(tmp / "replay_ckpt"), *REPLAY, *REPLAY_LR, *KL_LOSS, *DYNAMIC_BATCH,
            *CRITIC, "--critic.model_name_or_path", str(model)]


def _filter_argv(tmp: Path, model: Path) -> list[str]:
    """Dynamic filtering with refill, two ranks, uniform replay from step 2, three steps of 4
    prompts: 12 prompts, half of them answered by a multiple of 3, whose groups the filter reward
    makes constant and dynamic filtering drops."""
    rows = [json.loads(line) for line in (tmp / "prompts.jsonl").read_text().splitlines()]
    thirds = [r for r in rows if int(r["label"]) % 3 == 0][:6]
    data = tmp / "filter_prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in thirds + [r for r in rows if r not in thirds][:6]))
    return ["--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(data), "--data.max_samples", "12",
            "--actor.num_gpus_per_node", "2", "--train.num_episodes", "3", "--reward.remote_url", str(FILTER_REWARD),
            "--replay.mode", "uniform", "--replay.warmup", "1", "--replay.ratio", "0.5",
            "--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0.01", "0.99", "--replay.refill",
            "--replay.skip", "--ckpt.path", str(tmp / "filter_ckpt"), "--ckpt.save_steps", "1", "--ckpt.disable_ds",
            "--ckpt.max_num", "100"]


def _build_pool(tmp: Path, model: Path) -> Path:
    """RLEP's offline pool, built by the pool script from the tiny model (the seed checkpoint) on
    the run's 8 prompts, graded by the run's reward."""
    pool = tmp / "pool.npz"
    cmd = [sys.executable, "-m", "openrlhf_replay.cli.build_success_pool", "--backend", "hf", "--model", str(model),
           "--prompts", str(tmp / "prompts.jsonl"), "--input-key", "prompt", "--label-key", "label",
           "--apply-chat-template", "--max-samples", "8", "--samples-per-prompt", "4", "--max-new-tokens", "16",
           "--max-len", "128", "--reward", str(REWARD), "--out", str(pool)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0 and pool.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return pool


def _rlep_argv(tmp: Path, model: Path, pool: Path) -> list[str]:
    """RLEP with the offline pool, one rank, one episode (2 steps), warm-up 1 (not applied to an
    offline pool); the weights after step 1
    saved as an HF model, so the test can compute the current policy's log-probs of step 2. Training
    batches of 16: at most 4 x 2 replayed rows, so inert rows always complete the batch."""
    return ["--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(tmp / "prompts.jsonl"),
            "--train.num_episodes", "1", "--train.batch_size", "16", "--replay.mode", "success", "--replay.warmup", "1",
            "--replay.success_pool", str(pool), "--ckpt.path", str(tmp / "rlep_ckpt"), "--ckpt.save_steps", "1",
            "--ckpt.save_hf", "--ckpt.disable_ds", *RLEP_LR]


def _by_step(run, key) -> dict[int, float]:
    return run["scalars"].get(f"train/{key}", {})


def test_replayed_rollouts_were_in_the_training_batches(runs):
    run = runs["replay"]
    drawn = _by_step(run, "replay/replayed")  # the buffer's count of rollouts drawn for the step
    # warm-up step 1: the buffer only fills; then round(0.5 x 16 fresh / train.batch_size 8) x 8
    assert drawn == {1: 0, 2: 8, 3: 8, 4: 8}
    # The fraction of rows the training actors saw flagged as replayed: they reached the loss.
    assert _by_step(run, "replay/is_replayed")[2] == pytest.approx(8 / 24)
    assert _by_step(run, "replay/clip_frac_replay")[2] >= 0  # split statistics from the actors' loss
    assert _by_step(run, "replay/size")[2] > 0


def test_tensorboard_draws_each_replayed_rows_age_and_uses_and_the_zero_variance_share(runs):
    """Per step after the warm-up, the event file holds a histogram of the replayed rows' ages and
    one of their uses (this one included), each with a value per row replayed: the ages those of the
    rows the experience maker dumped. The warm-up step draws none. The zero-variance share is that
    of the dumped step's fresh groups (prompts). Replay off draws no histogram."""
    run = runs["replay"]
    ages, uses = (run["histograms"].get(f"train/replay/replayed_{k}", {}) for k in ("age", "uses"))
    assert sorted(ages) == sorted(uses) == [2, 3, 4]
    dumps = {int(p.stem[len("step"):]) + 1: json.loads(p.read_text()) for p in (run["dir"] / "dump").glob("step*.json")}
    for step in (2, 3, 4):
        dump = dumps[step]
        dumped = dump["step"] - np.array(dump["stored_versions"])  # the buffer counts steps from 0
        assert ages[step].num == uses[step].num == len(dumped) == _by_step(run, "replay/replayed")[step] == 8
        assert (ages[step].min, ages[step].max, ages[step].sum) == (dumped.min(), dumped.max(), dumped.sum())
        assert uses[step].min >= 1 and uses[step].max == _by_step(run, "replay/reuse_max")[step]
        assert uses[step].sum == pytest.approx(8 * _by_step(run, "replay/reuse_mean")[step])
        groups: dict[tuple, set] = {}
        for r in dump["rows"]:
            if not r["replayed"]:
                groups.setdefault(_prompt_of(r), set()).add(r["reward"])
        share = sum(len(rewards) == 1 for rewards in groups.values()) / len(groups)
        assert len(groups) == 4 and _by_step(run, "replay/zero_variance_group_fraction")[step] == pytest.approx(share)
    assert uses[2].max == 1  # the first replaying step: no row was replayed before
    assert not runs["control"]["histograms"]
    # With dynamic filtering the share is of the groups kept: every constant group was dropped.
    assert set(_by_step(runs["filter"], "replay/zero_variance_group_fraction").values()) == {0.0}


def test_kl_as_a_loss_trains_and_is_logged_for_fresh_and_replayed_rows(runs):
    """The replay run has KL as a loss: every replayed row brings its stored reference log-probs
    (zeros in their place would show as a KL far above the fresh rows'). Both kinds' KL to the
    reference is logged per step; after step 1's update (LR 1e-3) the policy has moved from it."""
    run = runs["replay"]
    fresh, replayed = _by_step(run, "replay/kl_fresh"), _by_step(run, "replay/kl_replay")
    assert set(fresh) == {1, 2, 3, 4} and set(replayed) == {2, 3, 4}
    for step in (2, 3, 4):
        assert math.isfinite(replayed[step]) and 0 < replayed[step] < 1, (step, replayed, fresh)
        assert 0 < fresh[step] < 1
    assert "kl_fresh" not in runs["control"]["log"]  # mode none logs upstream's keys only


def test_losses_are_finite_and_the_weights_changed(runs):
    from safetensors.torch import load_file

    for name in ("replay", "control"):
        for key in ("policy_loss", "actor_grad_norm"):
            values = _by_step(runs[name], key)
            assert values and all(math.isfinite(v) for v in values.values()), (name, key, values)
    before = load_file(str(runs["model"] / "model.safetensors"))
    after = load_file(str(runs["replay"]["dir"] / "final" / "model.safetensors"))
    common = set(before) & set(after)  # the initial save drops the lm_head tied to the embedding
    assert len(common) >= len(before) - 1
    changed = [k for k in common if not np.allclose(before[k].float().numpy(), after[k].float().numpy(), atol=1e-3)]
    assert len(changed) > len(common) // 2, f"only {changed} changed"


def test_vllm_generates_with_the_synced_weights(runs):
    """After a step, vLLM's log-probs of its samples equal the actor's (vllm_kl ~ 0) only when the
    new weights reached it: in the control, vLLM keeps the initial weights and the gap is the KL
    between the initial and the trained policy."""
    synced = [v for step, v in _by_step(runs["replay"], "vllm_kl").items()
              if step >= 2]  # after an update (rank 0 broadcasts its copy)
    stale = _by_step(runs["control"], "vllm_kl")[2]
    assert synced and max(abs(v) for v in synced) < 2e-3, synced
    assert stale > 1e-2 and stale > 10 * max(abs(v) for v in synced), (stale, synced)
    # Step 1 runs before any update: both engines hold the initial weights.
    assert abs(_by_step(runs["control"], "vllm_kl")[1]) < 2e-3


def test_every_process_computes_in_the_chosen_dtype(runs):
    """The launcher chose one dtype for this CPU (fp32 without native bf16); the actor's weights, the
    vLLM engine, the weight sync and the saved model all use it."""
    from safetensors.torch import load_file

    from infra.hardware import choose_cpu_dtype

    chosen = choose_cpu_dtype()
    for name in ("replay", "control"):
        log = runs[name]["log"]
        assert f"cpu platform: compute dtype {chosen.name} (" in log, name
        for what in ("model weights", "vLLM engine weights", "weight sync to vLLM"):
            assert set(re.findall(rf"cpu platform: {what} in (\w+)", log)) == {chosen.torch_name}, (name, what)
        engine_config = re.findall(r"Initializing a V1 LLM engine .*? dtype=torch\.(\w+)", log)
        assert engine_config and set(engine_config) == {chosen.torch_name}, name
    saved = load_file(str(runs["replay"]["dir"] / "final" / "model.safetensors"))
    assert {str(t.dtype) for t in saved.values()} == {f"torch.{chosen.torch_name}"}


def test_two_ranks_train_alike_across_an_episode_boundary(runs):
    """Each rank reports what it trained on; the controller logs the min and max over ranks. Equal
    means balanced: the same rows and optimizer steps, and the same weights (ZeRO-2 keeps a full
    copy on every rank). With dynamic batching, upstream deals the rows by length (one Experience
    a rank, fresh and replayed mixed) and packs them by tokens; every fresh and replayed row, summed
    over the ranks, reached the loss (upstream's own packing trained only the fresh steps' worth)."""
    run = runs["replay"]
    assert sorted(_by_step(run, "policy_loss")) == [1, 2, 3, 4]  # two episodes of two steps
    for name, expected in (("trained_rows", {1: 8, 2: 12, 3: 12, 4: 12}),  # (16 fresh + 8 replayed) / 2 ranks
                           ("optimizer_steps", {1: 2, 2: 3, 3: 3, 4: 3})):  # batches of 8 rows
        low, high = _by_step(run, f"replay/rank_{name}_min"), _by_step(run, f"replay/rank_{name}_max")
        assert low == high == expected, (name, low, high)
    assert _by_step(run, "replay/trained_rows_fresh") == {1: 16, 2: 16, 3: 16, 4: 16}
    assert _by_step(run, "replay/trained_rows_replayed") == _by_step(run, "replay/replayed") == {1: 0, 2: 8, 3: 8, 4: 8}
    assert "cpu platform: attention sdpa (upstream set flash_attention_2 for packed samples)" in run["log"]
    low, high = _by_step(run, "replay/rank_weights_checksum_min"), _by_step(run, "replay/rank_weights_checksum_max")
    assert sorted(low) == [1, 2, 3, 4] and low == high, (low, high)
    assert len(set(low.values())) == 4  # the weights did change each step: the checksum sees it


def test_dynamic_filtering_with_refill_trains_replayed_rows_in_the_dropped_groups_place(runs):
    """No prompt replaces a dropped group (4 prompts generated a step, the dropped ones counted);
    replayed rollouts take its rows after the warm-up, inert rows before it; both ranks train the
    same rows and take the same optimizer steps on every step, fresh ones short or not. Checked
    over the first episode, where pre-rollout skipping has no history yet and skips nothing."""
    run = runs["filter"]
    steps = [1, 2, 3]
    assert _by_step(run, "replay/skip_loader_passes")[3] == 1.0
    generated, filtered = _by_step(run, "replay/generated_rollouts"), _by_step(run, "replay/filtered_rollouts")
    assert {t: generated[t] for t in steps} == dict.fromkeys(steps, 16.0)  # 4 prompts x 4: no replacement
    assert sum(filtered.values()) >= 8 and filtered[2] + filtered[3] > 0, filtered  # half the prompts are constant
    fresh, replayed = _by_step(run, "replay/trained_rows_fresh"), _by_step(run, "replay/trained_rows_replayed")
    inert, refilled = _by_step(run, "replay/trained_rows_inert"), _by_step(run, "replay/refilled_rows")
    for t in steps:
        assert fresh[t] == 16 - filtered[t]  # the groups kept, every row of them trained
        assert replayed[t] == _by_step(run, "replay/replayed")[t]
        usual = 0 if t == 1 else 8  # ratio 0.5 of the 16 generated, after the warm-up
        assert replayed[t] == usual + refilled[t] and refilled[t] + inert[t] >= filtered[t]
        assert (fresh[t] + replayed[t] + inert[t]) % 8 == 0  # whole training batches
        for name, expected in (("trained_rows", (fresh[t] + replayed[t] + inert[t]) / 2),
                               ("optimizer_steps", (fresh[t] + replayed[t] + inert[t]) / 8)):
            low, high = _by_step(run, f"replay/rank_{name}_min")[t], _by_step(run, f"replay/rank_{name}_max")[t]
            assert low == high == expected, (t, name, low, high)
    assert refilled[1] == 0 and inert[1] == filtered[1]  # the warm-up: the dropped rows are inert
    assert refilled[2] + refilled[3] > 0  # after it, replay stands in for them
    assert all(math.isfinite(v) for v in _by_step(run, "policy_loss").values())
    assert "replay.refill: dynamic filtering dropped" in run["log"]


def test_pre_rollout_skipping_skips_constant_prompts_keeps_batches_full_and_saves_its_state(runs):
    """From the second pass over the loader on, prompts whose groups were constant are skipped
    before generation and the loader's next prompts fill the step (4 prompts generated on every
    step: a pass's tail too short for a batch is deferred); the prompts drawn add up to the passes
    logged; the state saved with each step's checkpoint is the generator's as of that step."""
    from replay import load_state
    from replay.skip import HARD

    run = runs["filter"]
    skipped, drawn = _by_step(run, "replay/skip_skipped_prompts"), _by_step(run, "replay/skip_drawn_prompts")
    deferred = _by_step(run, "replay/skip_deferred_prompts")
    generated, passes = _by_step(run, "replay/generated_rollouts"), _by_step(run, "replay/skip_loader_passes")
    steps = sorted(generated)
    assert sorted(skipped) == steps and len(steps) > 3
    assert all(skipped[t] == 0 for t in steps if passes[t] <= 1) and sum(skipped.values()) > 0, skipped
    fresh, filtered = _by_step(run, "replay/trained_rows_fresh"), _by_step(run, "replay/filtered_rollouts")
    for t in steps:
        # A skipped prompt generates nothing (a call whose groups were all dropped is counted, skips
        # and rollouts alike, with the next step).
        assert generated[t] == 4 * (drawn[t] - skipped[t] - deferred[t]), t
        assert fresh[t] + filtered[t] == 16, (t, fresh[t], filtered[t], passes[t])  # its call sent a full batch
    # TensorBoard keeps float32: the passes logged are 12ths
    assert sum(drawn.values()) == pytest.approx(passes[steps[-1]] * 12) and passes[steps[-1]] >= 2.5
    share = _by_step(run, "replay/skip_zero_variance_share")
    assert all(0 <= share[t] <= 1 for t in steps) and max(share.values()) > 0  # the constant prompts' groups
    for t in steps:
        state = load_state(runs["filter"]["dir"].parent / "filter_ckpt" / "_replay" / f"skip_global_step{t}.npz")
        assert state["prompts_drawn"] == pytest.approx(passes[t] * 12), t
        assert state["explore"] == pytest.approx([_by_step(run, f"replay/skip_explore_{k}")[t] for k in ("easy", "hard")])
        if passes[t] >= 1:  # every prompt generated once: the 6 that always score 0 are hard
            assert (state["kinds"] == HARD).sum() >= 6 and len(state["uids"]) == 12, t
    assert "replay.skip: saved the history of 12 prompts" in run["log"]


def test_the_critic_trains_on_replayed_rows_too(runs):
    """The critic group receives the same rows as the policy actors, replayed ones included, and
    every one reached its loss (its single rank packs them all under dynamic batching); its loss is
    finite and it takes the policy's optimizer steps."""
    run = runs["replay"]
    assert _by_step(run, "replay/critic_trained_rows_fresh") == {1: 16, 2: 16, 3: 16, 4: 16}
    assert _by_step(run, "replay/critic_trained_rows_replayed") == _by_step(run, "replay/replayed")
    low, high = (_by_step(run, f"replay/rank_critic_optimizer_steps_{m}") for m in ("min", "max"))
    assert low == high == {1: 2, 2: 3, 3: 3, 4: 3}  # batches of 8: (16 fresh + 8 replayed) / 8
    losses = _by_step(run, "critic_loss")
    assert sorted(losses) == [1, 2, 3, 4] and all(math.isfinite(v) for v in losses.values()), losses


# The critic computes in bf16: one value in two batches of different shape may differ by a rounding
# step (seen on a fresh clone: 0.34765625 against 0.349609375), at most 2**-7 of its size.
_BF16_STEP = 2**-7


def test_replayed_rows_get_the_current_critics_values(runs):
    """A causal critic's value at a row's first action column sees the prompt only. So a replayed
    row's value there equals the value the critic gives the step's fresh rows of the same prompt
    (the second episode revisits the first's prompts). The critic trains between steps, so no
    replayed row carries the values its rollout had when fresh (a stored copy would match at every
    action column), and at least one has moved at its first column by more than rounding (one row
    moved there by a single bf16 step in a suite run, so not every one is asked to). Values,
    returns and advantages are finite."""
    run = runs["replay"]
    dumps = {int(p.stem[len("step"):]): json.loads(p.read_text()) for p in (run["dir"] / "dump").glob("step*.json")}
    assert sorted(dumps) == [1, 2, 3]  # the steps that replay (counted from 0)

    def first(row):
        return row["action_mask"].index(True)

    same_prompt, moved = 0, []  # (value when fresh, value replayed) of each replayed row seen fresh
    seen: dict[tuple, list[float]] = {}  # a sequence's values when it was fresh
    for step in sorted(dumps):
        rows = dumps[step]["rows"]
        fresh = {}
        for r in rows:
            if not r["replayed"]:
                fresh.setdefault(_prompt_of(r), []).append(r["values"][first(r)])
        for r in rows:
            assert all(math.isfinite(x) for x in r["values"] + r["returns"] + [r["advantage"]]), r
            if not r["replayed"]:
                continue
            value = r["values"][first(r)]
            if _prompt_of(r) in fresh:
                same_prompt += 1
                others = fresh[_prompt_of(r)]
                assert all(abs(v - value) <= _BF16_STEP * abs(v) for v in others), (step, value, others)
            then = seen.get(tuple(r["sequence"]))
            if then is not None:
                moved.append((then[first(r)], value))
                actions = [i for i, m in enumerate(r["action_mask"]) if m]
                assert [then[i] for i in actions] != [r["values"][i] for i in actions], (step, value)  # not a copy
        seen.update({tuple(r["sequence"]): r["values"] for r in rows if not r["replayed"]})
    assert same_prompt >= 1 and moved, (same_prompt, moved)
    # Stored values would not move at all; the current critic's do, one at least beyond rounding.
    assert any(abs(then - now) > 2 * _BF16_STEP * abs(now) for then, now in moved), moved


def _grpo_lrs(schedule: str, max_steps: int, fresh_steps: int, warmup_ratio: float = 0.0) -> dict[int, float]:
    """The `actor_lr` GRPO logs after each rollout step: the LR after its last optimizer step, from
    the scheduler `DeepspeedStrategy.prepare` builds (sized by `get_max_steps`), stepped once per
    optimizer step, `fresh_steps` a rollout step."""
    import torch
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    kwargs = {"min_lr_rate": 0.1} if schedule == "cosine_with_min_lr" else {}
    scheduler = get_scheduler(schedule, optimizer, num_warmup_steps=math.ceil(max_steps * warmup_ratio),
                              num_training_steps=max_steps, scheduler_specific_kwargs=kwargs)
    lrs = {}
    for step in range(1, max_steps // fresh_steps + 1):
        for _ in range(fresh_steps):
            optimizer.step()
            scheduler.step()
        lrs[step] = scheduler.get_last_lr()[0]
    return lrs


def test_a_decaying_lr_follows_rollout_steps_whatever_replay_adds(runs):
    """The schedule is sized from the fresh batches (upstream's `get_max_steps`) and paced by rollout
    steps (`openrlhf_replay/trainer/lr_schedule.py`): after every rollout step the LR is GRPO's after
    the same step, replayed or not, and the run ends on the schedule's end value. Stepped once per
    optimizer step, the replay run would log the schedule at 2, 5, 8, 11 of its 8 steps."""
    replay, rlep = runs["replay"], runs["rlep"]
    assert _by_step(replay, "replay/rank_optimizer_steps_max") == {1: 2, 2: 3, 3: 3, 4: 3}
    grpo = _grpo_lrs("cosine_with_min_lr", 8, 2, warmup_ratio=0.5)  # 8 fresh steps, 2 a rollout step
    assert grpo[2] == 1e-3 and grpo[4] == pytest.approx(1e-4)  # the warm-up ends after step 2; 10 % at the end
    assert _by_step(replay, "actor_lr") == pytest.approx(grpo, rel=1e-6)  # float32 in TensorBoard
    # RLEP: one fresh optimizer step a rollout step, and one of its replayed and inert rows.
    assert _by_step(rlep, "replay/rank_optimizer_steps_max") == {1: 2, 2: 2}
    assert _by_step(rlep, "actor_lr") == pytest.approx(_grpo_lrs("cosine", 2, 1)) == {1: 5e-4, 2: 0.0}


def test_mode_none_runs_the_plain_pipeline(runs):
    control = runs["control"]
    assert sorted(_by_step(control, "policy_loss")) == [1, 2]
    assert not any(tag.startswith("train/replay/") for tag in control["scalars"])
    assert (control["dir"] / "final" / "model.safetensors").is_file()


def _second_step(run) -> dict:
    """The batch of logged step 2 (the buffer counts from 0), the run's second replaying step, as
    the experience maker dumped it (`openrlhf_replay/trainer/ppo_utils/debug_dump.py`)."""
    dumps = sorted((run["dir"] / "dump").glob("step*.json"))
    assert [d.name for d in dumps] == ["step0.json", "step1.json"], dumps  # an offline pool: no warm-up
    return json.loads(dumps[1].read_text())


def _log_probs(model, sequence: list[int]) -> np.ndarray:
    """(len - 1,) log-probs of each next token under `model` (column j scores token j + 1)."""
    import torch

    ids = torch.tensor([sequence])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, ids[0, 1:, None]).squeeze(-1).numpy()


def _prompt_of(row: dict) -> tuple:
    return tuple(row["sequence"][: row["action_mask"].index(True) + 1])


def test_rlep_replays_the_offline_pool_from_the_first_step(runs):
    """An offline pool replays from step 1 (the run's --replay.warmup 1 is for pools that fill
    during the run). Step 2 draws new prompts, which the in-run pool could not have: the offline
    pool gives each min(M = 2, its successes in the pool); the pool stays as built (the run's own
    successes stay out); inert rows complete the last training batch."""
    from openrlhf_replay.trainer.ppo_utils.experience import prompt_uid
    from replay.pool import load_pool

    run = runs["rlep"]
    pool = load_pool(run["dir"].parent / "pool.npz")
    assert "from the offline pool" in run["log"]
    replayed, size = _by_step(run, "replay/replayed"), _by_step(run, "replay/size")
    assert replayed[1] > 0 and replayed[2] > 0
    assert set(size.values()) == {len(pool.rollouts)}
    dump = _second_step(run)
    rows = [r for r in dump["rows"] if r["replayed"] and not r["inert"]]
    step_prompts = {_prompt_of(r) for r in dump["rows"] if not r["replayed"]}
    per_prompt = pool.successes_per_prompt()
    got = {p: sum(_prompt_of(r) == p for r in rows) for p in step_prompts}
    want = {p: min(2, per_prompt.get(prompt_uid(np.array(p, np.int32)), 0)) for p in step_prompts}
    assert got == want and sum(want.values()) == replayed[2]
    assert dump["inert"] == 16 - sum(want.values()) == _by_step(run, "replay/inert_rows")[2] > 0
    assert sum(r["inert"] for r in dump["rows"]) == dump["inert"]
    assert all(not any(r["action_mask"]) and r["advantage"] == 0 for r in dump["rows"] if r["inert"])
    # Inert rows reach the actors, flagged, and train nothing: the loss stays finite, two whole
    # optimizer steps of 16 rows (16 fresh + replayed + inert).
    assert _by_step(run, "replay/is_inert")[2] == pytest.approx(dump["inert"] / 32)
    assert _by_step(run, "replay/rank_optimizer_steps_max") == {1: 2, 2: 2}
    assert all(math.isfinite(v) for v in _by_step(run, "policy_loss").values())


def test_rlep_recomputes_pi_old_of_replayed_rows_and_keeps_grpo_elsewhere(runs):
    """On the first replayed step: replayed rows' pi_old is the current policy's log-prob (as
    close as fresh rows' pi_old, which upstream computes with it, and far from the seed's stored
    log-probs), with importance weight 1; fresh rows keep upstream's pi_old and vLLM's behaviour
    log-probs; advantages are GRPO's outside the enlarged groups and group_normalise over G + M
    inside them."""
    import torch
    from transformers import AutoModelForCausalLM

    from infra.hardware import choose_cpu_dtype
    from replay import group_normalise

    run = runs["rlep"]
    dump = _second_step(run)
    # The weights step 2 trains from: saved after step 1, in the run's compute dtype.
    current = AutoModelForCausalLM.from_pretrained(run["dir"].parent / "rlep_ckpt" / "global_step1_hf", dtype="auto")
    rows = [r for r in dump["rows"] if not r["inert"]]
    gaps: dict[str, list[float]] = {"fresh": [], "replay": [], "seed": []}
    replayed_current = []  # the current policy's log-probs of each replayed row, in batch order
    for r in rows:
        mask = np.array(r["action_mask"])
        ours = _log_probs(current, r["sequence"])[mask]
        pi_old, behaviour = np.array(r["pi_old"])[mask], np.array(r["pi_behaviour"])[mask]
        gaps["replay" if r["replayed"] else "fresh"].append(float(np.abs(pi_old - ours).max()))
        if r["replayed"]:
            assert np.array_equal(behaviour, pi_old) and r["is_weight"] == 1.0  # no importance weight
            replayed_current.append(ours)
        else:  # upstream's: vLLM's sampling log-probs, close to the trainer's own with synced weights
            assert r["is_weight"] == 1.0 and np.abs(behaviour - pi_old).mean() < 0.05
    # One rank: the replayed rows come in the order they were drawn, as the stored log-probs.
    assert len(replayed_current) == len(dump["stored_behaviour"])
    for stored, ours in zip(dump["stored_behaviour"], replayed_current):
        gaps["seed"].append(float(np.abs(np.array(stored) - ours).mean()))
    rounding = max(gaps["fresh"])
    assert rounding < 0.1, gaps["fresh"]  # the two engines agree to the compute dtype's rounding
    # In bf16 a row's log-probs also move with the padded shape of the micro-batch it is computed in
    # (the matmuls sum in another order): a replayed row differed by 0.002 where every fresh row of
    # that run agreed to 4e-6 (a native-bf16 Xeon). Up to 0.01 is that noise; the stale anchor below
    # is farther off still.
    shape_noise = 0.01 if choose_cpu_dtype().name == "bf16" else 1e-4
    assert max(gaps["replay"]) <= 2 * rounding + shape_noise, (gaps["replay"], rounding)
    assert min(gaps["seed"]) > 5 * max(gaps["replay"]), gaps  # the stale anchor would be far off
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(_prompt_of(r), []).append(r)
    enlarged = 0
    for members in groups.values():
        rewards = np.array([m["reward"] for m in members], np.float32)
        if any(m["replayed"] for m in members):
            enlarged += 1
            want = group_normalise(rewards, np.zeros(len(members), np.int64))
        else:  # upstream's group_norm over the G fresh rows
            t = torch.from_numpy(rewards)
            want = ((t - t.mean()) / (t.std() + 1e-9)).numpy()
        assert np.allclose([m["advantage"] for m in members], want, atol=1e-4), members
    assert enlarged >= 1

