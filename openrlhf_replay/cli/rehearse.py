"""`python -m openrlhf_replay.cli.rehearse -- <training command>`: a whole run's control flow, on a CPU.

A GPU run that crashes at the end of its first episode, or a condition that silently replays
nothing, costs node-hours before anyone sees it. This walks every step of every episode of the
exact command a launch script would run (`REHEARSE=1 bash examples/scripts/<script>.sh` passes
it here), at its real shape: batch sizes, GPU count, micro-batches, data, checkpoint cadence.

What runs for real, in this process: the launcher's argument handling and every check a launch
makes (as `validate` does); the controller class the launcher would start (upstream's
`PPOTrainer`, or `ReplayPPOTrainer` with replay on) and its `fit()` loop; the prompt dataset file
through upstream's dataset, dataloader, batching (`SamplesGenerator.generate_samples`) and
episode boundaries; upstream's experience maker (micro-batches, the forward dispatch, group
advantages); the replay buffer's evict / draw / store, the conversions to and from `Experience`,
the arrangement for ranks, RLEP regrouping; `get_max_steps` and the LR scheduler it sizes;
checkpoints (the replay buffer saved, read back and compared, and one resume of the whole
controller from a checkpoint); upstream's chunking of every batch over the data-parallel ranks
(`RayActorGroup.async_run_method_batch`, and each rank's `execute_batch`). The ranks live in
this process, so Ray's object store is bypassed (`ray.put` / `ray.get` hand the object over as
it is): serializing tensors between processes is not what a rehearsal checks, and it would
triple its time.

Stand-ins, and only these: generation (token ids drawn per prompt, short by default: lengths
change no control flow, while upstream's per-token returns loop makes long ones slow here),
the log-prob forward (random log-probs), rewards (each prompt has a fixed P(correct), drawn
around a mean solve rate, `--solve-rate`, so groups with none, some and all correct occur) and
the rank's training (its rows counted into micro-batches as its dataloader would, drop_last, and
an optimizer step counted, and the real LR scheduler stepped, every `accumulation` micro-batches,
as DeepSpeed does; a partial window carries over into the next step, as DeepSpeed's would).

Other shapes of the same run (`--shape "<flags>"`, e.g. another GPU count and the micro-batch
sizes that go with it) are rehearsed alongside, as shadows: they see the same steps, the same
fresh rollouts and the same replay draws (none of which depends on the shape), and run the
shape-dependent code for real on stand-in micro-batches that only carry their row counts: the
split of the replay over ranks, the arrangement of the list, upstream's chunking of the forward
pass and of the training batch, and each rank's training counts.

Prints what it rehearses, a one-row table of its figures, then one JSON object (the last line;
`--report PATH` also writes it to a file): steps expected and completed, fresh and replayed
rollouts per step (their spread, the share of steps that replay, a histogram, and the list of
counts step by step beside the candidates each draw had), the handling of replayed rows' pi_old
(`off_policy`: stale, refresh or recompute, as the run resolves it), optimizer steps per rollout
step (mean and spread) and per rank, micro-batches per rank, the LR schedule and its warm-up in
optimizer and rollout steps, replay ages, the stand-ins' settings, the crash if any. Exit status
0 when the run completed without a crash, 1 otherwise.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from openrlhf_replay.cli.rehearsal_report import TABLE_HEADER, markdown, off_policy, replay_distribution, spread, \
    table_row
from openrlhf_replay.cli.validate import REPLAY_CLI, UPSTREAM_CLI, Invalid, launch_errors, resolve_training, \
    split_command
from openrlhf_replay.utils import world_size


@dataclass(frozen=True)
class Settings:
    """How the stand-ins behave; every field is a `--flag` (underscores become dashes)."""

    prompt_tokens: int = 24
    """Prompt length in tokens (ids drawn from the prompt's text, so equal prompts get equal ids)."""
    response_tokens: int = 16
    """Mean response length in tokens (geometric, capped at the command's --rollout.max_new_tokens).
    Upstream's returns loop costs ~25 us per token per micro-batch here: short keeps a run short."""
    seed: int = 0
    """Seed of the stand-ins (difficulties, rewards, lengths, log-probs)."""
    solve_rate: float = 0.4
    """Mean P(correct) over prompts (REHEARSE_SOLVE_RATE in the scripts). Each prompt's own
    P(correct) is drawn once, seeded by --seed and its text, from a Beta distribution with this mean
    and --solve-concentration; 0 or 1: every prompt alike."""
    solve_concentration: float = 1.5
    """Spread of the prompts' P(correct) around --solve-rate: Beta(c x rate, c x (1 - rate)) for c =
    this. Small c is U-shaped (rate 0.4, c 1.5: Beta(0.6, 0.9)): many prompts almost never or almost
    always solved (the all-wrong and all-right groups of a real run), the rest in between; large c
    puts every prompt near the mean."""
    resume_at: int = -1
    """Stop after this step's checkpoint and resume the whole controller from it (-1: the first
    checkpoint after the replay warm-up; 0: never)."""
    shape: tuple = ()
    """Flags of another shape of the same run, appended to its command (repeatable), e.g.
    "--actor.num_gpus_per_node 4 --vllm.num_engines 4 --train.micro_batch_size 4"."""

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "response_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= 1")
        if not 0 <= self.solve_rate <= 1:
            raise ValueError(f"--solve-rate {self.solve_rate}: a mean probability, must be in [0, 1] "
                             "(REHEARSE_SOLVE_RATE=0.4 is 40% of rollouts correct on average)")
        if not self.solve_concentration > 0:
            raise ValueError(f"--solve-concentration {self.solve_concentration}: must be > 0 (1.5: a "
                             "U-shaped spread of prompt difficulties; larger: closer to the mean)")


class _Resume(Exception):
    """Raised after the resume step's checkpoint: the controller is rebuilt from it."""


# ------------------------------------------------------------------------------ stand-ins


class Rank:
    """One data-parallel rank of the policy actor group, in this process: it receives its chunk of
    every batch through upstream's own dispatch, and `fit` counts what its training would do."""

    def __init__(self, rank: int, args, accumulation: int, rng) -> None:
        self.rank, self.args, self.accumulation, self.rng = rank, args, accumulation, rng
        self.scheduler = None  # rank 0 steps the run's LR scheduler (set once its length is known)
        self.strategy = SimpleNamespace(is_rank_0=lambda: False)  # upstream's execute_batch reads it
        self.pending = 0  # micro-batches of an unfinished accumulation window (DeepSpeed keeps them)
        self.received = {"fresh": 0, "replayed": 0, "rows": 0, "replayed_rows": 0}  # this step
        self.steps: list[dict] = []  # one record per rollout step
        self.checkpoint_states: dict = {}
        self.lrs: list[float] = []

    from openrlhf.trainer.ray.launcher import BaseModelActor as _Base

    execute_batch = _Base.execute_batch  # upstream's per-item dispatch of a chunk
    del _Base

    def forward(self, sequences, action_mask=None, attention_mask=None, **_):
        import torch

        return -torch.from_numpy(self.rng.exponential(size=tuple(action_mask.shape))).float()

    def append(self, experience) -> None:
        """Upstream's actor splits each Experience into its rows (`NaiveReplayBuffer.append`)."""
        from openrlhf_replay.trainer.ppo_utils.experience import REPLAYED_KEY

        flags = experience.info.get(REPLAYED_KEY)
        replayed = flags is not None and bool(flags.bool().any())
        self.received["replayed" if replayed else "fresh"] += 1
        self.received["rows"] += len(experience.sequences)
        self.received["replayed_rows"] += len(experience.sequences) if replayed else 0

    def fit(self, kl_ctl: float = 0) -> dict:
        """Upstream's `ppo_train`: a DataLoader of train.micro_batch_size over the rows, drop_last, once
        per epoch; DeepSpeed steps the optimizer every `accumulation` micro-batches."""
        got, micro = self.received, self.args.train.micro_batch_size
        micro_batches = got["rows"] // micro * self.args.train.max_epochs
        self.pending += micro_batches
        optimizer_steps, self.pending = divmod(self.pending, self.accumulation)
        for _ in range(optimizer_steps if self.scheduler is not None else 0):
            self.lrs.append(self.scheduler.get_last_lr()[0])
            self.scheduler.step()
        self.steps.append({"fresh_micro_batches": got["fresh"], "replayed_micro_batches": got["replayed"],
                           "rows": got["rows"], "replayed_rows": got["replayed_rows"],
                           "dropped_rows": got["rows"] % micro, "optimizer_steps": optimizer_steps,
                           "carried_micro_batches": self.pending})
        self.received = {"fresh": 0, "replayed": 0, "rows": 0, "replayed_rows": 0}
        return {}

    def save_checkpoint(self, tag, client_states=None, metric_value=None, metric_key=None) -> None:
        self.checkpoint_states = copy.deepcopy(client_states or {})
        os.makedirs(os.path.join(self.args.ckpt.path, "_actor", tag), exist_ok=True)

    def get_checkpoint_states(self) -> dict:
        return self.checkpoint_states

    def empty_cache(self) -> None:
        pass

    reload_states = offload_states = broadcast_to_vllm = empty_cache


class _Local:
    """An object handed over in-process where Ray would hand over an object reference."""

    __slots__ = ("value",)

    def __init__(self, value) -> None:
        self.value = value


@contextlib.contextmanager
def _in_process_object_store():
    """`ray.put` wraps an object, `ray.get` unwraps it (lists too), for the rehearsal's duration."""
    import ray

    def get(refs, *args, **kwargs):
        return [get(r) for r in refs] if isinstance(refs, list) else refs.value

    put, original_get = ray.put, ray.get
    ray.put, ray.get = _Local, get
    try:
        yield
    finally:
        ray.put, ray.get = put, original_get


class _Stub:
    """A micro-batch of a shadow shape: only its row count and kind."""

    def __init__(self, rows: int, replayed: bool) -> None:
        import torch

        from openrlhf_replay.trainer.ppo_utils.experience import REPLAYED_KEY

        self.sequences = range(rows)
        self.info = {REPLAYED_KEY: torch.full((1,), float(replayed))}


class ShadowRank(Rank):
    """A rank of a shadow shape: its forward pass returns nothing (there is nothing to score)."""

    def forward(self, sequences, **_):
        return None


@dataclass
class Shadow:
    """Another shape of the run: its arguments, its ranks and where it failed, if it did."""

    flags: str
    args: object
    ranks: list
    group: object
    crash: str | None = None
    crash_step: int | None = None
    steps: int = 0

    def step(self, n_fresh: int, composition, step: int) -> None:
        """The shape-dependent part of one step, on stubs: what `ReplayExperienceMaker` and upstream
        do with the step's fresh and replayed rows at this shape."""
        import ray

        from openrlhf_replay.trainer.ppo_utils.experience_maker import arrange_for_ranks, replayed_for_ranks
        from openrlhf_replay.utils import data_parallel_ranks

        if self.crash:
            return
        try:
            micro = self.args.rollout.micro_batch_size
            fresh = [_Stub(min(micro, n_fresh - lo), False) for lo in range(0, n_fresh, micro)]
            ray.get(self.group.async_run_method_batch(method_name="forward", sequences=fresh))
            batch = fresh
            if composition is not None:
                # The experience maker's own split (with RLEP's inert rows), at this shape's rank count.
                per_rank = [[_Stub(min(micro, len(rows) - lo), True) for lo in range(0, len(rows), micro)]
                            for rows, _, _ in replayed_for_ranks(composition, data_parallel_ranks(self.args))]
                batch = arrange_for_ranks(fresh, per_rank)
            ray.get(self.group.async_run_method_batch(method_name="append", experience=batch))
            ray.get(self.group.async_run_method(method_name="fit"))
            self.steps += 1
        except Exception as e:
            self.crash, self.crash_step = f"{type(e).__name__}: {e}", step


class _Handle:
    """Stands for a Ray actor handle: `handle.method.remote(...)` runs the rank's method here and
    returns its result as an object reference would (so upstream's `ray.get` calls work unchanged)."""

    def __init__(self, rank: Rank) -> None:
        self._rank = rank

    def __getattr__(self, name):
        method = getattr(self._rank, name)

        def remote(*args, **kwargs):
            return _Local(method(*[a.value if isinstance(a, _Local) else a for a in args], **kwargs))

        return SimpleNamespace(remote=remote)


def _actor_group(ranks: list[Rank], duplicate: int):
    """Upstream's `RayActorGroup` (its own chunking code) over the stand-in ranks."""
    from openrlhf.trainer.ray.launcher import RayActorGroup

    group = object.__new__(RayActorGroup)
    group._num_nodes, group._num_gpus_per_node = 1, len(ranks)
    group._actor_handlers = [_Handle(r) for r in ranks]
    group.duplicate_actors = duplicate
    return group


def _tokenizer_dir(prompts: list[str], folder: Path) -> Path:
    """A small byte-level BPE tokenizer trained on the run's own prompts, for what the controller
    reads through a tokenizer (its dataset's templates, a decoded sample in its log)."""
    from infra.models import train_tokenizer

    tokenizer = train_tokenizer(prompts, vocab_size=512)
    tokenizer.save_pretrained(folder)
    return folder


def solve_probability(prompt: str, settings: Settings) -> float:
    """P(correct) of a prompt: drawn from Beta(c x rate, c x (1 - rate)) (c = solve_concentration)
    by a generator seeded with the settings' seed and the prompt's text, so a prompt keeps its
    difficulty in every episode, at every shape and after a resume."""
    rate, c = settings.solve_rate, settings.solve_concentration
    if rate in (0, 1):
        return float(rate)
    text = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "little")
    return float(np.random.default_rng([settings.seed, text]).beta(c * rate, c * (1 - rate)))


class Generation:
    """Stands for vLLM and the reward function: per prompt, `n` responses of sampled lengths, each
    correct with the prompt's own probability (`solve_probability`)."""

    def __init__(self, samples_generator, tokenizer, args, settings: Settings, rng) -> None:
        self.sg, self.tokenizer, self.args, self.settings, self.rng = samples_generator, tokenizer, args, settings, rng
        self.vocab = len(tokenizer)  # transformers rebuilds the vocabulary to measure it: once
        self.solve: dict[str, float] = {}  # prompt -> P(correct), drawn on first sight

    def prompt_ids(self, prompt: str) -> list[int]:
        """`prompt_tokens` token ids drawn from the prompt's text (equal prompts, equal ids)."""
        seed = int.from_bytes(hashlib.sha256(b"ids" + prompt.encode()).digest()[:8], "little")
        return np.random.default_rng(seed).integers(3, self.vocab, self.settings.prompt_tokens).tolist()

    def __call__(self, dataloader_iter, num_prompts: int, dynamic_filtering=False, **generate_kwargs):
        from openrlhf.trainer.ppo_utils.samples_generator import _collect_prompt_batch

        prompts, labels, _, exhausted = _collect_prompt_batch(dataloader_iter, num_prompts)
        if not prompts:
            return [], 0, True
        n, cap = self.args.rollout.n_samples_per_prompt, self.args.rollout.max_new_tokens
        with_log_probs = self.args.algo.advantage.is_correction_level != "off"
        experiences = []
        for prompt, label in zip(prompts, labels):
            ids = self.prompt_ids(prompt)
            if prompt not in self.solve:
                self.solve[prompt] = solve_probability(prompt, self.settings)
            p = self.solve[prompt]
            lengths = self.rng.geometric(1 / self.settings.response_tokens, size=n)
            for length, correct in zip(lengths, self.rng.random(n) < p):
                length = int(min(length, cap))
                response = self.rng.integers(3, self.vocab, length).tolist()
                reward = float(correct)
                observation = ids + response
                experiences.append(self.sg._process_response_into_experience({
                    "observation_tokens": observation, "action_ranges": [(len(ids), len(observation))],
                    "reward": reward, "scores": reward, "prompt": prompt, "label": label, "truncated": length >= cap,
                    "rollout_log_probs": (-self.rng.exponential(size=len(observation))).tolist() if with_log_probs
                    else None, "extra_logs": {}}, **generate_kwargs))
        return experiences, len(prompts), exhausted


# ------------------------------------------------------------------------------ the run


@dataclass
class Record:
    """What the rehearsal saw, step by step."""

    steps: list[dict] = field(default_factory=list)
    episodes_done: int = 0
    episode: int = 0  # of the step being generated
    checkpoints: list[int] = field(default_factory=list)
    resumed_at: int | None = None
    crash: str | None = None
    crash_step: int | None = None


def _controller_class(module: str, args):
    from openrlhf.trainer.ppo_trainer import PPOTrainer

    from openrlhf_replay.utils import undecorated
    from replay import ReplayConfig

    if module == REPLAY_CLI and ReplayConfig.from_namespace(args).enabled:
        from openrlhf_replay.trainer.ppo_trainer import _ReplayPPOTrainer

        return _ReplayPPOTrainer
    return undecorated(PPOTrainer)


def _build(cls, args, tokenizer_dir: Path, ranks: list[Rank], settings: Settings, rng, record: Record,
           shadows: list[Shadow]):
    """The controller, as upstream's `train()` builds it, over the stand-in ranks and generation."""
    from openrlhf.utils import get_strategy

    duplicate = args.ds.ring_attn_size * args.ds.tensor_parallel_size
    trainer = cls(str(tokenizer_dir), get_strategy(args), _actor_group(ranks, duplicate), None, None, None, [],
                  do_sample=True, max_len=args.data.max_len, max_new_tokens=args.rollout.max_new_tokens,
                  temperature=args.rollout.temperature, top_p=args.rollout.top_p)
    sg = trainer.samples_generator
    sg._generate_vllm = Generation(sg, trainer.tokenizer, args, settings, rng)

    generate = sg.generate_samples

    def generate_samples(**kwargs):
        record.episode = record.episodes_done
        out = generate(**kwargs)
        if out[3]:  # exhausted: this episode's last batch
            record.episodes_done += 1
        return out

    sg.generate_samples = generate_samples
    step_fn, save_fn = trainer.train_step, trainer.save_logs_and_checkpoints

    def train_step(rollout_samples, global_step):
        # Upstream logs (and checkpoints) this step as global_step + 1; the buffer's step is global_step.
        record.crash_step = global_step + 1
        status, next_step = step_fn(rollout_samples, global_step)
        record.steps.append({"step": next_step, "episode": record.episode, **_step_figures(status, ranks)})
        for shadow in shadows:
            shadow.step(len(rollout_samples), getattr(trainer.experience_maker, "composition", None), next_step)
        return status, next_step

    def save_logs_and_checkpoints(global_step, logs_dict=None, client_states=None):
        save_fn(global_step, logs_dict, client_states)
        if global_step % args.ckpt.save_steps:
            return
        record.checkpoints.append(global_step)
        _check_replay_round_trip(trainer, args, ranks[0].checkpoint_states)
        if global_step == settings.resume_at and record.resumed_at is None:
            record.resumed_at = global_step
            raise _Resume()

    trainer.train_step, trainer.save_logs_and_checkpoints = train_step, save_logs_and_checkpoints
    return trainer


def _step_figures(status: dict, ranks: list[Rank]) -> dict:
    per_rank = [r.steps[-1] for r in ranks]
    return {
        "fresh": int(status.get("rollout/num_samples", 0)),
        "replayed": int(status.get("replay/replayed", 0)),
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
    from replay.checkpoint import state_digest

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
    import shlex

    from openrlhf_replay.cli.validate import _flatten

    module, argv = split_command(command)
    if module not in (UPSTREAM_CLI, REPLAY_CLI):
        raise Invalid([f"{module}: only training commands can be rehearsed"])
    t0 = time.monotonic()
    args, refused = _resolved(module, argv)
    if refused:
        return {"command": " ".join(command), "crash": refused, "crash_step": 0, "steps_expected": None,
                "steps_completed": 0}
    shadows = []
    for flags in settings.shape:
        shadow_args, refused = _resolved(module, argv + shlex.split(flags))
        if shadow_args is not None:
            mine, theirs = _flatten(args), _flatten(shadow_args)
            other = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k)
                           and k not in SHAPE_FLAGS and not k.startswith(("ckpt.", "logger.")))
            if other:
                raise Invalid([f"--shape {flags!r} changes more than the shape: {', '.join(other)}"])
        shadows.append(Shadow(flags, shadow_args, [], None, crash=refused, crash_step=0 if refused else None))
    with _rehearsal_environment(args) as work:
        return _run(module, args, settings, work, t0, log, shadows) | {"command": " ".join(command)}


@contextlib.contextmanager
def _rehearsal_environment(args):
    """A scratch checkpoint folder (nothing is written where the real run writes), the CPU
    platform's adaptations (upstream's per-rank buffer asks for a CUDA device), the in-process
    object store, and upstream's progress bars and step logs silenced."""
    import logging

    from openrlhf_replay.cpu import DEVICE_ENV, _hook

    os.environ.setdefault(DEVICE_ENV, "cpu")
    _hook.install()
    quiet = [logging.getLogger(name) for name in ("openrlhf", "openrlhf_replay")]
    levels = [logger.level for logger in quiet]
    with tempfile.TemporaryDirectory(prefix="rehearsal_") as work, _in_process_object_store(), \
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


def _run(module: str, args, settings: Settings, work: Path, t0: float, log, shadows: list[Shadow]) -> dict:
    from replay import ReplayConfig

    replay = ReplayConfig.from_namespace(args) if module == REPLAY_CLI else ReplayConfig()
    rng = np.random.default_rng(settings.seed)
    cls = _controller_class(module, args)
    world, accumulation = world_size(args), _accumulation(args)
    record = Record()
    prompts = _prompt_texts(args)
    tokenizer_dir = _tokenizer_dir(prompts[:500], work / "tokenizer")
    resume_at = settings.resume_at
    saves = args.ckpt.load_enable and 0 < args.ckpt.save_steps < math.inf
    if resume_at < 0:  # the first checkpoint after the replay warm-up (the buffer is not empty)
        after = replay.warmup + 1 if replay.enabled else 1
        resume_at = math.ceil(after / args.ckpt.save_steps) * args.ckpt.save_steps if saves else 0
    settings = dataclasses.replace(settings, resume_at=resume_at)

    ranks = [Rank(r, args, accumulation, rng) for r in range(world)]
    for shadow in (s for s in shadows if s.args is not None):
        shadow.ranks = [ShadowRank(r, shadow.args, _accumulation(shadow.args), rng)
                        for r in range(world_size(shadow.args))]
        shadow.group = _actor_group(shadow.ranks, shadow.args.ds.ring_attn_size * shadow.args.ds.tensor_parallel_size)
    trainer = _build(cls, copy.deepcopy(args), tokenizer_dir, ranks, settings, rng, record, shadows)
    max_steps = trainer.get_max_steps()
    ranks[0].scheduler = _scheduler(args, max_steps)
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
    report = _report(args, replay, record, ranks, max_steps, steps_per_episode, time.monotonic() - t0)
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


def _report(args, replay, record: Record, ranks: list[Rank], max_steps: int, steps_per_episode: int,
            seconds: float) -> dict:
    steps = record.steps
    after_warmup = [s for s in steps if s["step"] > replay.warmup] if replay.enabled else []  # buffer step >= warm-up
    per_step_opt = [sum(s["ranks"]["optimizer_steps"]) / max(len(ranks), 1) for s in steps]
    cumulative = list(_accumulate(ranks[0].steps[i]["optimizer_steps"] for i in range(len(ranks[0].steps)))) \
        if ranks else []
    warmup_opt = _warmup_steps(args, max_steps)
    warmup_rollout = next((i + 1 for i, c in enumerate(cumulative) if c >= warmup_opt), None)
    ages = [s["age_max"] for s in after_warmup if s["replayed"]]
    return {
        "steps_expected": steps_per_episode * args.train.num_episodes,
        "steps_completed": len(steps),
        "steps_per_episode": [sum(1 for s in steps if s["episode"] == e) for e in range(record.episode + 1)],
        "crash": record.crash,
        "crash_step": record.crash_step,
        "shape": {"ranks": len(ranks), "train_micro_batch": args.train.micro_batch_size,
                  "rollout_micro_batch": args.rollout.micro_batch_size,
                  "accumulation": ranks[0].accumulation if ranks else None},
        "fresh_per_step": spread([s["fresh"] for s in steps]),
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
        "lr_after_warmup": spread(ranks[0].lrs[warmup_opt:]) if ranks else None,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openrlhf_replay.cli.rehearse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in vars(Settings()).items():
        if name == "shape":
            parser.add_argument("--shape", action="append", default=[], metavar="FLAGS", help=_field_doc(name))
            continue
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default,
                            help=_field_doc(name))
    parser.add_argument("--report", type=Path, metavar="PATH",
                        help="also write the JSON report to PATH (its folder is created); "
                        "`python -m openrlhf_replay.cli.rehearsal_report` reads such files")
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
    return 0 if ok and report["steps_completed"] == report["steps_expected"] else 1


def _field_doc(name: str) -> str:
    from replay.config import field_help

    return field_help(Settings)[name].replace("%", "%%")


if __name__ == "__main__":
    sys.exit(main())
