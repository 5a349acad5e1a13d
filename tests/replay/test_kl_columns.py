"""The optional per-token columns (docs/METHOD.md section 2, "KL" and "A critic"): carried by every batch
operation and the store, counted in bytes only when held, round-tripped by checkpoints, and a
resume under other KL settings refused."""
import numpy as np
import pytest

from replay import ReplayBuffer, ReplayCheckpointError, ReplayConfig, RolloutBatch
from replay.record import refusals
from replay.store import RolloutStore
from replay.keep import EVERYTHING
from replay.testing import random_batch

COLUMNS = ("token_advantages", "ref_logprobs", "token_rewards")


def with_columns(batch: RolloutBatch, rng, columns=COLUMNS) -> RolloutBatch:
    n_tok = len(batch.response_ids)
    return batch.replace(**{c: rng.normal(size=n_tok).astype(np.float32) for c in columns})


def per_rollout(batch: RolloutBatch, name: str) -> list[list[float]]:
    off = batch.response_offsets
    return [getattr(batch, name)[off[i]:off[i + 1]].tolist() for i in range(len(batch))]


def test_select_concat_and_padding_keep_each_token_with_its_value():
    rng = np.random.default_rng(0)
    a, b = (with_columns(random_batch(rng, 3, 4, version=v), rng) for v in (0, 1))
    both = RolloutBatch.concat([a, b])
    assert both.token_columns == COLUMNS
    picked = both.select([13, 2, 2])
    for name in COLUMNS:
        rows = per_rollout(both, name)
        assert per_rollout(picked, name) == [rows[13], rows[2], rows[2]]
    padded = picked.to_padded(pad_id=0)
    mask_cols = padded["action_mask"] | (padded["behaviour_logprobs"] != 0)  # the response's columns
    for name in COLUMNS:
        for i in range(len(picked)):
            lp = picked.prompt_lengths[i]
            cols = np.arange(lp - 1, lp - 1 + picked.response_lengths[i])
            assert padded[name][i, cols].tolist() == per_rollout(picked, name)[i]
            assert not padded[name][i][~mask_cols[i]].any()  # zero off the response
    with pytest.raises(ValueError, match="different optional columns"):
        RolloutBatch.concat([a, random_batch(rng, 1, 4, version=2)])


def test_columns_cost_four_bytes_per_response_token_only_when_held():
    rng = np.random.default_rng(1)
    plain = random_batch(rng, 8, 4, version=0)
    store_plain, store_kl = RolloutStore(1000, None, keep=EVERYTHING), RolloutStore(1000, None, keep=EVERYTHING,
                                                                             token_columns=("ref_logprobs",))
    store_plain.insert(plain)
    store_kl.insert(with_columns(plain, rng, ("ref_logprobs",)))
    assert store_kl.nbytes - store_plain.nbytes == 4 * len(plain.response_ids)
    assert plain.token_columns == () and plain.token_advantages is None


def test_the_store_keeps_the_columns_through_eviction_and_refuses_other_ones():
    rng = np.random.default_rng(2)
    store = RolloutStore(10, 1, keep=EVERYTHING, token_columns=COLUMNS)
    batches = [with_columns(random_batch(rng, 2, 4, version=v), rng) for v in range(3)]
    for v, b in enumerate(batches):
        store.evict(v)
        store.insert(b)
    live = store.gather(np.arange(len(store)))
    expected = RolloutBatch.concat(batches[1:]).select(np.arange(6, 16))  # capacity 10 keeps the newest
    for name in COLUMNS:
        assert per_rollout(live, name) == per_rollout(expected, name)
    with pytest.raises(ValueError, match="this store holds"):
        store.insert(random_batch(rng, 2, 4, version=3))


def test_non_finite_kl_values_are_refused_under_the_mask():
    rng = np.random.default_rng(3)
    batch = with_columns(random_batch(rng, 1, 4, version=0), rng)
    adv, ref = batch.token_advantages.copy(), batch.ref_logprobs.copy()
    adv[batch.response_offsets[1]] = np.nan  # rollout 1
    ref[batch.response_offsets[2]] = -np.inf  # rollout 2
    rewards = batch.token_rewards.copy()
    rewards[batch.response_offsets[3]] = np.inf  # rollout 3: a critic's per-token reward
    ok, counts = refusals(batch.replace(token_advantages=adv, ref_logprobs=ref, token_rewards=rewards))
    assert ok.tolist() == [True, False, False, False]
    assert counts["non_finite_advantage"] == 1 and counts["non_finite_logprob"] == 1
    assert counts["non_finite_reward"] == 1


@pytest.mark.parametrize("columns", [("token_advantages",), ("ref_logprobs",), ("token_rewards",),
                                     ("ref_logprobs", "token_rewards")])  # a critic, with KL as a loss
def test_checkpoints_round_trip_the_columns_and_refuse_other_kl_settings(tmp_path, columns):
    rng = np.random.default_rng(4)
    config = ReplayConfig(mode="advantage", warmup=0)
    buf = ReplayBuffer(config, columns)
    for step in range(3):
        buf.step(with_columns(random_batch(rng, 4, 4, version=step), rng, columns), step)
    path = tmp_path / "replay.npz"
    buf.save(path)
    back = ReplayBuffer.load(path, config, columns)
    a, b = (x.store.gather(np.arange(len(x))) for x in (buf, back))
    assert len(b) == len(a) > 0
    for column in columns:
        assert np.array_equal(getattr(a, column), getattr(b, column))
    other = ("ref_logprobs",) if columns == ("token_advantages",) else ("token_advantages",)
    for settings in ((), other):
        with pytest.raises(ReplayCheckpointError, match=r"per-token KL columns .*--algo\.advantage\.estimator"):
            ReplayBuffer.load(path, config, settings)


def test_a_file_written_without_kl_loads_only_with_kl_off(tmp_path):
    rng = np.random.default_rng(5)
    config = ReplayConfig(mode="uniform", warmup=0)
    buf = ReplayBuffer(config)
    buf.step(random_batch(rng, 4, 4, version=0), 0)
    buf.save(tmp_path / "plain.npz")
    assert len(ReplayBuffer.load(tmp_path / "plain.npz", config)) == len(buf)
    with pytest.raises(ReplayCheckpointError, match=r"none \(KL off\), this run has token_advantages"):
        ReplayBuffer.load(tmp_path / "plain.npz", config, ("token_advantages",))
