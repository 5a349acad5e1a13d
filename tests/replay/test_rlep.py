"""RLEP (`success` mode): the per-prompt count, the offline pool file and its refusals, and resume
safety under a changed pool."""
import collections

import numpy as np
import pytest

from replay import (ReplayBuffer, ReplayCheckpointError, ReplayConfig, RolloutStore, compose_rlep, replay_target,
                    sampler_from_config)
from replay.pool import POOL_VERSION, SuccessPool, SuccessPoolError, load_pool, pool_mismatch, save_pool
from replay.keep import SUCCESSES
from replay.testing import random_batch


def _store_with(successes: dict[int, int], failures: int = 3) -> RolloutStore:
    """A success-keeping store with `successes[uid]` successes (and some failures) per prompt."""
    rng = np.random.default_rng(0)
    store = RolloutStore(1000, None, keep=SUCCESSES, success_threshold=0.5)
    uids, rewards = [], []
    for uid, n in successes.items():
        uids += [uid] * (n + failures)
        rewards += [1.0] * n + [0.0] * failures
    batch = random_batch(rng, len(uids), 1).replace(prompt_uids=np.array(uids, np.int64),
                                                    rewards=np.array(rewards, np.float32))
    store.insert(batch, version=0)
    return store


@pytest.mark.parametrize("per_prompt", [1, 2, 3, 5])
def test_each_prompt_gets_min_of_m_and_its_successes_without_duplicates(per_prompt):
    stored = {10: 0, 11: 1, 12: 2, 13: 4, 14: 7, 99: 5}  # 99 is not among the step's prompts
    store = _store_with(stored)
    cfg = ReplayConfig(mode="success", per_prompt=per_prompt)
    sampler = sampler_from_config(cfg)
    fresh_uids = np.array([10, 11, 12, 13, 14])
    rng = np.random.default_rng(1)
    seen = collections.Counter()
    for _ in range(200):
        draw = sampler(store.view(), per_prompt * len(fresh_uids), 5, rng, fresh_prompt_uids=fresh_uids)
        assert len(np.unique(draw.indices)) == len(draw.indices)  # without replacement
        got = collections.Counter(store.view().prompt_uids[draw.indices].tolist())
        assert dict(got) == {u: min(per_prompt, n) for u, n in stored.items() if u != 99 and min(per_prompt, n)}
        assert np.all(store.view().rewards[draw.indices] > 0.5)
        seen.update(draw.indices.tolist())
    # Within a prompt the successes are drawn at random: over many steps each of prompt 14's seven
    # turns up (RLEP's random.sample), not always the same ones.
    of_14 = np.flatnonzero((store.view().prompt_uids == 14) & (store.view().rewards > 0.5))
    assert all(seen[i] > 0 for i in of_14.tolist())


def _three_groups(rng, prompts: list[int]):
    """A fresh batch of three groups of 4 (ids 40, 41, 42) of these prompts, one success in each."""
    return random_batch(rng, 3, 4, 1).replace(
        prompt_uids=np.repeat(np.array(prompts), 4), group_ids=np.repeat(np.array([40, 41, 42]), 4),
        rewards=np.tile(np.array([0, 1, 0, 0], np.float32), 3))


def test_rlep_composition_is_exact_and_names_the_inert_rows_of_the_last_batch():
    rng = np.random.default_rng(2)
    store, fresh = _store_with({7: 3, 8: 1}), _three_groups(rng, [7, 8, 9])
    cfg = ReplayConfig(mode="success", warmup=0, per_prompt=2)
    comp = compose_rlep(fresh, store, sampler_from_config(cfg), cfg, 1, rng, multiple_of=8)
    assert collections.Counter(comp.replayed.prompt_uids.tolist()) == {7: 2, 8: 1}  # min(2, 3), min(2, 1)
    assert comp.inert == 5 and comp.info["inert_rows"] == 5  # 3 replayed + 5 = one batch of 8
    assert compose_rlep(fresh, store, sampler_from_config(cfg), cfg, 1, rng, multiple_of=3).inert == 0


def test_a_prompt_that_comes_in_two_groups_is_served_for_each_group():
    # RLEP's loader samples replay for each question of its batch on its own, so prompt 7 in
    # groups 40 and 42 gets min(2, 3) successes in each; prompt 8 (one success) gets 1 in group 41.
    rng = np.random.default_rng(3)
    store, fresh = _store_with({7: 3, 8: 1}), _three_groups(rng, [7, 8, 7])
    cfg = ReplayConfig(mode="success", warmup=0, per_prompt=2)
    assert replay_target(cfg, len(fresh), 3) == 6  # per_prompt x groups, as the launcher counts
    comp = compose_rlep(fresh, store, sampler_from_config(cfg), cfg, 1, rng, multiple_of=8)
    joined = collections.Counter(zip(comp.replayed.group_ids.tolist(), comp.replayed.prompt_uids.tolist()))
    assert joined == {(40, 7): 2, (41, 8): 1, (42, 7): 2}
    assert comp.inert == 3  # 5 replayed + 3 inert = one batch of 8
    for g in (40, 42):  # within a group, no success twice
        rows = comp.replayed.group_ids == g
        assert len(set(comp.indices[rows].tolist())) == 2


def _pool(n_prompts=3, tokenizer="tok-a", seed=0) -> SuccessPool:
    rng = np.random.default_rng(seed)
    batch = random_batch(rng, n_prompts, 2, POOL_VERSION).replace(
        prompt_uids=np.repeat(np.arange(100, 100 + n_prompts), 2), rewards=np.ones(2 * n_prompts, np.float32))
    return SuccessPool(batch, np.arange(100, 100 + n_prompts + 1), tokenizer, {"model": "seed", "prompts": "p.jsonl"})


def test_pool_round_trips_and_refuses_to_overwrite(tmp_path):
    path = tmp_path / "pool.npz"
    pool = _pool()
    save_pool(path, pool)
    back = load_pool(path)
    assert back.digest == pool.digest and back.successes_per_prompt() == {100: 2, 101: 2, 102: 2}
    assert np.array_equal(back.rollouts.response_ids, pool.rollouts.response_ids)
    with pytest.raises(SuccessPoolError, match="exists; pass --overwrite"):
        save_pool(path, _pool(seed=1))
    save_pool(path, _pool(seed=1), overwrite=True)
    assert load_pool(path).digest != pool.digest
    other = tmp_path / "notes.txt"
    other.write_text("precious")
    with pytest.raises(SuccessPoolError, match="not a readable success pool.*refusing to overwrite"):
        save_pool(other, pool, overwrite=True)
    assert other.read_text() == "precious"


def test_pool_loader_refuses_what_it_cannot_use(tmp_path):
    with pytest.raises(SuccessPoolError, match="no such replay checkpoint.*build_success_pool"):
        load_pool(tmp_path / "missing.npz")
    buf = ReplayBuffer(ReplayConfig(mode="success"))
    buf.save(tmp_path / "ckpt.npz")
    with pytest.raises(SuccessPoolError, match="not a success pool.*a replay checkpoint is not a pool"):
        load_pool(tmp_path / "ckpt.npz")
    corrupt = tmp_path / "corrupt.npz"
    save_pool(corrupt, _pool())
    data = bytearray(corrupt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    with pytest.raises(SuccessPoolError, match="corrupt|not a readable"):
        load_pool(corrupt)
    empty = _pool()
    empty = SuccessPool(empty.rollouts.select(np.zeros(0, np.int64)), empty.decoded_prompt_uids, "tok-a", {})
    save_pool(tmp_path / "empty.npz", empty)
    with pytest.raises(SuccessPoolError, match="holds no successes"):
        load_pool(tmp_path / "empty.npz")


def test_pool_of_another_tokenizer_or_prompt_set_is_refused():
    pool = _pool()
    assert pool_mismatch(pool, "tok-a", np.array([100, 101, 103])) == []  # 103 decoded, no success
    [tokenizer] = pool_mismatch(pool, "tok-b", np.array([100]))
    assert "another tokenizer" in tokenizer and "rebuild it with build_success_pool" in tokenizer
    [prompts] = pool_mismatch(pool, "tok-a", np.array([100, 555, 556]))
    assert "another prompt set: 2 of the run's 3 training prompts were never decoded" in prompts


def test_buffer_replays_the_pool_from_the_first_step_whatever_the_warmup_and_keeps_it_fixed(tmp_path):
    path = tmp_path / "pool.npz"
    save_pool(path, _pool())
    buf = ReplayBuffer(ReplayConfig(mode="success", warmup=20, per_prompt=2, success_pool=str(path)))
    assert len(buf) == 6 and buf.store.view().versions.tolist() == [POOL_VERSION] * 6
    rng = np.random.default_rng(3)
    fresh = random_batch(rng, 2, 4, 0).replace(prompt_uids=np.repeat(np.array([100, 101]), 4),
                                                rewards=np.tile(np.array([1, 0, 0, 1], np.float32), 2))
    for step in (0, 1):  # the warm-up of 20 steps is for pools that fill during the run
        comp = buf.step(fresh.replace(versions=np.full(8, step, np.int64)), step, multiple_of=4)
        assert collections.Counter(comp.replayed.prompt_uids.tolist()) == {100: 2, 101: 2} and comp.inert == 0
    assert len(buf) == 6  # the run's own successes stay out of an offline pool
    in_run = ReplayBuffer(ReplayConfig(mode="success", warmup=20, per_prompt=2))
    in_run.step(fresh, 0, multiple_of=4)  # stores the step's successes of prompts 100 and 101
    assert len(in_run) == 4 and len(in_run.step(fresh.replace(versions=np.ones(8, np.int64)), 1, multiple_of=4).replayed) == 0
    # ... which the in-run pool does not replay before its warm-up ends
    with pytest.raises(ValueError, match="more than replay.capacity 5: pass --replay.capacity 6"):
        ReplayBuffer(ReplayConfig(mode="success", capacity=5, success_pool=str(path)))


def test_resume_under_another_pool_is_refused_with_the_fix(tmp_path):
    first, second = tmp_path / "a.npz", tmp_path / "b.npz"
    save_pool(first, _pool(seed=0))
    save_pool(second, _pool(seed=1))
    cfg = ReplayConfig(mode="success", warmup=0, success_pool=str(first))
    buf = ReplayBuffer(cfg)
    buf.save(tmp_path / "ckpt.npz")
    assert len(ReplayBuffer.load(tmp_path / "ckpt.npz", cfg)) == 6  # the same pool: resumes
    moved = tmp_path / "moved.npz"
    first.rename(moved)  # a pool is known by its contents, not its path
    assert len(ReplayBuffer.load(tmp_path / "ckpt.npz", ReplayConfig(mode="success", success_pool=str(moved)))) == 6
    with pytest.raises(ReplayCheckpointError, match="offline pool .* of digest .*resume with the pool file it was"):
        ReplayBuffer.load(tmp_path / "ckpt.npz", ReplayConfig(mode="success", success_pool=str(second)))
    with pytest.raises(ReplayCheckpointError, match="this run has the in-run pool"):
        ReplayBuffer.load(tmp_path / "ckpt.npz", ReplayConfig(mode="success"))
    with pytest.raises(ReplayCheckpointError, match="replay.success_threshold"):
        ReplayBuffer.load(tmp_path / "ckpt.npz", ReplayConfig(mode="success", success_pool=str(moved),
                                                               success_threshold=0.9))
