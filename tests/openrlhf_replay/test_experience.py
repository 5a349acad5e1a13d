"""Real upstream Experiences into the replay store and back, through upstream's own collate,
DataLoader and PolicyLoss; and mode none leaves upstream's batch untouched."""
import copy

import numpy as np
import pytest
import torch
from openrlhf.models import PolicyLoss
from openrlhf.trainer.ppo_utils.experience import Experience, make_experience_batch, split_experience_batch
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
from torch.utils.data import DataLoader

from openrlhf_replay.trainer.ppo_utils.experience import (
    INERT_KEY,
    REPLAYED_KEY,
    experiences_to_rollouts,
    mark_fresh,
    rollouts_to_experiences,
)
from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker
from replay import ReplayBuffer, ReplayConfig


def rows(experiences):
    """Every row of `experiences` as a single-sample Experience without padding (upstream's split)."""
    out = []
    for exp in experiences:
        for item in split_experience_batch(copy.copy(exp)):
            length = int(item.attention_mask.sum())
            out.append((item, length))
    return out


def test_round_trip_keeps_every_per_token_value(make_args, fresh_batch):
    args = make_args()
    fresh = fresh_batch(args, seed=1)
    rollouts = experiences_to_rollouts(fresh, version=3, n_samples_per_prompt=4)
    assert len(rollouts) == 32 and rollouts.response_ids.dtype == np.int32

    buf = ReplayBuffer(ReplayConfig(mode="uniform", warmup=0))
    buf.step(rollouts, 3)
    stored = buf.store.gather(np.arange(len(buf.store)))
    assert len(stored) == 32  # no zero-variance group in this batch: everything is stored
    back = rollouts_to_experiences(stored, fresh[0], micro_batch_size=5, pad_token_id=0, step=4)

    originals = {tuple(item.sequences[:n].tolist()): (item, n) for item, n in rows(fresh)}
    compared = 0
    for item, n in rows(back):
        orig, m = originals[tuple(item.sequences[:n].tolist())]
        assert n == m
        assert torch.equal(item.attention_mask[:n], orig.attention_mask[:n])
        assert torch.equal(item.action_mask[: n - 1], orig.action_mask[: n - 1])
        mask = orig.action_mask[: n - 1].bool()
        assert torch.equal(item.action_log_probs[: n - 1][mask], orig.action_log_probs[: n - 1][mask])
        # upstream's advantages are also non-zero on prompt positions, which no loss ever reads
        assert torch.equal(item.advantages[: n - 1][mask], orig.advantages[: n - 1][mask])
        assert float(item.rewards) == float(orig.rewards)
        assert set(item.info) == set(orig.info)
        compared += 1
    assert compared == 32


def test_composed_batch_trains_through_upstream_collate_and_loss(make_args, monkeypatch, fresh_batch):
    args = make_args()
    buf = ReplayBuffer(ReplayConfig(mode="advantage", warmup=0))
    step0 = fresh_batch(args, seed=1)
    buf.step(experiences_to_rollouts(step0, 0, 4), 0)
    fresh = fresh_batch(args, seed=2)
    mark_fresh(fresh)
    comp = buf.step(experiences_to_rollouts(fresh, 1, 4), 1)
    assert len(comp.replayed) == 16
    replayed = rollouts_to_experiences(comp.replayed, fresh[0], 4, 0, step=1, is_weights=comp.weights)

    # NaiveReplayBuffer reads the CUDA device in __init__ only to name its sampling target.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    upstream_buffer = NaiveReplayBuffer(sample_batch_size=4, cpu_offload=True)
    for exp in fresh + replayed:
        upstream_buffer.append(exp)
    assert len(upstream_buffer) == 48
    loader = DataLoader(upstream_buffer, batch_size=4, shuffle=True, drop_last=True,
                        collate_fn=upstream_buffer.collate_fn, generator=torch.Generator().manual_seed(0))
    loss_fn = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28)
    replayed_rows = 0
    for batch in loader:
        log_probs = (batch.action_log_probs + 0.05 * torch.randn_like(batch.action_log_probs)).requires_grad_()
        loss, clip_ratio, *_ = loss_fn(log_probs, batch.action_log_probs, batch.advantages, batch.action_mask)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(log_probs.grad).all()
        assert log_probs.grad.abs().sum() > 0
        replayed_rows += int(sum(float(x) for x in batch.info[REPLAYED_KEY]))
    assert replayed_rows == 16


def test_mode_none_returns_upstreams_batch_exactly(make_args, experience_maker_cls, rollout_samples):
    args = make_args()
    samples = rollout_samples(8, 4, seed=3)
    upstream = experience_maker_cls(RemoteExperienceMaker, args).make_experience_batch(copy.deepcopy(samples))
    ours_maker = experience_maker_cls(ReplayExperienceMaker, args, replay_buffer=ReplayBuffer(ReplayConfig()))
    ours = ours_maker.make_experience_batch(copy.deepcopy(samples))
    assert len(ours) == len(upstream)
    for a, b in zip(ours, upstream):
        for name in Experience.__dataclass_fields__:
            x, y = getattr(a, name), getattr(b, name)
            if isinstance(x, torch.Tensor):
                assert torch.equal(x, y), name
            elif name == "info":
                assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
            else:
                assert x == y, name


def test_replay_maker_adds_replayed_rows_after_warmup(make_args, experience_maker_cls, rollout_samples):
    args = make_args("--replay.mode", "advantage", "--replay.warmup", "1")
    maker = experience_maker_cls(ReplayExperienceMaker, args, replay_buffer=ReplayBuffer(ReplayConfig.from_namespace(args)))
    maker.step = 0
    first = maker.make_experience_batch(rollout_samples(8, 4, seed=4))
    assert sum(len(e.sequences) for e in first) == 32  # warm-up: fresh only
    maker.step = 1
    second = maker.make_experience_batch(rollout_samples(8, 4, seed=5))
    flags = torch.cat([e.info[REPLAYED_KEY] for e in second])
    assert len(flags) == 48 and int(flags.sum()) == 16  # round(0.5 * 32) = 16 = 2 batches of 8
    # the batch upstream's actor collates: items of one step must share fields and info keys
    items = [i for e in second for i in split_experience_batch(copy.copy(e))]
    merged = make_experience_batch(items)
    assert merged.sequences.shape[0] == 48


@pytest.mark.parametrize("ratio, expected", [(0.5, 16), (0.3, 8), (1.0, 32)])
def test_replay_count_is_whole_training_batches(make_args, experience_maker_cls, ratio, expected, rollout_samples):
    args = make_args("--replay.mode", "uniform", "--replay.warmup", "0", "--replay.ratio", ratio)
    maker = experience_maker_cls(ReplayExperienceMaker, args, replay_buffer=ReplayBuffer(ReplayConfig.from_namespace(args)))
    maker.step = 0
    maker.make_experience_batch(rollout_samples(8, 4, seed=6))
    maker.step = 1
    out = maker.make_experience_batch(rollout_samples(8, 4, seed=7))
    assert int(torch.cat([e.info[REPLAYED_KEY] for e in out]).sum()) == expected


def test_success_mode_regroups_and_recomputes_fresh_advantages(make_args, experience_maker_cls, rollout_samples):
    # stale: no actor to recompute pi_old with here (tests/openrlhf_replay/test_ray.py does recompute)
    args = make_args("--replay.mode", "success", "--replay.warmup", "1", "--replay.per_prompt", "2",
                     "--replay.off_policy", "stale")
    maker = experience_maker_cls(ReplayExperienceMaker, args, replay_buffer=ReplayBuffer(ReplayConfig.from_namespace(args)))
    maker.step = 0
    maker.make_experience_batch(rollout_samples(8, 4, seed=8))
    stored_successes = len(maker.replay.store)
    assert stored_successes > 0 and (maker.replay.store.view().rewards > 0.5).all()
    maker.step = 1  # the same prompts come back (a second epoch)
    out = maker.make_experience_batch(rollout_samples(8, 4, seed=8))
    replayed = [e for e in out if bool(e.info[REPLAYED_KEY].any())]
    fresh = [e for e in out if not bool(e.info[REPLAYED_KEY].any())]
    n_rows = sum(len(e.sequences) for e in replayed)  # replayed successes and inert rows
    inert = torch.cat([e.info[INERT_KEY] for e in replayed]).bool()
    comp = maker.composition
    assert n_rows == len(comp.replayed) + comp.inert and n_rows % args.train.batch_size == 0
    assert int(inert.sum()) == comp.inert
    # the same samples were generated at both steps, so every replayed success has a fresh twin
    fresh_rows = {tuple(r[: int(m.sum())].tolist()) for e in fresh for r, m in zip(e.sequences, e.attention_mask)}
    for e in replayed:
        for r, m, reward, dead in zip(e.sequences, e.attention_mask, e.rewards, e.info[INERT_KEY].bool()):
            assert dead or (tuple(r[: int(m.sum())].tolist()) in fresh_rows and float(reward) > 0.5)
    # inert rows carry no loss: no action token, advantage 0
    for e in replayed:
        dead = e.info[INERT_KEY].bool()
        assert not e.action_mask[dead].any() and not e.advantages[dead].any()
    # some fresh group got successes added, so its advantages were recomputed (they differ from upstream's)
    plain = experience_maker_cls(RemoteExperienceMaker, args).make_experience_batch(rollout_samples(8, 4, seed=8))
    changed = [not torch.equal(a.advantages, b.advantages) for a, b in zip(fresh, plain)]
    assert any(changed)


def test_replayed_loss_inputs_are_the_stored_record_as_the_loss_reads_it():
    import numpy as np
    import torch

    from openrlhf_replay.trainer.ppo_utils.experience import replayed_loss_inputs
    from replay.testing import random_batch

    batch = random_batch(np.random.default_rng(7), 3, 2, partial_mask=True)
    weights = np.array([1.0, 0.5, 0.25, 1.0, 0.1, 0.8], np.float32)
    padded = batch.to_padded(pad_id=0)
    loss = replayed_loss_inputs(padded, batch.advantages, weights)
    mask = torch.from_numpy(padded["action_mask"])
    assert torch.equal(loss["action_mask"], mask)
    # pi_old (stale anchor) and pi_behaviour are both the stored log-probs
    assert torch.equal(loss["action_log_probs"], torch.from_numpy(padded["behaviour_logprobs"]))
    assert torch.equal(loss["rollout_log_probs"], loss["action_log_probs"])
    # the frozen advantage times the importance weight, on the action tokens only
    want = torch.from_numpy(batch.advantages * weights)[:, None] * mask.float()
    assert torch.allclose(loss["advantages"], want) and torch.equal(loss["returns"], loss["advantages"])
    assert not loss["advantages"][~mask].any()


def test_inert_rows_complete_rleps_count_and_are_shared_over_the_ranks():
    import numpy as np

    from openrlhf_replay.trainer.ppo_utils.experience_maker import share_for_ranks
    from replay import Composition, RolloutBatch
    from replay.testing import random_batch

    replayed = random_batch(np.random.default_rng(3), 5, 1)  # 5 replayed rows, batches of 8: 3 inert
    comp = Composition(RolloutBatch.empty(), replayed, np.ones(5, np.float32), np.arange(5), inert=3)
    shares = share_for_ranks([], comp, 2, 8, 1)  # beside a full fresh batch: no fresh rows to place
    assert [len(s.rows) for s in shares] == [4, 4]
    assert [int(s.inert.sum()) for s in shares] == [1, 2]  # rows 5-7, every other row: shared out
    rows = RolloutBatch.concat([s.rows for s in shares])
    inert = np.concatenate([s.inert for s in shares])
    weights = np.concatenate([s.weights for s in shares])
    assert np.all(weights[inert] == 0) and np.all(weights[~inert] == 1)
    for i in np.flatnonzero(inert):  # one response token, no loss on it, advantage 0
        one = rows.select([i])
        assert one.response_lengths[0] == 1 and not one.action_mask.any() and one.advantages[0] == 0
    assert sorted(rows.select(np.flatnonzero(~inert)).rewards.tolist()) == sorted(replayed.rewards.tolist())
    with pytest.raises(ValueError, match="cannot be split evenly over 2 ranks"):
        share_for_ranks([], Composition(RolloutBatch.empty(), replayed, np.ones(5, np.float32), np.arange(5)), 2, 1, 1)