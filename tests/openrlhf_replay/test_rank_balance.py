"""Rank balance at 8 data-parallel ranks with rollout micro-batches larger than a group (the 0.6B
scripts' shape: G = 8, micro-batches of 16), for every number of groups dynamic filtering can
keep in a step (docs/METHOD.md section 2, "Dynamic filtering"). Upstream's `_generate_vllm`
returns whatever the data loader had left on an epoch's last step, so any count from 1 to the full
batch reaches the experience maker. Each step runs the real `make_experience_batch` (upstream's
split, advantages and the replay composition); what each rank receives is upstream's chunking of
the list (`RayActorGroup.async_run_method_batch`), or with dynamic batching upstream's
`balance_experiences`; every rank must get the same micro-batches, the same rows, and whole local
training batches, so it takes the same optimizer steps."""
import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from openrlhf.trainer.ppo_utils.experience import balance_experiences, make_experience_batch, split_experience_batch

from openrlhf_replay.trainer.ppo_utils.experience import INERT_KEY, REFILL_KEY, REPLAYED_KEY
from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker
from openrlhf_replay.trainer.ray.dynamic_batch import dynamic_steps
from replay import ReplayBuffer, ReplayConfig

RANKS = 8
SHAPE_06B = ["--rollout.n_samples_per_prompt", 8, "--rollout.batch_size", 128, "--rollout.micro_batch_size", 16,
             "--train.batch_size", 256, "--train.micro_batch_size", 8, "--actor.num_gpus_per_node", RANKS]
# The same shape with a quarter of the prompts (one training batch a step), so that every
# kept-group count runs in seconds.
SHAPE_SMALL = ["--rollout.n_samples_per_prompt", 8, "--rollout.batch_size", 32, "--rollout.micro_batch_size", 16,
               "--train.batch_size", 256, "--train.micro_batch_size", 8, "--actor.num_gpus_per_node", RANKS]
DYNAMIC = ["--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", 64, "--rollout.max_tokens_per_gpu", 64]


def _maker(make_args, experience_maker_cls, shape, *flags):
    args = make_args(*shape, "--algo.dynamic_filtering_enable", "--replay.mode", "advantage",
                     "--replay.max_age", 1000, *flags)
    buffer = ReplayBuffer(ReplayConfig.from_namespace(args))
    return experience_maker_cls(ReplayExperienceMaker, args, replay_buffer=buffer), args


def _step(maker, args, samples, step: int, refill: bool):
    """One step as `ppo_trainer.py:train_step` runs it: with refill, the filtered groups' rows are
    the step's refill rows (no prompt replaced them)."""
    maker.step = step
    full = args.rollout.batch_size * args.rollout.n_samples_per_prompt
    maker.refill_rows = full - len(samples) if refill else 0
    return maker.make_experience_batch(samples)


def _per_rank(batch, args):
    """What each rank trains on: upstream's chunking (or, with dynamic batching, upstream's
    `balance_experiences`, one merged Experience a rank), as (micro-batches, rows) per rank."""
    if args.train.dynamic_batch_enable:
        batch = balance_experiences(batch, args)
    size = -(-len(batch) // RANKS)
    chunks = [batch[r * size:(r + 1) * size] for r in range(RANKS)]
    return [(len(c), sum(len(e.sequences) for e in c)) for c in chunks]


def _check_balanced(batch, args, kept_rows: int, refill_rows: int):
    per_rank = _per_rank(batch, args)
    rows = [n for _, n in per_rank]
    local_batch = args.train.batch_size // RANKS
    if args.train.dynamic_batch_enable:  # upstream re-deals rows by length: only the rows must agree
        dynamic_steps(rows, args.train.batch_size)
    else:
        assert len(set(per_rank)) == 1, per_rank  # same micro-batches and rows on every rank
        assert rows[0] % local_batch == 0, (rows[0], local_batch)  # whole optimizer steps, no row dropped
    flags = {k: torch.cat([torch.as_tensor(e.info[k]).float() for e in batch]) for k in (REPLAYED_KEY, INERT_KEY,
                                                                                        REFILL_KEY)}
    assert int((flags[REPLAYED_KEY] == 0).sum()) == kept_rows  # every fresh row, once
    assert int(flags[REFILL_KEY].sum()) == refill_rows  # the LR is paced as for every row generated
    for e in batch:  # inert rows train nothing
        assert not e.action_mask[torch.as_tensor(e.info[INERT_KEY]).bool()].any()


@pytest.mark.parametrize("refill", [False, True], ids=["no-refill", "refill"])
def test_the_06b_shape_with_17_groups_kept_is_balanced(make_args, experience_maker_cls, rollout_samples, refill):
    """The issue's reproduction: 17 of 128 groups at step 0 (warm-up) raised in share_for_ranks."""
    maker, args = _maker(make_args, experience_maker_cls, SHAPE_06B, *(["--replay.refill"] if refill else []))
    samples = rollout_samples(17, 8)
    batch = _step(maker, args, samples, 0, refill)
    _check_balanced(batch, args, 17 * 8, (128 - 17) * 8 if refill else 0)
    fresh = [e for e in batch if not torch.as_tensor(e.info[REPLAYED_KEY]).any()]
    rows = [row for e in fresh for row in split_experience_batch(copy.copy(e))]  # as the actor splits them
    assert [int(r.total_length) for r in rows] == [int(s.total_length) for s in samples]  # each once, in order
    make_experience_batch(rows)  # and collates them again


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "dynamic-batch"])
@pytest.mark.parametrize("replay", [False, True], ids=["warm-up", "replaying"])
@pytest.mark.parametrize("refill", [False, True], ids=["no-refill", "refill"])
def test_every_kept_group_count_is_balanced(make_args, experience_maker_cls, rollout_samples, refill, replay,
                                            dynamic):
    """Every count of kept groups from 1 to the full batch, as the short last step of an epoch
    (after a full step) or refill's filtered step; `warm-up`: nothing is drawn (with refill, the
    buffer cannot stand in for a row yet: inert rows take them all)."""
    flags = ["--replay.ratio", 1.0, "--replay.warmup", 1 if replay else 10_000]
    maker, args = _maker(make_args, experience_maker_cls, SHAPE_SMALL, *flags, *(["--replay.refill"] if refill else []),
                         *(DYNAMIC if dynamic else []))
    groups, g = args.rollout.batch_size, args.rollout.n_samples_per_prompt
    _step(maker, args, rollout_samples(groups, g, seed=0), 0, refill)
    drawn = 0
    for kept in range(1, groups + 1):
        batch = _step(maker, args, rollout_samples(kept, g, seed=kept), kept, refill)
        drawn += len(maker.composition.replayed)
        _check_balanced(batch, args, kept * g, (groups - kept) * g if refill else 0)
    assert (drawn > 0) == replay


def test_a_rank_whose_fresh_rows_exceed_the_steps_share_gets_inert_batches_added():
    """32 ranks, 33 fresh micro-batches of 16 (528 rows) and 232 replayed: 760 rows make 768, 24 a
    rank, but the rank that holds two fresh micro-batches has 32. The rehearsal's matrix met it at
    0.6B on 4 nodes of 8 ("a rank holds 32 fresh rows, more than its 24"): the step now adds inert
    training batches until every rank's fresh rows fit, and every rank still gets equal rows."""
    from replay.testing import random_batch
    from openrlhf_replay.trainer.ppo_utils.experience_maker import share_for_ranks

    rng = np.random.default_rng(0)
    fresh = random_batch(rng, n_groups=66, group_size=8, version=0)
    old = random_batch(rng, n_groups=29, group_size=8, version=0)
    comp = SimpleNamespace(replayed=old, weights=np.ones(len(old), np.float32), inert=0, refilled=0)
    shares = share_for_ranks([16] * 33, comp, 32, 256, 16, like=fresh)
    rows = [16 * (s.fresh.stop - s.fresh.start) + len(s.rows) for s in shares]
    assert len(set(rows)) == 1 and rows[0] >= 32 and (rows[0] * 32) % 256 == 0
    assert sum(int(s.inert.sum()) for s in shares) == rows[0] * 32 - 528 - 232
