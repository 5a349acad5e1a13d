"""The LR schedule with refill (docs/METHOD.md section 9, "The learning-rate schedule"): the policy
actor and the critic pace their schedules by one rule (`experience.py:paced_rows`), and a refill
step whose groups were all dropped (upstream's loop gives it no step) is paced by the step after it,
so the schedule still ends at its end on the run's last optimizer step. Real batches from the
experience maker; each generation call with the counts `ReplaySamplesGenerator` records for it."""
import math
from types import SimpleNamespace

import pytest
import torch
from openrlhf.trainer.ppo_utils.experience import balance_experiences
from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
from transformers import get_scheduler

from openrlhf_replay.trainer.lr_schedule import pace_by_rollout_steps
from openrlhf_replay.trainer.ppo_trainer import skipped_rollouts
from openrlhf_replay.trainer.ppo_utils.experience import paced_rows
from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker
from openrlhf_replay.trainer.ppo_utils.samples_generator import GenerationCounts
from openrlhf_replay.trainer.ray.ppo_actor import _ReplayPolicyModelActor
from openrlhf_replay.trainer.ray.ppo_critic import _ReplayCriticModelActor
from replay import ReplayBuffer, ReplayConfig

REFILL = ["--actor.num_gpus_per_node", 2, "--replay.mode", "advantage", "--replay.warmup", 1, "--replay.refill",
          "--algo.dynamic_filtering_enable"]

DYNAMIC = ["--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", 64, "--rollout.max_tokens_per_gpu", 64]


def _maker(make_args, experience_maker_cls, *flags):
    args = make_args(*REFILL, *flags)
    return experience_maker_cls(ReplayExperienceMaker, args,
                                replay_buffer=ReplayBuffer(ReplayConfig.from_namespace(args))), args


def _generator(args, results):
    """Generation calls as upstream returns them (samples, pass rate, prompts consumed, exhausted),
    each with the counts `ReplaySamplesGenerator` records for it (every prompt consumed generated n
    rollouts; the filtered are those not returned)."""
    n = args.rollout.n_samples_per_prompt
    return iter([(samples, GenerationCounts(consumed * n, consumed * n - len(samples)))
                 for samples, _, consumed, _ in results])


def _refill_step(maker, gen, step: int):
    """`ppo_trainer.py:train_step`'s part: the calls behind the step, the empty ones before it
    included (upstream's `fit` loop gives an empty generation no step)."""
    samples, counts = next(gen)
    calls = [counts]
    while not samples:
        samples, counts = next(gen)
        calls.append(counts)
    maker.step, maker.refill_rows = step, calls[-1].filtered
    maker.skipped_rows = skipped_rollouts(calls)
    return maker.make_experience_batch(samples)


def _received(actor_cls, batch, monkeypatch) -> dict:
    """An actor's `append` of every micro-batch, into upstream's own buffer."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # upstream's buffer names cuda:<index>
    actor = object.__new__(actor_cls)
    actor.trainer = SimpleNamespace(replay_buffer=NaiveReplayBuffer(sample_batch_size=1, cpu_offload=False))
    actor._received = {"fresh": 0, "replayed": 0, "fresh_rows": 0, "rows": 0}
    actor._rows = {"fresh_rows": 0, "rows": 0}
    for exp in batch:
        actor.append(exp)
    counts = actor._rows if actor_cls is _ReplayCriticModelActor else actor._received
    return {k: round(counts[k]) for k in ("fresh_rows", "rows")}


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "dynamic-batch"])
def test_the_critic_paces_its_schedule_by_the_policy_actors_rule(make_args, experience_maker_cls, rollout_samples,
                                                                 monkeypatch, dynamic):
    """With refill, replayed rows stand for the filtered ones: both actors count them as the fresh
    rows they replace (the critic counted them as replayed, so its schedule lagged the actor's)."""
    maker, args = _maker(make_args, experience_maker_cls, *(DYNAMIC if dynamic else []))
    gen = _generator(args, [(rollout_samples(8, 4, seed=1), 100.0, 8, False),
                            (rollout_samples(5, 4, seed=2), 62.5, 8, False)])
    _refill_step(maker, gen, 0)
    batch = _refill_step(maker, gen, 1)  # 3 of 8 groups dropped: 12 rows refilled from the buffer
    assert maker.composition.refilled == 12
    if dynamic:
        batch = balance_experiences(batch, args)  # the controller's dealing: info values become lists
    actor, critic = _received(_ReplayPolicyModelActor, batch, monkeypatch), _received(_ReplayCriticModelActor, batch,
                                                                                     monkeypatch)
    assert actor == critic and actor["fresh_rows"] == 32 < actor["rows"]  # the 32 rollouts generated


@pytest.mark.parametrize("name", ["linear", "cosine_with_min_lr"])
def test_a_refill_step_that_kept_no_group_is_paced_by_the_next_so_the_schedule_ends_at_its_end(
        make_args, experience_maker_cls, rollout_samples, monkeypatch, name):
    """Three rollout steps of 32 rollouts are planned (12 optimizer steps of 8 rows, upstream's
    `get_max_steps`); the second generation's groups are all dropped, so upstream's loop trains two.
    The third step paces the LR for the second's rollouts too: the run's last optimizer step leaves
    the schedule at 12, its end (without that, at 8)."""
    maker, args = _maker(make_args, experience_maker_cls)
    gen = _generator(args, [(rollout_samples(6, 4, seed=1), 75.0, 8, False), ([], 0.0, 8, False),
                            (rollout_samples(7, 4, seed=3), 87.5, 8, False)])
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    kwargs = {"min_lr_rate": 0.1} if name == "cosine_with_min_lr" else {}
    scheduler = pace_by_rollout_steps(get_scheduler(name, optimizer, num_warmup_steps=2, num_training_steps=12,
                                                    scheduler_specific_kwargs=kwargs))
    paced = []
    for step in range(2):
        batch = _refill_step(maker, gen, step)
        rows = sum(len(e.sequences) for e in batch)
        paced.append(round(sum(paced_rows(e) for e in batch)))
        scheduler.pace(paced[-1], rows)
        for _ in range(rows // args.train.batch_size):  # DeepSpeed: the optimizer, then the schedule
            optimizer.step()
            scheduler.step()
    assert paced == [32, 64] and math.isclose(scheduler.position, 12.0)
    end = 0.0 if name == "linear" else 0.1  # the schedule's value at its end
    assert math.isclose(scheduler.get_last_lr()[0], end, abs_tol=1e-12)
