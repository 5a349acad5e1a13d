"""Composers: fresh-anchored counts and RLEP group enlargement with recomputed advantages."""
import numpy as np
import pytest

from replay import (ReplayConfig, RolloutBatch, RolloutStore, compose, compose_rlep, group_normalise,
                    nominal_replay_count, replay_count, replay_target, sampler_from_config)
from replay.keep import EVERYTHING, SUCCESSES
from replay.testing import random_batch


@pytest.mark.parametrize("n_fresh, ratio, step, warmup, available, k", [
    (1024, 0.5, 20, 20, 10_000, 512),  # the default: replay starts at step == warmup
    (1024, 0.5, 19, 20, 10_000, 0),  # warm-up
    (1024, 0.5, 30, 20, 100, 100),  # fewer when the buffer holds fewer
    (5, 0.5, 30, 0, 100, 3),  # 2.5 rounds half up
    (7, 0.0, 30, 0, 100, 0),
    (10, 2.0, 30, 0, 100, 20),
    (10, 1.0, 30, 0, 0, 0),
])
def test_replay_count(n_fresh, ratio, step, warmup, available, k):
    assert replay_count(nominal_replay_count(n_fresh, ratio), step, warmup, available) == k


@pytest.mark.parametrize("n_fresh, ratio, available, m, k", [
    (1024, 0.5, 10_000, 64, 512),
    (100, 0.5, 10_000, 16, 48),  # 50 rounds to the nearest multiple
    (100, 0.5, 40, 16, 32),  # the buffer allows 40: the largest multiple is 32
    (100, 0.5, 15, 16, 0),
])
def test_replay_count_multiple_of(n_fresh, ratio, available, m, k):
    assert replay_count(nominal_replay_count(n_fresh, ratio, m), 30, 0, available, multiple_of=m) == k
    with pytest.raises(ValueError, match="multiple_of must be an integer >= 1, got 0"):
        nominal_replay_count(n_fresh, ratio, multiple_of=0)


@pytest.mark.parametrize("ratio, k", [(0.5, 512), (0.625, 768), (0.125, 256), (0.12, 0), (1.0, 1024)])
def test_one_rounding_rule_halves_up_to_whole_training_batches(ratio, k):
    # 1,024 fresh rollouts per step, training batches of 256 (the launch scripts' settings).
    assert nominal_replay_count(1024, ratio, 256) == k
    # The buffer draws the same count.
    assert replay_target(ReplayConfig(mode="uniform", ratio=ratio), 1024, 128, 256) == k


@pytest.mark.parametrize("mode", ["naive", "uniform", "advantage", "freshness", "success"])
def test_replayed_count_is_a_multiple_when_asked(mode):
    from replay import ReplayBuffer
    rng = np.random.default_rng(11)
    buf = ReplayBuffer(ReplayConfig(mode=mode, warmup=0, ratio=0.7, seed=2, beta_steps=6))
    for step in range(6):
        # Groups of 3 with few prompts: group draws and RLEP draws rarely land on a multiple of 4.
        comp = buf.step(random_batch(rng, 5, 3, step, n_prompts=3, group_id_base=10 * step), step, multiple_of=4)
        if mode == "success":  # RLEP's exact count, and inert rows that complete the last batch
            assert (len(comp.replayed) + comp.inert) % 4 == 0 and comp.inert < 4
            assert len(comp.replayed) <= 2 * len(np.unique(comp.fresh.group_ids))  # per_prompt x groups
            continue
        assert len(comp.replayed) % 4 == 0 and len(comp.replayed) <= nominal_replay_count(15, 0.7, 4)
    assert buf.metrics()["replay/replayed"] > 0 or mode == "success"


def test_group_normalise_matches_torch_group_norm():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    rewards = rng.random(24).astype(np.float32)
    group = np.repeat(np.arange(6), 4)
    r = torch.from_numpy(rewards).reshape(-1, 4)
    ref = ((r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-9)).reshape(-1).numpy()
    assert np.allclose(group_normalise(rewards, group), ref, atol=1e-5)
    ref_dr = (r - r.mean(-1, keepdim=True)).reshape(-1).numpy()
    assert np.allclose(group_normalise(rewards, group, divide_by_std=False), ref_dr, atol=1e-6)
    # Unequal, interleaved groups; a singleton gets 0; equal rewards get 0.
    got = group_normalise(np.array([1, 0, 5, 1, 1, 0], np.float32), np.array([0, 1, 2, 0, 1, 1]))
    assert got[2] == 0 and got[0] == 0 and got[3] == 0
    sub = torch.tensor([0.0, 1.0, 0.0])
    assert np.allclose(got[[1, 4, 5]], ((sub - sub.mean()) / (sub.std() + 1e-9)).numpy(), atol=1e-6)


def _filled_store(rng, versions, **kw):
    store = RolloutStore(10_000, None, keep=EVERYTHING)
    for v in versions:
        store.insert(random_batch(rng, 4, 4, v, **kw), version=v)
    return store


def test_compose_keeps_all_fresh_then_adds_k_replayed():
    rng = np.random.default_rng(1)
    store = _filled_store(rng, range(3))
    cfg = ReplayConfig(mode="advantage", warmup=0, ratio=0.5)
    fresh = random_batch(rng, 5, 4, 3)
    comp = compose(fresh, store, sampler_from_config(cfg), cfg, 3, rng)
    assert len(comp.replayed) == 10 and len(comp.batch) == 30
    assert comp.batch.select(np.arange(20)).response_ids.tolist() == fresh.response_ids.tolist()
    assert comp.is_replay.tolist() == [False] * 20 + [True] * 10
    assert np.array_equal(comp.replayed.response_ids, store.gather(comp.indices).response_ids)
    assert len(store) == 48  # composing does not change the store
    # Before warm-up and from an empty store: fresh only.
    early = compose(fresh, store, sampler_from_config(cfg), ReplayConfig(mode="advantage", warmup=10), 3, rng)
    assert len(early.replayed) == 0 and early.batch is fresh
    empty = compose(fresh, RolloutStore(10, None, keep=EVERYTHING), sampler_from_config(cfg), cfg, 3, rng)
    assert len(empty.replayed) == 0


def test_rlep_successes_join_their_prompt_group_and_advantages_are_recomputed():
    rng = np.random.default_rng(2)
    store = RolloutStore(100, None, keep=SUCCESSES, success_threshold=0.5)
    # Stored: successes of prompts 7 and 8 (three of 7, one of 8).
    old = random_batch(rng, 2, 4, 0, n_prompts=1).replace(
        prompt_uids=np.array([7, 7, 7, 7, 8, 8, 8, 8]), rewards=np.array([1, 1, 1, 0, 0, 1, 0, 0], np.float32))
    assert store.insert(old, version=0).inserted == 4
    # Fresh: prompt 7 all wrong (zero variance), prompt 9 mixed (no stored successes).
    fresh = random_batch(rng, 2, 4, 1).replace(
        prompt_uids=np.array([7, 7, 7, 7, 9, 9, 9, 9]), group_ids=np.array([40, 40, 40, 40, 41, 41, 41, 41]),
        rewards=np.array([0, 0, 0, 0, 1, 0, 0, 1], np.float32),
        advantages=np.array([0, 0, 0, 0, 0.87, -0.87, -0.87, 0.87], np.float32))
    cfg = ReplayConfig(mode="success", warmup=0, per_prompt=2)
    # min(M = 2, stored) per prompt: two of prompt 7's three; prompt 9 has none stored.
    comp = compose_rlep(fresh, store, sampler_from_config(cfg), cfg, 1, rng)
    assert len(comp.replayed) == 2 and set(comp.replayed.prompt_uids.tolist()) == {7}
    assert comp.replayed.group_ids.tolist() == [40, 40]
    batch = comp.batch
    assert batch.group_ids.tolist() == [40] * 6 + [41] * 4  # grouped, fresh before replayed
    assert comp.is_replay.tolist() == [False] * 4 + [True] * 2 + [False] * 4
    expected = group_normalise(np.array([0, 0, 0, 0, 1, 1], np.float32), np.zeros(6, np.int64))
    assert np.allclose(batch.advantages[:6], expected)
    dr = compose_rlep(fresh, store, sampler_from_config(cfg), cfg, 1, rng, divide_by_std=False)  # dr_grpo
    assert np.allclose(dr.batch.advantages[:6], [-1 / 3] * 4 + [2 / 3] * 2)
    # Not cut to whole batches: the integration adds inert rows up to the next multiple.
    assert compose_rlep(fresh, store, sampler_from_config(cfg), cfg, 1, rng, multiple_of=4).inert == 2
    assert np.array_equal(batch.advantages[6:], fresh.advantages[4:])  # untouched group keeps its values
    assert comp.info["enlarged_group_fraction"] == 0.5
    # Before warm-up: fresh only, advantages as given.
    early = compose_rlep(fresh, store, sampler_from_config(cfg), ReplayConfig(mode="success", warmup=5), 1, rng)
    assert len(early.replayed) == 0 and np.array_equal(early.batch.advantages, fresh.advantages)


def test_composition_batch_of_empty_replay_is_fresh():
    rng = np.random.default_rng(3)
    fresh = random_batch(rng, 2, 2)
    cfg = ReplayConfig(mode="uniform", warmup=0)
    comp = compose(fresh, RolloutStore(10, None, keep=EVERYTHING), sampler_from_config(cfg), cfg, 0, rng)
    assert comp.batch is fresh and isinstance(comp.replayed, RolloutBatch)


def test_openrlhf_group_norm_is_still_the_formula_mirrored():
    """group_normalise mirrors upstream's group_norm (torch std, Bessel-corrected, + 1e-9). Read
    upstream's source without importing it (that would pull in torch, DeepSpeed, vLLM)."""
    import importlib.util
    import pathlib
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("openrlhf is not installed")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "trainer/ppo_utils/experience_maker.py"
    source = " ".join(path.read_text().split())
    assert ('rewards = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)'
            in source), f"upstream group_norm changed in {path}: update replay.composer.group_normalise"
