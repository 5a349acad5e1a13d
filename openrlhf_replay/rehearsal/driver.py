"""The rehearsal's driver: resolve the command as the launcher would, build the real controller
over the stand-ins (`standins.py`), walk every step of every episode (and one resume), and report
what it saw (`report.py` renders it). What a rehearsal checks: the package docstring, which is also
`python -m openrlhf_replay.rehearsal --help`.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import logging
import math
import os
import shlex
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
from openrlhf_replay.rehearsal.report import off_policy, run_report, shape_report, step_figures, warmup_steps
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
    """The controller, as upstream's `train()` builds it, over the stand-in ranks and generation; on
    a copy of `args`, so a rebuild starts from the arguments the first build had."""
    from openrlhf.utils import get_strategy

    args = copy.deepcopy(args)
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
        record.steps.append({"step": next_step, "episode": record.episode, **step_figures(status, ranks)})
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
    return get_scheduler(args.actor.lr_scheduler, optimizer, num_warmup_steps=warmup_steps(args, max_steps),
                         num_training_steps=max_steps, scheduler_specific_kwargs=kwargs)


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
    tokenizer_dir = write_tokenizer(_prompt_texts(args)[:500], work / "tokenizer")
    if pending_pool:
        _use_stand_in_pool(args, shadows, tokenizer_dir, settings, work / "success_pool.npz", pending_pool, log)
    replay = ReplayConfig.from_namespace(args) if module == REPLAY_CLI else ReplayConfig()
    rng = np.random.default_rng(settings.seed)
    cls = _controller_class(module, args)
    record = Record()
    settings = dataclasses.replace(settings, resume_at=_resume_step(args, replay, settings.resume_at))
    ranks = _ranks(args, rng, record, shadows)
    build = functools.partial(_build, cls, args, tokenizer_dir, ranks, settings, rng, record, shadows)
    trainer = build()
    max_steps = trainer.get_max_steps()
    ranks[0].scheduler, ranks[0].peers = _scheduler(args, max_steps), ranks
    if replay.enabled:  # as the replay policy actor does
        from openrlhf_replay.trainer.lr_schedule import pace_by_rollout_steps

        pace_by_rollout_steps(ranks[0].scheduler)
    prompts = len(trainer.prompts_dataloader)
    log(f"rehearse: {cls.__name__.lstrip('_')}, {prompts} prompts = {math.ceil(prompts / args.rollout.batch_size)} "
        f"steps per episode x {args.train.num_episodes}; {len(ranks)} ranks, accumulation {_accumulation(args)}; "
        f"resume at step {settings.resume_at or 'never'}")
    trainer = _fit(trainer, build, record, log)
    report = run_report(args, replay, record, ranks, max_steps, prompts, time.monotonic() - t0)
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
    report["shapes"] = [shape_report(args, "", ranks, record.crash, record.crash_step, len(record.steps))] + [
        shape_report(s.args, s.flags, s.ranks, s.crash, s.crash_step, s.steps) for s in shadows]
    return report


def _use_stand_in_pool(args, shadows: list[Shadow], tokenizer_dir: Path, settings: Settings, pool: Path,
                       pending_pool: str, log) -> None:
    """RLEP's pool comes from a checkpoint not trained yet: the run and its shapes replay a stand-in."""
    successes = build_stand_in_pool(args, tokenizer_dir, settings, pool)
    for run_args in [args] + [s.args for s in shadows if s.args is not None]:
        run_args.replay.success_pool = str(pool)
    log(f"rehearse: {pending_pool} is not built yet: rehearsing with a stand-in pool of {successes} successes "
        "(the stand-in seed policy decoded every training prompt; openrlhf_replay/rehearsal/pool.py), so\n"
        f"{describe_replay(args)}")


def _resume_step(args, replay: ReplayConfig, resume_at: int) -> int:
    """The step whose checkpoint the rehearsal resumes from (0: never). A negative `resume_at` asks
    for the first checkpoint after the replay warm-up, where the buffer is not empty."""
    # Async: no resume here (tests/pipeline/test_async_pipeline.py kills and resumes a real run).
    saves = args.ckpt.load_enable and 0 < args.ckpt.save_steps < math.inf and not args.train.async_enable
    if resume_at >= 0:
        return resume_at
    after = replay.effective_warmup + 1 if replay.enabled else 1
    return math.ceil(after / args.ckpt.save_steps) * args.ckpt.save_steps if saves else 0


def _ranks(args, rng, record: Record, shadows: list[Shadow]) -> list[Rank]:
    """The actor's stand-in ranks; the critic's into `record` (`gae`); each shape's into its shadow."""
    world, accumulation = world_size(args), _accumulation(args)
    ranks = [Rank(r, args, accumulation, rng) for r in range(world)]
    if args.algo.advantage.estimator == "gae":  # a critic group, trained on the same rows as the actors
        critic_world = args.critic.num_nodes * args.critic.num_gpus_per_node
        record.critic = [Rank(r, args, accumulation * world // critic_world, rng) for r in range(critic_world)]
    for shadow in (s for s in shadows if s.args is not None):
        shadow.ranks = [ShadowRank(r, shadow.args, _accumulation(shadow.args), rng)
                        for r in range(world_size(shadow.args))]
        shadow.group = actor_group(shadow.ranks, shadow.args.ds.ring_attn_size * shadow.args.ds.tensor_parallel_size)
    return ranks


def _fit(trainer, build, record: Record, log):
    """Run the controller to its end, rebuilt once from the resume step's checkpoint; a crash is
    the finding (`record.crash`: where and why the run would stop). The last controller built."""
    while True:
        try:
            trainer.fit()
            break
        except _Resume:
            log(f"rehearse: resuming the controller from the step-{record.resumed_at} checkpoint")
            trainer = build()
        except Exception as e:
            record.crash = f"{type(e).__name__}: {e}"
            log(traceback.format_exc())
            break
    if record.crash is None:
        record.crash_step = None
    return trainer


def _accumulation(args) -> int:
    """Micro-batches per optimizer step on each rank (upstream's `strategy.accumulated_gradient`)."""
    duplicate = args.ds.ring_attn_size * args.ds.tensor_parallel_size
    return args.train.batch_size * duplicate // args.train.micro_batch_size // world_size(args)


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
