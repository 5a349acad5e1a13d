"""The per-step arrays behind the TensorBoard histograms (`replay/metrics.py`), and the
zero-variance share, from the buffer's real steps."""
import numpy as np
import pytest

from replay import ReplayBuffer, ReplayConfig, zero_variance_group_fraction
from replay.metrics import replayed_ages, replayed_uses
from replay.pool import POOL_VERSION
from replay.testing import random_batch


def test_ages_count_steps_since_generation_and_uses_count_this_use():
    rows = random_batch(np.random.default_rng(0), 1, 4).replace(
        versions=np.array([3, 5, 5, POOL_VERSION], np.int64), reuse_counts=np.array([0, 2, 0, 7], np.int32))
    assert replayed_ages(rows, 7).tolist() == [4, 2, 2, 8]  # a pool rollout predates step 0
    assert replayed_uses(rows).tolist() == [1, 3, 1, 8]


@pytest.mark.parametrize("rewards, group_ids, share", [
    ([1, 1, 0, 1, 0, 0], [0, 0, 1, 1, 2, 2], 2 / 3),  # all right and all wrong both teach nothing
    ([0.5, 0.5, 0.5, 0.5], [7, 7, 3, 3], 1.0),  # any equal value, not only 0 or 1; ids need not be 0..k
    ([0, 1, 0, 1], [9, 9, 4, 4], 0.0),
    ([], [], 0.0),  # no group: nothing to count
])
def test_zero_variance_share_counts_groups_of_one_reward(rewards, group_ids, share):
    got = zero_variance_group_fraction(np.asarray(rewards, np.float32), np.asarray(group_ids, np.int64))
    assert got == pytest.approx(share)


def _rollout_keys(batch):
    """Each rollout's identity across steps: its fresh group (unique per step here) and response."""
    return [(int(g), batch.response(i).tobytes()) for i, g in enumerate(batch.group_ids)]


def test_buffer_histograms_hold_one_value_per_replayed_rollout():
    """Every step's arrays: empty in the warm-up, then one age and one use count per replayed row,
    the use count being how often that very rollout was replayed before, plus this time (followed
    by identity over a run that draws rollouts several times)."""
    buf = ReplayBuffer(ReplayConfig(mode="uniform", warmup=2, ratio=1.0, capacity=48, seed=5))
    assert buf.histograms() == {}  # no step yet
    rng = np.random.default_rng(3)
    drawn_before: dict = {}
    for step in range(8):
        comp = buf.step(random_batch(rng, 4, 4, step, group_id_base=100 * step), step)
        hist = buf.histograms()
        assert sorted(hist) == ["replay/replayed_age", "replay/replayed_uses"]
        ages, uses = hist["replay/replayed_age"], hist["replay/replayed_uses"]
        assert len(ages) == len(uses) == len(comp.replayed) == (0 if step < 2 else 16)
        keys = _rollout_keys(comp.replayed)
        assert ages.tolist() == [step - g // 100 for g, _ in keys]  # group ids carry the step made
        assert uses.tolist() == [drawn_before.get(k, 0) + 1 for k in keys]
        for k in keys:
            drawn_before[k] = drawn_before.get(k, 0) + 1
        m = buf.metrics()
        assert m["replay/replayed"] == len(ages) and m["replay/reuse_max"] == uses.max(initial=0)
    assert max(drawn_before.values()) >= 3  # the run did replay rollouts more than once


def test_a_restored_buffer_has_no_step_to_draw(tmp_path):
    buf = ReplayBuffer(ReplayConfig(mode="uniform", warmup=0, seed=5))
    rng = np.random.default_rng(4)
    for step in range(2):
        buf.step(random_batch(rng, 2, 4, step), step)
    assert len(buf.histograms()["replay/replayed_age"]) > 0
    buf.save(tmp_path / "b.npz")
    assert ReplayBuffer.load(tmp_path / "b.npz", buf.config).histograms() == {}
