"""RolloutStore: keep rules, counters, FIFO capacity and age eviction, gathers, state."""
import numpy as np
import pytest

from replay import RolloutBatch, RolloutStore
from replay.keep import EVERYTHING, NONZERO_ADVANTAGE, NONZERO_GROUP, SUCCESSES
from replay.testing import random_batch


ADVANTAGE = dict(keep=NONZERO_ADVANTAGE, min_abs_advantage=1e-6)  # the advantage mode's store


def _batch(rewards, group_ids, version=0, adv=None, seed=0):
    """A batch with given rewards and groups; advantages as given or group-normalised."""
    rng = np.random.default_rng(seed)
    n = len(rewards)
    b = random_batch(rng, n, 1, version)
    from replay import group_normalise
    g = np.asarray(group_ids)
    a = np.asarray(adv, np.float32) if adv is not None else group_normalise(np.asarray(rewards, np.float32), g)
    return b.replace(rewards=np.asarray(rewards, np.float32), advantages=a, group_ids=g.astype(np.int64))


def test_zero_advantage_rollouts_are_skipped_and_counted():
    s = RolloutStore(100, 10, **ADVANTAGE)
    b = _batch([1, 1, 0, 1, 0, 0], [0, 0, 1, 1, 2, 2])  # group 0 and 2 have zero variance
    res = s.insert(b, version=3)
    assert (res.inserted, res.skipped_zero_adv, res.filtered) == (2, 4, 4)
    assert len(s) == 2 and s.counters["inserted"] == 2 and s.counters["skipped_zero_adv"] == 4
    assert s.view().versions.tolist() == [3, 3]
    assert s.view().rewards.tolist() == [0.0, 1.0]


def test_nonzero_group_keeps_whole_informative_groups():
    s = RolloutStore(100, None, keep=NONZERO_GROUP, min_abs_advantage=1e-6)
    b = _batch([1, 1, 0, 1, 0.5, 0.5], [0, 0, 1, 1, 2, 2], adv=[0, 0, 0, 1e-3, 0, 0])
    assert s.insert(b).inserted == 2
    assert s.view().group_ids.tolist() == [1, 1]  # the member with |A| = 0 travels with its group


def test_success_rule_stores_only_correct_rollouts():
    s = RolloutStore(100, None, keep=SUCCESSES, success_threshold=0.5)
    res = s.insert(_batch([1, 0, 1, 0.5], [0, 0, 0, 0], adv=[0, 0, 0, 0]))  # |A| = 0 does not matter here
    assert (res.inserted, res.skipped_unsuccessful, res.skipped_zero_adv) == (2, 2, 0)
    assert s.counters["skipped_unsuccessful"] == 2


def test_invalid_rollouts_are_refused_and_counted():
    s = RolloutStore(100, None, keep=EVERYTHING)
    b = _batch([1, 0, 1, 0], [0, 0, 1, 1])
    res = s.insert(b.replace(rewards=np.array([np.nan, 0, 1, 0], np.float32)))
    assert res.inserted == 3 and res.refused["non_finite_reward"] == 1
    assert s.counters["refused/non_finite_reward"] == 1


def test_capacity_evicts_oldest_first():
    s = RolloutStore(5, None, keep=EVERYTHING)
    for v in range(3):
        res = s.insert(_batch([1, 0, 1], [0, 0, 0], seed=v), version=v)
    assert res.evicted_capacity == 3 and len(s) == 5
    assert s.view().versions.tolist() == [1, 1, 2, 2, 2]
    assert s.view().serials.tolist() == [4, 5, 6, 7, 8]
    assert s.counters["evicted_capacity"] == 4
    # One insertion larger than the capacity keeps its newest rollouts.
    big = _batch([1, 0] * 4, [0] * 8, seed=9)
    s.insert(big, version=5)
    assert s.view().serials.tolist() == [12, 13, 14, 15, 16]
    assert np.array_equal(s.gather([0]).response_ids, big.response(3))


def test_age_eviction_removes_exactly_the_too_old():
    s = RolloutStore(1000, 2, keep=EVERYTHING)
    for v in range(5):
        s.insert(_batch([1, 0], [0, 0], seed=v), version=v)
    assert s.evict(4) == (4, 0)  # age 4 - 0 and 4 - 1 > 2
    assert s.view().versions.tolist() == [2, 2, 3, 3, 4, 4]
    assert s.evict(4) == (0, 0)
    assert s.evict(10) == (6, 0) and len(s) == 0
    assert s.counters["evicted_age"] == 10


def test_versions_must_not_decrease():
    s = RolloutStore(10, None, keep=EVERYTHING)
    s.insert(_batch([1, 0], [0, 0]), version=5)
    with pytest.raises(ValueError, match="must not decrease"):
        s.insert(_batch([1, 0], [0, 0]), version=4)
    with pytest.raises(ValueError, match="must not decrease"):
        s.insert(_batch([1, 0], [0, 0], version=0).replace(versions=np.array([7, 6])))


def test_gather_returns_the_stored_rollouts_across_chunks_and_masks():
    rng = np.random.default_rng(3)
    s = RolloutStore(1000, None, keep=EVERYTHING)
    batches = [random_batch(rng, 3, 2, v, partial_mask=(v % 2 == 1)) for v in range(4)]
    for v, b in enumerate(batches):
        s.insert(b, version=v)
    s.evict(0)
    allb = RolloutBatch.concat(batches)
    idx = rng.integers(0, len(s), 40)
    got, want = s.gather(idx), allb.select(idx)
    for name in ("prompt_ids", "prompt_offsets", "response_ids", "response_offsets", "action_mask",
                 "behaviour_logprobs", "rewards", "advantages", "prompt_uids", "group_ids", "versions"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    with pytest.raises(IndexError):
        s.gather([len(s)])


def test_increment_reuse_counts_repeats_and_refreshes_the_view():
    s = RolloutStore(100, None, keep=EVERYTHING)
    s.insert(_batch([1, 0, 1], [0, 0, 0]), version=0)
    s.insert(_batch([1, 0], [0, 0], seed=1), version=1)
    s.increment_reuse([4, 4, 0, 2])  # the view is not built yet: must count once
    assert s.view().reuse_counts.tolist() == [1, 0, 1, 0, 2]
    before = s.view()
    s.increment_reuse([1])
    assert s.view().reuse_counts.tolist() == [1, 1, 1, 0, 2]
    assert before.reuse_counts.tolist() == [1, 0, 1, 0, 2]  # an old view is a snapshot
    assert s.gather([4]).reuse_counts.tolist() == [2]
    with pytest.raises(ValueError):
        s.view().reuse_counts[0] = 9  # read-only


def test_state_dict_round_trip_keeps_contents_counters_and_serials():
    rng = np.random.default_rng(5)
    s = RolloutStore(30, 3, **ADVANTAGE)
    for v in range(6):
        s.evict(v)
        s.insert(random_batch(rng, 4, 4, v, partial_mask=True), version=v)
    s.increment_reuse([0, 1, 1])
    t = RolloutStore(30, 3, **ADVANTAGE)
    t.load_state_dict(s.state_dict())
    assert t.counters == s.counters and len(t) == len(s)
    for name in ("advantages", "rewards", "versions", "serials", "reuse_counts", "group_ids"):
        assert np.array_equal(getattr(t.view(), name), getattr(s.view(), name))
    idx = np.arange(len(s))
    assert np.array_equal(t.gather(idx).behaviour_logprobs, s.gather(idx).behaviour_logprobs)
    assert np.array_equal(t.gather(idx).action_mask, s.gather(idx).action_mask)
    # Both continue identically; the reloaded store does not share mutable arrays.
    t.increment_reuse([0])
    assert s.view().reuse_counts[0] == 1 and t.view().reuse_counts[0] == 2
    # A smaller store evicts the oldest on load.
    u = RolloutStore(10, 3, **ADVANTAGE)
    u.load_state_dict(s.state_dict())
    assert len(u) == 10 and np.array_equal(u.view().serials, s.view().serials[-10:])


def test_load_state_dict_rejects_inconsistent_states():
    s = RolloutStore(10, None, keep=EVERYTHING)
    s.insert(_batch([1, 0], [0, 0]), version=1)
    state = s.state_dict()
    with pytest.raises(ValueError, match="serials"):
        RolloutStore(10, None, **ADVANTAGE).load_state_dict(state | {"serials": state["serials"][::-1].copy()})
    with pytest.raises(ValueError, match="malformed"):
        RolloutStore(10, None, **ADVANTAGE).load_state_dict({k: v for k, v in state.items() if k != "rollouts"})
    with pytest.raises(ValueError, match="versions"):
        RolloutStore(10, None, **ADVANTAGE).load_state_dict(state | {"last_version": 0})


def test_bytes_per_token_stay_compact():
    rng = np.random.default_rng(6)
    s = RolloutStore(10_000, None, keep=EVERYTHING)
    for v in range(3):
        s.insert(random_batch(rng, 16, 8, v, prompt_len=(64, 64), response_len=(400, 600)), version=v)
    # int32 ids + float32 log-probs, the all-True mask elided, per-rollout metadata amortised.
    assert s.nbytes / s.n_tokens <= 9.0
    assert s.nbytes / (s.n_tokens - s.gather(np.arange(len(s))).prompt_ids.size) <= 9.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(capacity=0, max_age_steps=None, keep=EVERYTHING), "capacity"),
    (dict(capacity=5, max_age_steps=-1, keep=EVERYTHING), "max_age_steps must be None"),
    (dict(capacity=5, max_age_steps=None, keep="some"), "keep must be a KeepRule"),
    (dict(capacity=5, max_age_steps=None, keep=SUCCESSES), r"reads \['success_threshold'\].*pass \['success_thr"),
    (dict(capacity=5, max_age_steps=None, keep=EVERYTHING, min_abs_advantage=0.1), "drop \\['min_abs_advantage'\\]"),
])
def test_constructor_checks(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutStore(**kwargs)


def test_views_are_snapshots_through_growth_eviction_and_reuse():
    rng = np.random.default_rng(7)
    s = RolloutStore(12, None, keep=EVERYTHING)
    s.insert(random_batch(rng, 2, 2, 0), version=0)
    before = s.view()
    want = {k: getattr(before, k).copy() for k in ("serials", "versions", "reuse_counts", "response_lengths")}
    for v in range(1, 8):  # grows the per-rollout table past its room, and evicts by capacity
        s.insert(random_batch(rng, 2, 2, v), version=v)
        s.increment_reuse(np.arange(len(s)))
    for k, a in want.items():
        assert np.array_equal(getattr(before, k), a), k
    assert s.view().serials.tolist() == list(range(20, 32))
    assert s.view().reuse_counts.tolist() == [3] * 4 + [2] * 4 + [1] * 4


def test_a_partly_evicted_first_chunk_is_compacted_only_past_half_and_one_insertion():
    # Internal layout (s._chunks): what is asserted is which bytes are held, not behaviour.
    rng = np.random.default_rng(8)
    s = RolloutStore(10, None, keep=EVERYTHING)
    for v in range(4):  # 8 per insertion, 10 live: from the second on, 6 dead rows in the first chunk
        s.insert(random_batch(rng, 2, 4, v), version=v)
    assert [ch.start for ch in s._chunks] == [6, 0]  # more than half dead, but under one insertion: kept
    # One big chunk (a reload) is compacted once more than half of it, and more than the newest
    # chunk's rows, is dead: each copy at least halves it.
    big = random_batch(rng, 6, 5, 0)
    t = RolloutStore(30, None, keep=EVERYTHING)
    t.load_state_dict(RolloutStore(30, None, keep=EVERYTHING).state_dict() | {
        "rollouts": {f: getattr(big, f) for f in RolloutBatch.__dataclass_fields__},
        "serials": np.arange(30), "priorities": np.ones(30), "next_serial": 30, "last_version": 0})
    first = []
    for v in range(1, 6):
        t.insert(random_batch(rng, 1, 4, v), version=v)
        first.append((len(t._chunks[0]), t._chunks[0].start))
    assert first == [(30, 4), (30, 8), (30, 12), (14, 0), (14, 4)]
    assert np.array_equal(t.view().serials, np.r_[20:50])
    assert np.array_equal(t.gather([0, 9]).response_ids, np.r_[big.response(20), big.response(29)])
