"""The rehearsal's stand-ins, and only these: generation and rewards (`Generation`), the ranks'
log-prob forward and training (`Rank`, counted as DeepSpeed would), Ray's object store and actor
handles (`in_process_object_store`, `_Handle`), and the stubs a shadow shape runs on (`Shadow`).
How they behave is `Settings`. Everything else a rehearsal runs is the real code (`driver.py`).
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import ray
import torch
from openrlhf.trainer.ray.launcher import BaseModelActor, RayActorGroup

from infra.models import train_tokenizer
from openrlhf_replay.trainer.ray.dynamic_batch import dynamic_steps
from openrlhf_replay.utils import data_parallel_ranks
from replay import ReplayConfig

# Deferred imports here (the experience helpers, upstream's samples generator) pull in upstream
# modules the CPU platform adapts (its replay buffer): they are imported only once the driver has
# installed the CPU hooks (`_rehearsal_environment`), so they load adapted.


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



class Rank:
    """One data-parallel rank of the policy actor group, in this process: it receives its chunk of
    every batch through upstream's own dispatch, and `fit` counts what its training would do."""

    def __init__(self, rank: int, args, accumulation: int, rng) -> None:
        self.rank, self.args, self.accumulation, self.rng = rank, args, accumulation, rng
        self.scheduler = None  # rank 0 steps the run's LR scheduler (set once its length is known)
        self.peers: list[Rank] = []  # the group's ranks (rank 0 paces the scheduler by their rows)
        self.lr_positions: list[float] = []  # the schedule's position after each rollout step (rank 0)
        self.strategy = SimpleNamespace(is_rank_0=lambda: False)  # upstream's execute_batch reads it
        self.pending = 0  # micro-batches of an unfinished accumulation window (DeepSpeed keeps them)
        self.received = {"fresh": 0, "replayed": 0, "rows": 0, "replayed_rows": 0}  # this step
        self.steps: list[dict] = []  # one record per rollout step
        self.checkpoint_states: dict = {}
        self.lrs: list[tuple[float, float]] = []  # (position, LR) each optimizer step ran at

    execute_batch = BaseModelActor.execute_batch  # upstream's per-item dispatch of a chunk

    def forward(self, sequences, action_mask=None, attention_mask=None, **_):
        return -torch.from_numpy(self.rng.exponential(size=tuple(action_mask.shape))).float()

    def append(self, experience) -> None:
        """Upstream's actor splits each Experience into its rows (`NaiveReplayBuffer.append`)."""
        from openrlhf_replay.trainer.ppo_utils.experience import REFILL_KEY, REPLAYED_KEY

        flags = experience.info.get(REPLAYED_KEY)  # a list after upstream's balance_experiences
        replayed_rows = 0 if flags is None else int(torch.as_tensor(flags).bool().sum())
        refill = experience.info.get(REFILL_KEY)  # refill's rows pace the LR as the fresh rows they stand for
        replayed_rows -= 0 if refill is None else int(torch.as_tensor(refill).bool().sum())
        self.received["replayed" if replayed_rows else "fresh"] += 1
        self.received["rows"] += len(experience.sequences)
        self.received["replayed_rows"] += replayed_rows

    def fit(self, kl_ctl: float = 0) -> dict:
        """Upstream's `ppo_train`: a DataLoader of train.micro_batch_size over the rows, drop_last, once
        per epoch; DeepSpeed steps the optimizer every `accumulation` micro-batches."""
        got, micro = self.received, self.args.train.micro_batch_size
        if self.args.train.dynamic_batch_enable:
            # The actor's rule (AllRowsReplayBuffer), which stops the step where rows would go
            # untrained, so none is dropped; the packing by tokens, which sets only how many
            # micro-batches a step takes, is not modelled. Equal ranks hold equal rows here.
            ranks = data_parallel_ranks(self.args)
            steps = dynamic_steps([got["rows"]] * ranks, self.args.train.batch_size)
            optimizer_steps = steps * self.args.train.max_epochs
            dropped = 0
        else:
            micro_batches = got["rows"] // micro * self.args.train.max_epochs
            self.pending += micro_batches
            optimizer_steps, self.pending = divmod(self.pending, self.accumulation)
            dropped = got["rows"] % micro
        if self.scheduler is not None:  # paced by the step's rows summed over the ranks, as the actor does
            peers = self.peers or [self]
            rows = sum(r.received["rows"] for r in peers)  # rank 0 fits first: the others still hold theirs
            self._step_scheduler(optimizer_steps, rows - sum(r.received["replayed_rows"] for r in peers), rows)
        self.steps.append({"fresh_micro_batches": got["fresh"], "replayed_micro_batches": got["replayed"],
                           "rows": got["rows"], "replayed_rows": got["replayed_rows"],
                           "dropped_rows": dropped, "optimizer_steps": optimizer_steps,
                           "carried_micro_batches": self.pending})
        self.received = {"fresh": 0, "replayed": 0, "rows": 0, "replayed_rows": 0}
        return {}

    def _step_scheduler(self, optimizer_steps: int, fresh_rows: int, rows: int) -> None:
        """As DeepSpeed steps it, after each optimizer step; with replay the actor paces it first."""
        from openrlhf_replay.trainer.lr_schedule import RolloutPacedLR

        if isinstance(self.scheduler, RolloutPacedLR):
            self.scheduler.pace(fresh_rows, rows)
        for _ in range(optimizer_steps):
            self.lrs.append((_position(self.scheduler), self.scheduler.get_last_lr()[0]))
            self.scheduler.step()
        self.lr_positions.append(_position(self.scheduler))

    def save_checkpoint(self, tag, client_states=None, metric_value=None, metric_key=None) -> None:
        self.checkpoint_states = copy.deepcopy(client_states or {})
        os.makedirs(os.path.join(self.args.ckpt.path, "_actor", tag), exist_ok=True)

    def get_checkpoint_states(self) -> dict:
        return self.checkpoint_states

    def empty_cache(self) -> None:
        pass

    reload_states = offload_states = broadcast_to_vllm = empty_cache


def _position(scheduler) -> float:
    """Where a schedule stands, in upstream's steps: paced by rollout steps, or one per step taken."""
    return getattr(scheduler, "position", scheduler.last_epoch)


class _Local:
    """An object handed over in-process where Ray would hand over an object reference."""

    __slots__ = ("value",)

    def __init__(self, value) -> None:
        self.value = value


@contextlib.contextmanager
def in_process_object_store():
    """`ray.put` wraps an object, `ray.get` unwraps it (lists too), `ray.wait` finds every object
    ready, for the rehearsal's duration."""
    def get(refs, *args, **kwargs):
        return [get(r) for r in refs] if isinstance(refs, list) else refs.value

    def wait(refs, num_returns=1, **kwargs):  # every object is ready at once
        return list(refs[:num_returns]), list(refs[num_returns:])

    put, original_get, original_wait = ray.put, ray.get, ray.wait
    ray.put, ray.get, ray.wait = _Local, get, wait
    try:
        yield
    finally:
        ray.put, ray.get, ray.wait = put, original_get, original_wait


class _Stub:
    """A micro-batch of a shadow shape: only its row count and kind."""

    def __init__(self, rows: int, replayed: bool) -> None:
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
        from openrlhf_replay.trainer.ppo_utils.experience_maker import (arrange_for_ranks, fresh_micro_batch_size,
                                                                        share_for_ranks)

        if self.crash:
            return
        try:
            micro, dynamic = self.args.rollout.micro_batch_size, self.args.train.dynamic_batch_enable
            size = micro if dynamic else fresh_micro_batch_size(n_fresh, micro, data_parallel_ranks(self.args))
            fresh = [_Stub(min(size, n_fresh - lo), False) for lo in range(0, n_fresh, size)]
            ray.get(self.group.async_run_method_batch(method_name="forward", sequences=fresh))
            batch = fresh
            if composition is not None:
                # The experience maker's own share (with its inert rows), at this shape's rank count.
                shares = share_for_ranks([len(f.sequences) for f in fresh], composition, data_parallel_ranks(self.args),
                                         self.args.train.batch_size, micro, like=composition.fresh,
                                         refill=ReplayConfig.from_namespace(self.args).refill, rebalanced=dynamic)
                per_rank = [[_Stub(hi - lo, True) for lo, hi in s.parts] for s in shares]
                batch = arrange_for_ranks(fresh, per_rank, [s.fresh for s in shares], equal=not dynamic,
                                          fresh_parts=[s.fresh_parts for s in shares],
                                          select=lambda item, lo, hi: _Stub(hi - lo, False))
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


def actor_group(ranks: list[Rank], duplicate: int):
    """Upstream's `RayActorGroup` (its own chunking code) over the stand-in ranks."""
    group = object.__new__(RayActorGroup)
    group._num_nodes, group._num_gpus_per_node = 1, len(ranks)
    group._actor_handlers = [_Handle(r) for r in ranks]
    group.duplicate_actors = duplicate
    return group


def write_tokenizer(prompts: list[str], folder: Path) -> Path:
    """A small byte-level BPE tokenizer trained on the run's own prompts, for what the controller
    reads through a tokenizer (its dataset's templates, a decoded sample in its log)."""
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


def stand_in_prompt_ids(prompt: str, vocab: int, settings: Settings) -> list[int]:
    """`prompt_tokens` token ids drawn from the prompt's text (equal prompts, equal ids)."""
    seed = int.from_bytes(hashlib.sha256(b"ids" + prompt.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).integers(3, vocab, settings.prompt_tokens).tolist()


class Generation:
    """Stands for vLLM and the reward function: per prompt, `n` responses of sampled lengths, each
    correct with the prompt's own probability (`solve_probability`)."""

    def __init__(self, samples_generator, tokenizer, args, settings: Settings, rng) -> None:
        self.sg, self.tokenizer, self.args, self.settings, self.rng = samples_generator, tokenizer, args, settings, rng
        self.vocab = len(tokenizer)  # transformers rebuilds the vocabulary to measure it: once
        self.solve: dict[str, float] = {}  # prompt -> P(correct), drawn on first sight
        self.generated = 0  # responses generated: what the run's logged counts must add up to

    def prompt_ids(self, prompt: str) -> list[int]:
        return stand_in_prompt_ids(prompt, self.vocab, self.settings)

    def __call__(self, prompts, labels, *, images=None, **generate_kwargs):
        """Upstream's `_dispatch_prompts_to_vllm`: one object reference per prompt, holding its `n`
        responses as vLLM's `generate_responses` returns them (rewards included), so upstream's own
        `_generate_vllm` loop runs: dynamic filtering and its replacement prompts, or refill's none."""
        n = generate_kwargs.get("n_samples_per_prompt", self.args.rollout.n_samples_per_prompt)
        cap = self.args.rollout.max_new_tokens
        with_log_probs = self.args.algo.advantage.is_correction_level != "off"
        refs = []
        self.generated += n * len(prompts)
        for prompt, label in zip(prompts, labels):
            ids = self.prompt_ids(prompt)
            if prompt not in self.solve:
                self.solve[prompt] = solve_probability(prompt, self.settings)
            p = self.solve[prompt]
            lengths = self.rng.geometric(1 / self.settings.response_tokens, size=n)
            responses = []
            for length, correct in zip(lengths, self.rng.random(n) < p):
                length = int(min(length, cap))
                response = self.rng.integers(3, self.vocab, length).tolist()
                reward = float(correct)
                observation = ids + response
                responses.append({
                    "observation_tokens": observation, "action_ranges": [(len(ids), len(observation))],
                    "reward": reward, "scores": reward, "prompt": prompt, "label": label, "truncated": length >= cap,
                    "rollout_log_probs": (-self.rng.exponential(size=len(observation))).tolist() if with_log_probs
                    else None, "extra_logs": {}})
            refs.append(_Local(responses))
        return refs
