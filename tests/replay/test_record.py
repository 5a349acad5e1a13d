"""RolloutBatch: construction checks, gathers against a per-rollout reference, refusals."""
import numpy as np
import pytest

from replay import REFUSAL_REASONS, RolloutBatch, refusals
from replay.testing import random_batch


def _lists(batch):
    """Per-rollout Python lists: the slow reference the columnar code must agree with."""
    return [dict(prompt=batch.prompt(i).tolist(), response=batch.response(i).tolist(),
                 mask=batch.action_mask[batch.response_offsets[i]:batch.response_offsets[i + 1]].tolist(),
                 logp=batch.behaviour_logprobs[batch.response_offsets[i]:batch.response_offsets[i + 1]].tolist(),
                 reward=float(batch.rewards[i]), adv=float(batch.advantages[i]), uid=int(batch.prompt_uids[i]),
                 group=int(batch.group_ids[i]), version=int(batch.versions[i]), reuse=int(batch.reuse_counts[i]))
            for i in range(len(batch))]


def test_from_lists_round_trip():
    b = RolloutBatch.from_lists([[1, 2], [3]], [[4, 5, 6], [7]], [[1, 1, 0], [1]], [[-.1, -.2, -.3], [-.4]],
                                [1.0, 0.0], [0.7, -0.7], [10, 10], [5, 5], 3)
    assert len(b) == 2
    assert b.prompt_ids.dtype == np.int32 and b.response_ids.dtype == np.int32
    assert b.response_lengths.tolist() == [3, 1] and b.prompt_lengths.tolist() == [2, 1]
    assert b.response(0).tolist() == [4, 5, 6] and b.prompt(1).tolist() == [3]
    assert b.action_mask.tolist() == [True, True, False, True]
    assert b.versions.tolist() == [3, 3] and b.reuse_counts.tolist() == [0, 0]
    assert b.n_tokens == 7


def test_from_lists_rejects_mismatched_lengths_and_out_of_range_ids():
    with pytest.raises(ValueError, match="rollout 1"):
        RolloutBatch.from_lists([[1], [2]], [[3], [4, 5]], [[1], [1]], [[0.0], [0.0, 0.0]], [0, 1], [0, 0],
                                [0, 0], [0, 0], 0)
    with pytest.raises(ValueError, match="differ in length"):
        RolloutBatch.from_lists([[1]], [[3], [4]], [[1], [1]], [[0.0], [0.0]], [0, 1], [0, 0], [0, 0], [0, 0], 0)
    with pytest.raises(ValueError, match="responses: token ids"):
        RolloutBatch.from_lists([[1]], [[2 ** 31]], [[1]], [[0.0]], [0], [0], [0], [0], 0)


@pytest.mark.parametrize("field, bad, message", [
    ("response_ids", lambda b: b.response_ids.astype(np.int64), "response_ids: expected a 1-D int32"),
    ("action_mask", lambda b: b.action_mask.astype(np.uint8), "action_mask: expected a 1-D bool"),
    ("behaviour_logprobs", lambda b: b.behaviour_logprobs[:-1], "behaviour_logprobs: length"),
    ("rewards", lambda b: b.rewards.reshape(1, -1), "rewards: expected a 1-D float32"),
    ("advantages", lambda b: b.advantages[:-1], "advantages: length"),
    ("reuse_counts", lambda b: list(b.reuse_counts), "reuse_counts: expected"),
    ("response_offsets", lambda b: b.response_offsets[:-1], "response_offsets: length"),
    ("prompt_offsets", lambda b: b.prompt_offsets + 1, "prompt_offsets: must rise from 0"),
    ("response_offsets", lambda b: b.response_offsets[[0, 2, 1, 3, 4, 5, 6]], "response_offsets: must rise"),
])
def test_construction_names_the_bad_field(field, bad, message):
    b = random_batch(np.random.default_rng(0), 3, 2)
    with pytest.raises(ValueError, match=message):
        b.replace(**{field: bad(b)})


def test_select_matches_per_rollout_reference():
    b = random_batch(np.random.default_rng(1), 5, 4, version=7, partial_mask=True)
    idx = [3, 0, 0, 19, 4, 5, 6, 12]  # repeats, adjacent runs and jumps
    ref = _lists(b)
    assert _lists(b.select(idx)) == [ref[i] for i in idx]
    assert len(b.select([])) == 0
    with pytest.raises(IndexError):
        b.select([20])


def test_concat_matches_reference_and_skips_empty():
    rng = np.random.default_rng(2)
    parts = [random_batch(rng, 2, 3), RolloutBatch.empty(), random_batch(rng, 1, 2, version=4)]
    both = RolloutBatch.concat(parts)
    assert _lists(both) == _lists(parts[0]) + _lists(parts[2])
    assert len(RolloutBatch.concat([])) == 0


def _padded_by_loop(b: RolloutBatch, pad_id: int) -> dict:
    """OpenRLHF's right-padded micro-batch layout, built row by row (the reference)."""
    width = int((b.prompt_lengths + b.response_lengths).max())
    out = {"sequences": np.full((len(b), width), pad_id, np.int64), "attention_mask": np.zeros((len(b), width), np.int64),
           "action_mask": np.zeros((len(b), width - 1), bool), "behaviour_logprobs": np.zeros((len(b), width - 1), np.float32)}
    for i in range(len(b)):
        p, r = b.prompt(i), b.response(i)
        seg = slice(b.response_offsets[i], b.response_offsets[i + 1])
        out["sequences"][i, :len(p) + len(r)] = np.r_[p, r]
        out["attention_mask"][i, :len(p) + len(r)] = 1
        out["action_mask"][i, len(p) - 1:len(p) + len(r) - 1] = b.action_mask[seg]  # column j scores token j + 1
        out["behaviour_logprobs"][i, len(p) - 1:len(p) + len(r) - 1] = b.behaviour_logprobs[seg]
    return out


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_to_padded_equals_the_row_by_row_layout(seed):
    b = random_batch(np.random.default_rng(seed), 4, 3, partial_mask=True, prompt_len=(1, 9), response_len=(0, 7))
    got, ref = b.to_padded(pad_id=-1), _padded_by_loop(b, -1)
    for key, want in ref.items():
        assert got[key].dtype == want.dtype and np.array_equal(got[key], want), key
    assert got["lengths"].tolist() == (b.prompt_lengths + b.response_lengths).tolist()


def test_refusals_count_each_rollout_once_in_reason_order():
    b = random_batch(np.random.default_rng(4), 4, 2, response_len=(2, 4))
    rewards, adv, logp = b.rewards.copy(), b.advantages.copy(), b.behaviour_logprobs.copy()
    mask = b.action_mask.copy()
    rewards[0] = np.nan
    adv[0] = np.inf  # also bad, but counted under non_finite_reward only
    adv[1] = -np.inf
    logp[b.response_offsets[2]] = np.nan
    logp[b.response_offsets[3]] = -np.inf
    mask[b.response_offsets[3]] = False  # -inf under a False mask is harmless
    offsets = b.response_offsets.copy()
    # rollout 4 becomes empty by giving its tokens to rollout 5
    offsets[5] = offsets[4]
    bad = b.replace(rewards=rewards, advantages=adv, behaviour_logprobs=logp, action_mask=mask,
                    response_offsets=offsets)
    ok, counts = refusals(bad)
    assert ok.tolist() == [False, False, False, True, False, True, True, True]
    assert counts == {"empty_response": 1, "non_finite_reward": 1, "non_finite_advantage": 1,
                      "non_finite_logprob": 1}


def test_refusals_take_the_exact_path_when_the_logprob_sum_is_not_finite():
    b = random_batch(np.random.default_rng(5), 2, 2, response_len=(2, 4))
    # Finite values whose float32 sum overflows: nothing is refused.
    huge = np.full(len(b.response_ids), 3e38, np.float32)
    assert refusals(b.replace(behaviour_logprobs=huge))[0].all()
    # NaN only under False masks: the sum is NaN, but nothing is refused.
    logp, mask = b.behaviour_logprobs.copy(), b.action_mask.copy()
    logp[b.response_offsets[1]], mask[b.response_offsets[1]] = np.nan, False
    assert refusals(b.replace(behaviour_logprobs=logp, action_mask=mask))[0].all()
    mask[b.response_offsets[1]] = True
    assert refusals(b.replace(behaviour_logprobs=logp, action_mask=mask))[0].tolist() == [True, False, True, True]
