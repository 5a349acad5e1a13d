"""ExGRPO's bucketing, retirement and trajectory choice (`replay/exgrpo.py`) against hand-computed
cases of its reference's formulas (ElliottYan/LUFFY, ExGRPO/exgrpo/verl/verl/mix_src/experience/:
`weighted_bucket_sampler.py:WeightedBucketSampler` with `normal` weighting, `experience_helpers.py:
select_best_experiences`, `experience_trainer_ops.py:collect_experience_entries`).

Bucket weights for K = 8 (N(k; 4, 1)): w4 = 1 / sqrt(2 pi) = 0.398942, w3 = w5 = w4 e^-0.5 =
0.241971, w1 = w7 = w4 e^-4.5 = 0.004432. Empirical frequencies are checked within 5 binomial
standard deviations of the hand-computed probability.
"""
import math

import numpy as np
import pytest

from replay.exgrpo import (bucket_draw, bucket_weights, exgrpo, keep_successes, mixed_group_advantage, questions,
                           trajectory_scores)
from replay.exgrpo_keep import EXGRPO_KEEP
from replay.record import RolloutBatch, refusals
from replay.store import RolloutStore, StoreView

K = 8
W4, W3, W1 = 1 / math.sqrt(2 * math.pi), math.exp(-0.5) / math.sqrt(2 * math.pi), math.exp(-4.5) / math.sqrt(2 * math.pi)
KNOBS = dict(group_size=K, threshold=0.5, min_abs_advantage=1e-6)


def view_of(rows):
    """A StoreView of successes given as (prompt uid, version, group id, advantage, priority)."""
    uid, ver, gid, adv, prio = (np.array(c) for c in zip(*rows))
    n = len(uid)
    order = np.argsort(ver, kind="stable")  # the store is version-ordered
    return StoreView(advantages=adv[order].astype(np.float32), rewards=np.ones(n, np.float32),
                     versions=ver[order].astype(np.int64), prompt_uids=uid[order].astype(np.int64),
                     group_ids=gid[order].astype(np.int64), reuse_counts=np.zeros(n, np.int32),
                     serials=np.arange(n, dtype=np.int64), response_lengths=np.ones(n, np.int64),
                     priorities=prio[order].astype(np.float64), newest=np.zeros(n, bool))


def question_rows(uid, k, version=0, gid=None, prio=1.0):
    """The k stored successes of one question's group (A > 0)."""
    return [(uid, version, uid if gid is None else gid, 0.5, prio)] * k


def frequency(view, uid, n, trials=20_000, seed=0):
    rng = np.random.default_rng(seed)
    hits = sum(uid in view.prompt_uids[exgrpo(view, n, 0, rng, **KNOBS).indices] for _ in range(trials))
    return hits / trials


def close(freq, p, trials=20_000):
    return abs(freq - p) < 5 * math.sqrt(p * (1 - p) / trials)


def test_bucket_weights_are_the_reference_gaussian_over_the_success_count():
    np.testing.assert_allclose(bucket_weights(np.array([4, 3, 5, 1, 7]), K), [W4, W3, W3, W1, W1], rtol=1e-12)
    assert W4 == pytest.approx(0.398942, abs=1e-6) and W3 == pytest.approx(0.241971, abs=1e-6)


def test_a_bucket_is_drawn_by_its_weight_whatever_its_size():
    # Bucket 4 holds 1 question, bucket 3 holds 10: P(bucket 4) = w4 / (w4 + w3) = 0.622459 for one
    # draw. A per-question weighting would give w4 / (w4 + 10 w3) = 0.1416.
    rows = question_rows(100, 4) + sum((question_rows(u, 3) for u in range(10)), [])
    p = W4 / (W4 + W3)
    assert p == pytest.approx(0.622459, abs=1e-6)
    assert close(frequency(view_of(rows), 100, n=1), p)


def test_an_overfull_bucket_passes_its_excess_to_a_bucket_with_room():
    # Bucket 4 holds A alone, bucket 3 holds B1, B2; n = 2. A multinomial (2, 0) gives A and hands
    # the excess to bucket 3, so A is missed only by (0, 2): P(A) = 1 - p3^2 = 0.857463. (Weighted
    # successive sampling of questions would give 0.7931.)
    rows = question_rows(1, 4) + question_rows(2, 3) + question_rows(3, 3)
    p3 = W3 / (W4 + W3)
    assert 1 - p3 ** 2 == pytest.approx(0.857463, abs=1e-6)
    assert close(frequency(view_of(rows), 1, n=2), 1 - p3 ** 2)


def test_questions_are_distinct_and_at_most_the_replayable_ones():
    rows = sum((question_rows(u, 1 + u % 7) for u in range(6)), [])
    view = view_of(rows)
    rng = np.random.default_rng(1)
    for n in (1, 3, 6, 50):
        d = exgrpo(view, n, 0, rng, **KNOBS)
        assert len(d.indices) == min(n, 6) and len(np.unique(view.prompt_uids[d.indices])) == len(d.indices)
        np.testing.assert_array_equal(d.weights, 1.0)
    assert len(exgrpo(view, 0, 0, rng, **KNOBS).indices) == 0


def test_the_bucket_is_the_latest_group_count_and_a_failed_group_leaves_it():
    # Question 1: k = 2 at version 1, k = 5 at version 3, k = 0 at version 4 (nothing stored) ->
    # bucket 5. Question 2: k = 3 at version 2 -> bucket 3.
    rows = question_rows(1, 2, version=1) + question_rows(1, 5, version=3) + question_rows(2, 3, version=2)
    uids, k, _, retired = questions(view_of(rows), threshold=0.5, min_abs_advantage=1e-6)
    assert dict(zip(uids.tolist(), k.tolist())) == {1: 5, 2: 3} and retired == 0


def test_two_groups_of_one_prompt_in_one_step_count_as_the_later_group():
    rows = question_rows(1, 2, version=3, gid=10) + question_rows(1, 6, version=3, gid=11)
    _, k, _, _ = questions(view_of(rows), threshold=0.5, min_abs_advantage=1e-6)
    assert k.tolist() == [6]


def test_a_solved_question_is_retired_for_good():
    # Question 1 had k = 4 at version 1, then all 8 correct at version 2 (one marker, A = 0);
    # question 2 stays. Question 1 is never drawn, even after a later partial group.
    rows = (question_rows(1, 4, version=1) + [(1, 2, 1, 0.0, 1.0)] + question_rows(1, 3, version=5)
            + question_rows(2, 3, version=1))
    view = view_of(rows)
    uids, _, _, retired = questions(view, threshold=0.5, min_abs_advantage=1e-6)
    assert uids.tolist() == [2] and retired == 1
    rng = np.random.default_rng(0)
    for _ in range(50):
        assert set(view.prompt_uids[exgrpo(view, 4, 0, rng, **KNOBS).indices]) == {2}


def test_the_replayed_trajectory_is_the_highest_scoring_earliest_among_equals():
    rows = [(7, 1, 7, 0.5, 0.20), (7, 1, 7, 0.5, 0.60), (7, 2, 7, 0.5, 0.60), (7, 2, 7, 0.5, 0.10)]
    view = view_of(rows)
    d = exgrpo(view, 1, 0, np.random.default_rng(0), **KNOBS)
    assert d.indices.tolist() == [1]  # 0.60 first stored (serial 1), not serial 2


def test_trajectory_scores_are_one_over_perplexity_of_the_action_tokens():
    batch = RolloutBatch.from_lists(
        prompts=[[1], [1], [1]], responses=[[5, 6], [5, 6], [5]], action_masks=[[1, 1], [1, 0], [0]],
        logprobs=[[-1.0, -3.0], [-1.0, -3.0], [-0.5]], rewards=[1, 1, 1], advantages=[0.5, 0.5, 0.5],
        prompt_uids=[1, 1, 1], group_ids=[0, 0, 0], version=0)
    s = trajectory_scores(batch)
    np.testing.assert_allclose(s[:2], [math.exp(-2.0), math.exp(-1.0)], rtol=1e-6)
    assert s[2] == np.finfo(np.float64).tiny


def _batch(rewards, group_ids, advantages):
    n = len(rewards)
    return RolloutBatch.from_lists(
        prompts=[[g] for g in group_ids], responses=[[1]] * n, action_masks=[[1]] * n, logprobs=[[-1.0]] * n,
        rewards=rewards, advantages=advantages, prompt_uids=group_ids, group_ids=group_ids, version=0)


def test_keep_rule_stores_successes_of_mixed_groups_and_one_marker_per_solved_group():
    rewards = [1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, float("nan"), 1]
    groups = [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    adv = [1, -1, 1, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    batch = _batch(rewards, groups, adv)
    ok, _ = refusals(batch)
    keep = keep_successes(batch, ok, threshold=0.5, min_abs_advantage=1e-6)
    # group 0 mixed: its successes; group 1 solved: first row; group 2 failed: none; group 3: its
    # valid rollouts all succeeded (the NaN reward is refused): first row, a marker.
    assert np.flatnonzero(keep).tolist() == [0, 2, 4, 12]


def test_mixed_group_advantage_by_hand():
    # K = 8, k = 4: the group mean is (1 + 7 * 0.5) / 8 = 0.5625, so A = 0.4375.
    np.testing.assert_allclose(mixed_group_advantage([4, 1, 7], 8), [0.4375, 1 - (1 + 7 / 8) / 8, 1 - (1 + 49 / 8) / 8])


def test_bad_group_size_names_the_knob():
    with pytest.raises(ValueError, match="group_size"):
        exgrpo(view_of(question_rows(1, 3)), 1, 0, np.random.default_rng(0), group_size=1, threshold=0.5,
               min_abs_advantage=1e-6)


def test_bucket_draw_is_seeded_by_the_rng_alone():
    k = np.array([1, 2, 3, 4, 4, 5, 6, 7])
    a = bucket_draw(k, 5, K, np.random.default_rng(3))
    np.testing.assert_array_equal(a, bucket_draw(k, 5, K, np.random.default_rng(3)))
    assert len(np.unique(a)) == 5


def test_through_a_real_store_steps_of_groups():
    from replay.composer import group_normalise
    store = RolloutStore(capacity=1000, max_age_steps=None, keep=EXGRPO_KEEP, success_threshold=0.5,
                         min_abs_advantage=1e-6)
    rng = np.random.default_rng(0)
    # 3 questions over 3 steps; question 0 is solved at step 2.
    outcomes = {0: [[1, 0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0], [1] * 8],
                1: [[1, 1, 0, 0, 0, 0, 0, 0], [0] * 8, [1, 1, 1, 0, 0, 0, 0, 0]],
                2: [[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0], [0] * 8]}
    for step in range(3):
        rewards = np.array([r for q in range(3) for r in outcomes[q][step]], np.float32)
        groups = np.repeat(np.arange(3), K)
        lp = [[-float(rng.uniform(0.1, 2.0))] * 3 for _ in range(3 * K)]
        batch = RolloutBatch.from_lists(
            prompts=[[q] for q in groups], responses=[[1, 2, 3]] * (3 * K), action_masks=[[1, 1, 1]] * (3 * K),
            logprobs=lp, rewards=rewards, advantages=group_normalise(rewards, groups), prompt_uids=groups,
            group_ids=groups, version=step)
        store.insert(batch, priorities=trajectory_scores(batch))
    view = store.view()
    uids, k, best, retired = questions(view, threshold=0.5, min_abs_advantage=1e-6)
    # question 0 retired; question 1's latest group is step 2 (k = 3); question 2's step 1 (k = 6).
    assert dict(zip(uids.tolist(), k.tolist())) == {1: 3, 2: 6} and retired == 1
    for q, b in zip(uids, best):
        mine = np.flatnonzero((view.prompt_uids == q) & (np.abs(view.advantages) > 1e-6))
        assert view.priorities[b] == view.priorities[mine].max()
    d = exgrpo(view, 4, 3, rng, **KNOBS)
    assert sorted(view.prompt_uids[d.indices].tolist()) == [1, 2]
    assert np.all(store.gather(d.indices).rewards == 1)
