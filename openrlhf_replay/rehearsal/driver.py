"""The rehearsal's driver: resolve the command as the launcher would, build the real controller
over the stand-ins (`standins.py`), walk every step of every episode (and one resume), and report
what it saw (`report.py` renders it). What a rehearsal checks: the package docstring, which is also
`python -m openrlhf_replay.rehearsal --help`.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import os
import shlex
import statistics
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from openrlhf_replay.cli.train_ppo_ray import describe_replay
from openrlhf_replay.cli.validate import (REPLAY_CLI, UPSTREAM_CLI, Invalid, flatten_args, launch_errors,
                                          resolve_training, split_command)
from openrlhf_replay.cpu import DEVICE_ENV, _hook
from openrlhf_replay.rehearsal.async_run import build_controller, controller_class, install_generation
from openrlhf_replay.rehearsal.pool import build_stand_in_pool, missing_pool
from openrlhf_replay.rehearsal.report import off_policy, replay_distribution, spread
from openrlhf_replay.rehearsal.standins import (Generation, Rank, Settings, Shadow, ShadowRank, actor_group,
                                                in_process_object_store, write_tokenizer)
from openrlhf_replay.utils import world_size
from replay import ReplayConfig
from replay.checkpoint import state_digest

# Deferred imports (upstream's trainer and strategy, this project's controller, the LR scheduler)
# load upstream modules the CPU platform adapts: they come after `_rehearsal_environment` has
# installed its hooks.


class _Resume(Exception):
    """Raised after the resume step's checkpoint: the controller is rebuilt from it."""


# ------------------------------------------------------------------------------ the run


@dataclass
class Record:
    """What the rehearsal saw, step by step."""

    steps: list[dict] = field(default_factory=list)
    episodes_done: int = 0
    prompts_generated: int = 0  # generated for training, dynamic filtering's replacement prompts included
    episode: int = 0  # of the step being generated
    checkpoints: list[int] = field(default_factory=list)
    resumed_at: int | None = None
    crash: str | None = None
    crash_step: int | None = None
    critic: list = field(default_factory=list)  # the critic group's stand-in ranks (`gae`), else none
    generations: list = field(default_factory=list)  # each build's generation stand-in (what it generated)


def _controller_class(module: str, args):
    if module != REPLAY_CLI:
        return controller_class("upstream", args.train.async_enable)
    launcher = "replay" if ReplayConfig.from_namespace(args).active else "resume"  # replay off: resume.py's
    return controller_class(launcher, args.train.async_enable)


def _build(cls, args, tokenizer_dir: Path, ranks: list[Rank], settings: Settings, rng, record: Record,
           shadows: list[Shadow]):
    """The controller, as upstream's `train()` builds it, over the stand-in ranks and generation."""
    from openrlhf.utils import get_strategy

    duplicate = args.ds.ring_attn_size * args.ds.tensor_parallel_size
    reference = None
    if args.algo.kl.init_coef > 0:  # KL needs the reference model's log-probs: stand-in ranks give them
        reference = actor_group([Rank(r, args, 1, rng) for r in range(args.ref.num_nodes * args.ref.num_gpus_per_node)],
                                duplicate)
    critic = actor_group(record.critic, duplicate) if record.critic else None  # its forward gives values
    trainer, generator, training = build_controller(  # async: its two actors, on threads (`async_run.py`)
        cls, args, (str(tokenizer_dir), get_strategy(args), actor_group(ranks, duplicate), critic, None, reference, []),
        dict(do_sample=True, max_len=args.data.max_len, max_new_tokens=args.rollout.max_new_tokens,
             temperature=args.rollout.temperature, top_p=args.rollout.top_p))
    sg = generator.samples_generator
    record.generations.append(Generation(sg, training.tokenizer, args, settings, rng))
    install_generation(generator, record.generations[-1])

    generate = sg.generate_samples

    def generate_samples(**kwargs):
        record.episode = record.episodes_done
        out = generate(**kwargs)
        record.prompts_generated += out[2]  # upstream's count of the prompts it drew and generated
        if out[3]:  # exhausted: this episode's last batch
            record.episodes_done += 1
        return out

    sg.generate_samples = generate_samples
    step_fn, save_fn = training.train_step, training.save_logs_and_checkpoints

    def train_step(rollout_samples, global_step):
        # Upstream logs (and checkpoints) this step as global_step + 1; the buffer's step is global_step.
        record.crash_step = global_step + 1
        status, next_step = step_fn(rollout_samples, global_step)
        record.steps.append({"step": next_step, "episode": record.episode, **_step_figures(status, ranks)})
        for shadow in shadows:
            shadow.step(len(rollout_samples), getattr(training.experience_maker, "composition", None), next_step)
        return status, next_step

    def save_logs_and_checkpoints(global_step, logs_dict=None, client_states=None):
        save_fn(global_step, logs_dict, client_states)
        if global_step % args.ckpt.save_steps:
            return
        record.checkpoints.append(global_step)
        _check_replay_round_trip(training, args, ranks[0].checkpoint_states)
        if global_step == settings.resume_at and record.resumed_at is None:
            record.resumed_at = global_step
            raise _Resume()

    training.train_step, training.save_logs_and_checkpoints = train_step, save_logs_and_checkpoints
    return trainer


def _step_figures(status: dict, ranks: list[Rank]) -> dict:
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


def _check_replay_round_trip(trainer, args, client_states: dict) -> None:
    """The replay file written with this checkpoint restores the buffer in memory, exactly."""
    replay = getattr(trainer, "replay", None)
    if replay is None or not replay.config.enabled:
        return
    from openrlhf_replay.trainer.ppo_trainer import restore_replay_state

    restored = restore_replay_state(client_states, args, replay.config)
    if state_digest(restored.state_dict()) != state_digest(replay.state_dict()):
        raise RuntimeError(f"the replay checkpoint of step {client_states.get('global_step')} does not restore "
                           "the buffer that wrote it")


def _scheduler(args, max_steps: int):
    """The actor's LR scheduler as upstream's strategy builds it, over a one-parameter optimizer."""
    import torch
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=args.actor.adam.lr)
    kwargs = ({"min_lr_rate": args.actor.min_lr_ratio}
              if args.actor.lr_scheduler in ("cosine_with_min_lr", "cosine_warmup_with_min_lr") else {})
    return get_scheduler(args.actor.lr_scheduler, optimizer, num_warmup_steps=_warmup_steps(args, max_steps),
                         num_training_steps=max_steps, scheduler_specific_kwargs=kwargs)


def _warmup_steps(args, max_steps: int) -> int:
    return math.ceil(max_steps * args.actor.lr_warmup_ratio)


# What may differ between the shapes of one run (everything else must be equal).
SHAPE_FLAGS = ("actor.num_nodes", "actor.num_gpus_per_node", "vllm.num_engines", "vllm.tensor_parallel_size",
               "train.micro_batch_size", "rollout.micro_batch_size", "actor.model_name_or_path")


def _resolved(module: str, argv: list[str]):
    """The nested arguments a launch would train with, or the reason it would refuse."""
    try:
        args, _ = resolve_training(module, argv)
        errors = launch_errors(args)
        if errors:
            raise Invalid(errors)
        return args, None
    except Invalid as e:
        return None, "refused before start: " + "; ".join(e.errors)


def rehearse(command: list[str], settings: Settings = Settings(), log=print) -> dict:
    """Rehearse `command` (`[python] -m <launcher> <arguments>`) and the shapes in `settings.shape`;
    the report (see the module docstring)."""
    module, argv = split_command(command)
    if module not in (UPSTREAM_CLI, REPLAY_CLI):
        raise Invalid([f"{module}: only training commands can be rehearsed"])
    t0 = time.monotonic()
    pending_pool = None
    if module == REPLAY_CLI:  # a pool built from a checkpoint not trained yet: a stand-in (pool.py)
        argv, pending_pool = missing_pool(argv)
    args, refused = _resolved(module, argv)
    if refused:
        return {"command": " ".join(command), "crash": refused, "crash_step": 0, "steps_expected": None,
                "steps_completed": 0}
    shadows = []
    for flags in settings.shape:
        shadow_args, refused = _resolved(module, argv + shlex.split(flags))
        if shadow_args is not None:
            mine, theirs = flatten_args(args), flatten_args(shadow_args)
            other = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k)
                           and k not in SHAPE_FLAGS and not k.startswith(("ckpt.", "logger.")))
            if other:
                raise Invalid([f"--shape {flags!r} changes more than the shape: {', '.join(other)}"])
        shadows.append(Shadow(flags, shadow_args, [], None, crash=refused, crash_step=0 if refused else None))
    with _rehearsal_environment(args) as work:
        return _run(module, args, settings, work, t0, log, shadows, pending_pool) | {"command": " ".join(command)}


@contextlib.contextmanager
def _rehearsal_environment(args):
    """A scratch checkpoint folder (nothing is written where the real run writes), the CPU
    platform's adaptations (upstream's per-rank buffer asks for a CUDA device), the in-process
    object store, and upstream's progress bars and step logs silenced."""
    os.environ.setdefault(DEVICE_ENV, "cpu")
    _hook.install()
    quiet = [logging.getLogger(name) for name in ("openrlhf", "openrlhf_replay")]
    levels = [logger.level for logger in quiet]
    with tempfile.TemporaryDirectory(prefix="rehearsal_") as work, in_process_object_store(), \
            _patched_env("TQDM_DISABLE", "1"):
        args.ckpt.path = os.path.join(work, "ckpt")
        args.ckpt.output_dir = os.path.join(work, "model")
        args.logger.tensorboard_dir, args.logger.wandb.key = None, None
        for logger in quiet:
            logger.setLevel(logging.WARNING)
        try:
            yield Path(work)
        finally:
            for logger, level in zip(quiet, levels):
                logger.setLevel(level)


@contextlib.contextmanager
def _patched_env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _run(module: str, args, settings: Settings, work: Path, t0: float, log, shadows: list[Shadow],
         pending_pool: str | None = None) -> dict:
    prompts = _prompt_texts(args)
    tokenizer_dir = write_tokenizer(prompts[:500], work / "tokenizer")
    if pending_pool:
        pool = work / "success_pool.npz"
        successes = build_stand_in_pool(args, tokenizer_dir, settings, pool)
        for run_args in [args] + [s.args for s in shadows if s.args is not None]:
            run_args.replay.success_pool = str(pool)
        log(f"rehearse: {pending_pool} is not built yet: rehearsing with a stand-in pool of {successes} successes "
            "(the stand-in seed policy decoded every training prompt; openrlhf_replay/rehearsal/pool.py), so\n"
            f"{describe_replay(args)}")
    replay = ReplayConfig.from_namespace(args) if module == REPLAY_CLI else ReplayConfig()
    rng = np.random.default_rng(settings.seed)
    cls = _controller_class(module, args)
    world, accumulation = world_size(args), _accumulation(args)
    record = Record()
    resume_at = settings.resume_at
    # Async: no resume here (tests/pipeline/test_async_pipeline.py kills and resumes a real run).
    saves = args.ckpt.load_enable and 0 < args.ckpt.save_steps < math.inf and not args.train.async_enable
    if resume_at < 0:  # the first checkpoint after the replay warm-up (the buffer is not empty)
        after = replay.effective_warmup + 1 if replay.enabled else 1
        resume_at = math.ceil(after / args.ckpt.save_steps) * args.ckpt.save_steps if saves else 0
    settings = dataclasses.replace(settings, resume_at=resume_at)

    ranks = [Rank(r, args, accumulation, rng) for r in range(world)]
    if args.algo.advantage.estimator == "gae":  # a critic group, trained on the same rows as the actors
        critic_world = args.critic.num_nodes * args.critic.num_gpus_per_node
        record.critic = [Rank(r, args, accumulation * world // critic_world, rng) for r in range(critic_world)]
    for shadow in (s for s in shadows if s.args is not None):
        shadow.ranks = [ShadowRank(r, shadow.args, _accumulation(shadow.args), rng)
                        for r in range(world_size(shadow.args))]
        shadow.group = actor_group(shadow.ranks, shadow.args.ds.ring_attn_size * shadow.args.ds.tensor_parallel_size)
    trainer = _build(cls, copy.deepcopy(args), tokenizer_dir, ranks, settings, rng, record, shadows)
    max_steps = trainer.get_max_steps()
    ranks[0].scheduler, ranks[0].peers = _scheduler(args, max_steps), ranks
    if replay.enabled:  # as the replay policy actor does
        from openrlhf_replay.trainer.lr_schedule import pace_by_rollout_steps

        pace_by_rollout_steps(ranks[0].scheduler)
    steps_per_episode = math.ceil(len(trainer.prompts_dataloader) / args.rollout.batch_size)
    log(f"rehearse: {cls.__name__.lstrip('_')}, {len(trainer.prompts_dataloader)} prompts = {steps_per_episode} steps "
        f"per episode x {args.train.num_episodes}; {world} ranks, accumulation {accumulation}; resume at step "
        f"{resume_at or 'never'}")
    while True:
        try:
            trainer.fit()
            break
        except _Resume:
            log(f"rehearse: resuming the controller from the step-{record.resumed_at} checkpoint")
            trainer = _build(cls, copy.deepcopy(args), tokenizer_dir, ranks, settings, rng, record, shadows)
        except Exception as e:  # the finding: where and why the run would stop
            record.crash = f"{type(e).__name__}: {e}"
            log(traceback.format_exc())
            break
    if record.crash is None:
        record.crash_step = None
    report = _report(args, replay, record, ranks, max_steps, len(trainer.prompts_dataloader), time.monotonic() - t0)
    if record.critic:  # equal over its ranks, or its collectives would hang
        report["critic_optimizer_steps_per_rank"] = [sum(s["optimizer_steps"] for s in r.steps) for r in record.critic]
    last = report["lr_last_optimizer_step"]
    if last:
        log(f"rehearse: LR schedule of {max_steps} optimizer steps ({args.actor.lr_scheduler}); the last optimizer "
            f"step ran at position {last['position']:.4g}, LR {last['lr']:.4g}; the run ends at position "
            f"{report['lr_schedule_position_at_end']:.4g}")
    # The handling the run resolves for replayed rows (the trainer's own config, after its defaults).
    report["off_policy"] = off_policy(getattr(trainer, "replay_config", replay))
    report["settings"] = {k: v for k, v in dataclasses.asdict(settings).items() if k != "shape"}
    report["shapes"] = [_shape_report(args, "", ranks, record.crash, record.crash_step, len(record.steps))] + [
        _shape_report(s.args, s.flags, s.ranks, s.crash, s.crash_step, s.steps) for s in shadows]
    return report


def _accumulation(args) -> int:
    """Micro-batches per optimizer step on each rank (upstream's `strategy.accumulated_gradient`)."""
    duplicate = args.ds.ring_attn_size * args.ds.tensor_parallel_size
    return args.train.batch_size * duplicate // args.train.micro_batch_size // world_size(args)


def _shape_report(args, flags: str, ranks: list[Rank], crash, crash_step, steps: int) -> dict:
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


def _prompt_texts(args) -> list[str]:
    """The prompt field of the first rows of the dataset (to train the stand-in tokenizer on)."""
    texts = []
    for path in (d.split("@")[0].strip() for d in args.data.prompt_dataset.split(",")):
        with open(path, encoding="utf-8") as f:
            if path.endswith(".jsonl"):
                rows = [json.loads(line) for _, line in zip(range(2000), f)]
            else:
                rows = json.load(f)[:2000]
        texts += [str(row.get(args.data.input_key, "")) for row in rows]
    return texts


def _report(args, replay, record: Record, ranks: list[Rank], max_steps: int, prompts_per_episode: int,
            seconds: float) -> dict:
    steps = record.steps
    after_warmup = [s for s in steps if s["step"] > replay.effective_warmup] if replay.enabled else []  # buffer step >= warm-up
    per_step_opt = [sum(s["ranks"]["optimizer_steps"]) / max(len(ranks), 1) for s in steps]
    cumulative = list(_accumulate(ranks[0].steps[i]["optimizer_steps"] for i in range(len(ranks[0].steps)))) \
        if ranks else []
    warmup_opt = _warmup_steps(args, max_steps)
    positions, lrs = (ranks[0].lr_positions, ranks[0].lrs) if ranks else ([], [])
    warmup_rollout = next((i + 1 for i, p in enumerate(positions) if p >= warmup_opt), None)
    ages = [s["age_max"] for s in after_warmup if s["replayed"]]
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
        "lr_schedule_optimizer_steps": max_steps,
        "lr_warmup_optimizer_steps": warmup_opt,
        "lr_warmup_rollout_steps": warmup_rollout,
        "optimizer_steps_taken": cumulative[-1] if cumulative else 0,
        "lr_after_warmup": spread([lr for p, lr in lrs if p >= warmup_opt]) if ranks else None,
        # Where the schedule stands after the run (its end: lr_schedule_optimizer_steps), and the LR
        # and position the last optimizer step ran at (within one step of the end).
        "lr_schedule_position_at_end": positions[-1] if positions else None,
        "lr_last_optimizer_step": {"position": lrs[-1][0], "lr": lrs[-1][1]} if lrs else None,
        "replay_age": {"max": max(ages) if ages else None,
                       "mean": statistics.fmean(s["age_mean"] for s in after_warmup if s["replayed"]) if ages else None},
        "buffer_max_rollouts": max((s["buffer"] or 0 for s in steps), default=0),
        "checkpoints": record.checkpoints,
        "resumed_at": record.resumed_at,
        "seconds": round(seconds, 1),
    }


def _accumulate(values):
    total = 0
    for v in values:
        total += v
        yield total
