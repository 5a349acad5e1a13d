"""The age-0 control (`--replay.mode age0`): its replay part is the step's own rollouts of A != 0."""
import numpy as np
import pytest

from replay import ReplayBuffer, ReplayConfig
from replay.testing import random_batch


def _steps(buf, rng, steps, groups=16, k=8):
    """Fresh batches whose advantage names each row (0 on every third), and the buffer's step."""
    for step in range(steps):
        fresh = random_batch(rng, groups, k, step, group_id_base=100 * step)
        ids = np.arange(1, len(fresh) + 1, dtype=np.float32)
        fresh = fresh.replace(advantages=np.where(ids % 3 == 0, 0, ids + 1000 * step).astype(np.float32))
        yield step, fresh, buf.step(fresh, step, multiple_of=8)


def test_it_replays_the_steps_own_nonzero_rows_after_the_warmup():
    buf = ReplayBuffer(ReplayConfig(mode="age0", ratio=0.5, warmup=2, seed=3))
    for step, fresh, comp in _steps(buf, np.random.default_rng(0), 6):
        if step < 2:
            assert len(comp.replayed) == 0
            continue
        assert len(comp.replayed) == 64  # 0.5 x 128, as uniform's target
        assert (comp.replayed.versions == step).all()  # age 0: nothing from an earlier step
        rows = comp.replayed.advantages
        assert set(rows.tolist()) <= set(fresh.advantages[fresh.advantages != 0].tolist())
        assert len(set(rows.tolist())) == 64  # 86 eligible rows: none twice
        assert buf.metrics()["replay/age_mean"] == 0


def test_a_step_with_few_nonzero_rows_repeats_them_and_one_with_none_replays_nothing():
    buf = ReplayBuffer(ReplayConfig(mode="age0", ratio=0.5, warmup=0, seed=1))
    fresh = random_batch(np.random.default_rng(2), 16, 8, 0)
    adv = np.zeros(len(fresh), np.float32)
    adv[[3, 9, 40]] = [1.0, -1.0, 0.5]
    comp = buf.step(fresh.replace(advantages=adv), 0)
    assert len(comp.replayed) == 64
    assert sorted(set(comp.replayed.advantages.tolist())) == [-1.0, 0.5, 1.0]
    assert np.bincount(np.unique(comp.replayed.advantages, return_inverse=True)[1]).tolist() in \
        ([22, 21, 21], [21, 22, 21], [21, 21, 22])
    assert len(buf.step(fresh.replace(advantages=np.zeros(len(fresh), np.float32), versions=fresh.versions + 1),
                        1).replayed) == 0


def test_refill_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="age0.*own rollouts"):
        ReplayConfig(mode="age0", refill=True)
