"""Samplers: the pure priority functions, the registry, and draws whose frequencies must match
their priorities (chi-square with fixed seeds, each with a control that the test can fail)."""
import math

import numpy as np
import pytest

from registry_checks import check_sampler
from replay import (MODE_REGISTRY, ReplayConfig, StoreView, advantage_priorities, beta_schedule, effective_sample_size,
                    freshness_priorities, importance_weights, sampler_from_config, weighted_draw)
from replay import samplers
from replay.samplers import replayed_priorities, reward_fresh_priorities, stratified_draw


def chi_square_p(observed, expected):
    """Upper-tail p-value of Pearson's statistic, Wilson-Hilferty approximation (no scipy needed)."""
    observed, expected = np.asarray(observed, float), np.asarray(expected, float)
    assert expected.min() >= 5, "too few expected counts for the approximation"
    stat = float(np.sum((observed - expected) ** 2 / expected))
    df = len(observed) - 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def view_of(advantages, versions=None, rewards=None, prompt_uids=None, group_ids=None, priorities=None,
            newest=None, max_priority=1.0):
    n = len(advantages)
    arr = lambda x, d, default: np.asarray(default if x is None else x, d)  # noqa: E731
    return StoreView(advantages=arr(advantages, np.float32, None), rewards=arr(rewards, np.float32, np.zeros(n)),
                     versions=arr(versions, np.int64, np.zeros(n)),
                     prompt_uids=arr(prompt_uids, np.int64, np.arange(n)),
                     group_ids=arr(group_ids, np.int64, np.arange(n)), reuse_counts=np.zeros(n, np.int32),
                     serials=np.arange(n, dtype=np.int64), response_lengths=np.ones(n, np.int64),
                     priorities=arr(priorities, np.float64, np.ones(n)), newest=arr(newest, np.bool_, np.zeros(n)),
                     max_priority=max_priority)


def test_chi_square_helper_against_known_quantiles():
    # 99.9% quantile of chi-square with 9 df is 27.877: p must be close to 1e-3 there.
    expected = np.full(10, 100.0)
    observed = expected.copy()
    observed[0] += math.sqrt(27.877 * 100 / 2)
    observed[1] -= math.sqrt(27.877 * 100 / 2)
    assert 5e-4 < chi_square_p(observed, expected) < 2e-3
    assert chi_square_p(expected, expected) > 0.99


def test_priority_functions():
    adv = np.array([0.0, -1.0, 2.0], np.float32)
    assert np.allclose(advantage_priorities(adv, 0.5, 1e-6), (np.abs(adv) + 1e-6) ** 0.5)
    # FreshPER: stored at |reward| + eps, updated after a draw to max(|reward|, 1e-6).
    rewards = np.array([0.0, 1.0, -2.0], np.float32)
    assert np.allclose(reward_fresh_priorities(rewards, 1e-3), [1e-3, 1.001, 2.001], rtol=0, atol=1e-12)
    assert np.allclose(replayed_priorities(rewards), [1e-6, 1.0, 2.0], rtol=0, atol=1e-15)
    # The newest insertion at the running maximum, the others decayed by age (floored at 1e-8).
    ages = np.array([1, 10, 1000, 10 ** 6])
    fp = freshness_priorities(np.array([0.5, 1.0, 0.5, 1.0]), ages, np.array([True, False, False, False]),
                              2.0, 0.6, 500.0)
    ref = np.array([2.0, math.exp(-10 / 500), 0.5 * math.exp(-2), 1e-8]) ** 0.6
    assert np.allclose(fp, ref, rtol=1e-12, atol=0)


def test_effective_sample_size():
    assert effective_sample_size(np.ones(50)) == pytest.approx(50)
    assert effective_sample_size(np.r_[1.0, np.zeros(9)]) == pytest.approx(1)
    assert effective_sample_size(np.array([1.0, 1.0, 2.0])) == pytest.approx(16 / 6)
    assert effective_sample_size(np.zeros(3)) == 0.0


def test_beta_schedule_and_importance_weights():
    assert beta_schedule(0, 0.4, 1.0, 1000) == 0.4
    assert beta_schedule(500, 0.4, 1.0, 1000) == pytest.approx(0.7)
    assert beta_schedule(5000, 0.4, 1.0, 1000) == 1.0 and beta_schedule(3, 0.4, 1.0, 0) == 1.0
    p = np.array([1.0, 2.0, 4.0, 0.0])
    n, probs = 3, p[:3] / p.sum()
    w = importance_weights(p, np.array([0, 1, 2]), 0.5)
    ref = (n * probs) ** -0.5
    assert np.allclose(w, ref / ref.max()) and w[0] == 1.0


def test_weighted_draw_with_replacement_matches_priorities():
    rng = np.random.default_rng(0)
    p = np.array([1.0, 2.0, 3.0, 0.0, 4.0, 10.0])
    draws = weighted_draw(p, 60_000, rng, replacement=True)
    assert not np.any(draws == 3)  # zero priority is never drawn
    counts = np.bincount(draws, minlength=6)
    pos = p > 0
    expected = len(draws) * p[pos] / p.sum()
    assert chi_square_p(counts[pos], expected) > 1e-3
    # Control: the same test rejects a uniform draw.
    uniform = np.bincount(rng.choice(np.flatnonzero(pos), 60_000), minlength=6)
    assert chi_square_p(uniform[pos], expected) < 1e-6


def test_weighted_draw_without_replacement_is_successive_sampling():
    rng = np.random.default_rng(1)
    p = np.array([1.0, 2.0, 3.0])
    s = p.sum()
    pairs = np.array([weighted_draw(p, 2, rng, replacement=False) for _ in range(12_000)])
    assert np.all(pairs[:, 0] != pairs[:, 1])
    cells = [(i, j) for i in range(3) for j in range(3) if i != j]
    observed = [np.sum((pairs[:, 0] == i) & (pairs[:, 1] == j)) for i, j in cells]
    expected = [len(pairs) * p[i] / s * p[j] / (s - p[i]) for i, j in cells]
    assert chi_square_p(observed, expected) > 1e-3
    # Control: drawing the pair proportionally with replacement then rejecting repeats is different.
    wrong = [len(pairs) * p[i] * p[j] / (s * s - np.square(p).sum()) for i, j in cells]
    assert chi_square_p(observed, wrong) < 1e-6
    # The returned order is the draw order: the first of k is drawn proportionally to p, for
    # k < n (partial selection) and k = n (a full ordering) alike.
    p8 = np.arange(1.0, 9.0)
    for k in (4, 8):
        first = np.array([weighted_draw(p8, k, rng, replacement=False)[0] for _ in range(8000)])
        assert chi_square_p(np.bincount(first, minlength=8), 8000 * p8 / p8.sum()) > 1e-3
    # k beyond the drawable candidates gives each once.
    assert sorted(weighted_draw(np.array([1.0, 0.0, 2.0]), 5, rng, replacement=False).tolist()) == [0, 2]


@pytest.mark.parametrize("replacement", [True, False])
def test_advantage_sampler_frequencies(replacement):
    rng = np.random.default_rng(2)
    adv = np.array([0.1, -0.5, 1.0, 2.0, -3.0], np.float32)
    view = view_of(adv)
    p = advantage_priorities(adv, 0.5, 1e-6)
    sampler = sampler_from_config(ReplayConfig(mode="advantage", replacement=replacement))
    # k = 1 per draw: without replacement the first draw is exactly proportional to p.
    draws = np.concatenate([sampler(view, 1, 30, rng).indices for _ in range(20_000)])
    counts = np.bincount(draws, minlength=5)
    assert chi_square_p(counts, len(draws) * p / p.sum()) > 1e-3
    d = sampler(view, 5, 30, rng)
    assert d.info["ess"] == pytest.approx(effective_sample_size(p)) and np.all(d.weights == 1)
    if not replacement:
        assert sorted(d.indices.tolist()) == [0, 1, 2, 3, 4]


def test_stratified_draw_is_proportional_and_spreads_evenly():
    p = np.array([0.5, 3.0, 0.0001, 1.5, 5.0])
    rng = np.random.default_rng(11)
    # One point per draw: exactly the proportional distribution.
    singles = np.concatenate([stratified_draw(p, 1, rng) for _ in range(20_000)])
    counts = np.bincount(singles, minlength=len(p))
    assert chi_square_p(counts[[0, 1, 3, 4]], 20_000 * p[[0, 1, 3, 4]] / p.sum()) > 1e-3
    assert chi_square_p(counts[[1, 0, 3, 4]], 20_000 * p[[0, 1, 3, 4]] / p.sum()) < 1e-6  # control: can fail
    # k points, one per segment: each index within 2 of its expected count k p_i / sum(p).
    for k in (1, 7, 100, 1001):
        many = np.bincount(stratified_draw(p, k, rng), minlength=len(p))
        assert many.sum() == k and np.all(np.abs(many - k * p / p.sum()) < 2), (k, many)
    assert len(stratified_draw(p, 0, rng)) == 0 and len(stratified_draw(np.zeros(0), 3, rng)) == 0


def test_freshness_sampler_frequencies_and_weights():
    rng = np.random.default_rng(3)
    versions = np.array([0, 50, 100, 100, 119])
    stored = np.array([1.0, 1.0, 1.0, 0.2, 1e-6])
    newest = versions == 119
    view = view_of(np.zeros(5, np.float32), versions=versions, priorities=stored, newest=newest, max_priority=1.5)
    sampler = sampler_from_config(ReplayConfig(mode="freshness", tau=50.0, beta_end=1.0, beta_steps=1000))
    d = sampler(view, 40_000, 120, rng)
    p = np.where(newest, 1.5, stored * np.exp(-(120 - versions) / 50.0)) ** 0.6
    counts = np.bincount(d.indices, minlength=5)
    assert np.all(np.abs(counts - 40_000 * p / p.sum()) < 2)  # stratified: as even as whole draws allow
    beta = beta_schedule(120, 0.4, 1.0, 1000)
    ref = (p / p.min()) ** -beta
    assert np.allclose(d.weights, ref[d.indices], rtol=1e-5)
    assert d.info["is_beta"] == pytest.approx(beta) and d.info["is_weight_max"] <= 1.0
    assert d.info["at_max_priority"] == 1


def test_uniform_sampler():
    rng = np.random.default_rng(4)
    view = view_of(np.ones(8, np.float32))
    no_rep = samplers.uniform(view, 20, 0, rng, replacement=False)
    assert sorted(no_rep.indices.tolist()) == list(range(8))
    rep = samplers.uniform(view, 16_000, 0, rng, replacement=True)
    assert len(rep.indices) == 16_000
    assert chi_square_p(np.bincount(rep.indices, minlength=8), np.full(8, 2000.0)) > 1e-3


def test_success_sampler_spreads_the_draw_evenly_over_the_fresh_prompts():
    rng = np.random.default_rng(5)
    uids = np.array([1, 1, 1, 1, 2, 2, 3, 3, 3, 4, 4, 4])
    rewards = np.array([1, 1, 1, 0, 1, 0, 1, 1, 0.5, 1, 1, 1])
    view = view_of(np.zeros(12, np.float32), rewards=rewards, prompt_uids=uids)
    sampler = sampler_from_config(ReplayConfig(mode="success"))
    fresh = np.array([1, 2, 4])  # prompt 3 is not in this step
    seen = np.zeros(12, int)
    for _ in range(3000):
        got = sampler(view, 5, 10, rng, fresh_prompt_uids=fresh).indices
        assert len(set(got.tolist())) == len(got) == 5
        assert np.all(rewards[got] > 0.5) and set(uids[got].tolist()) <= {1, 2, 4}
        # One of each prompt, then a second of each: prompt 2 has only one success.
        assert [np.sum(uids[got] == u) for u in (1, 2, 4)] == [2, 1, 2]
        # The draw's head is the evenest: its first three rows are one per prompt.
        assert sorted(uids[got[:3]].tolist()) == [1, 2, 4]
        seen[got] += 1
    # Within a prompt uniformly: each of prompt 1's three successes is in 2/3 of the draws.
    assert chi_square_p(seen[:3], np.full(3, 2000.0)) > 1e-3
    # A partial round picks its prompts at random: k = 4 gives prompt 1 or 4 its second one.
    counts = np.zeros(2, int)
    for _ in range(2000):
        got = sampler(view, 4, 10, rng, fresh_prompt_uids=fresh).indices
        counts += [np.sum(uids[got] == 1) == 2, np.sum(uids[got] == 4) == 2]
    assert counts.sum() == 2000 and chi_square_p(counts, np.full(2, 1000.0)) > 1e-3
    # Never more than there are; no fresh prompts given: uniform over all successes.
    assert len(sampler(view, 100, 10, rng, fresh_prompt_uids=fresh).indices) == 5  # min(M = 2, successes) each
    assert set(sampler(view, 100, 10, rng).indices.tolist()) == {0, 1, 2, 4, 6, 7, 9, 10, 11}


def test_group_sampler_draws_whole_groups_with_replacement():
    rng = np.random.default_rng(6)
    # Group id 0 occurs at two versions: two different groups.
    versions = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2])
    groups = np.array([0, 0, 0, 0, 0, 5, 5, 3, 3])
    view = view_of(np.ones(9, np.float32), versions=versions, group_ids=groups)
    keys = {(0, 0): {0, 1, 2}, (1, 0): {3, 4}, (1, 5): {5, 6}, (2, 3): {7, 8}}
    freq = dict.fromkeys(keys, 0)
    for _ in range(2000):
        d = samplers.group(view, 6, 5, rng)
        assert d.info["groups_drawn"] == 3  # round(6 / mean group size 9/4)
        # Split the draw into runs of one group: each run is exactly one whole group.
        idx = d.indices.tolist()
        while idx:
            key = (versions[idx[0]], groups[idx[0]])
            size = len(keys[key])
            assert set(idx[:size]) == keys[key]
            freq[key] += 1
            idx = idx[size:]
        assert d.info["candidates"] == 4
    assert sum(freq.values()) == 6000
    assert chi_square_p(list(freq.values()), np.full(4, 1500.0)) > 1e-3
    # Full groups of G: exactly k / G groups, so exactly k rollouts.
    full = view_of(np.ones(12, np.float32), group_ids=np.repeat(np.arange(3), 4))
    assert len(samplers.group(full, 8, 5, rng).indices) == 8
    # k smaller than the first drawn group: still one whole group.
    assert len(samplers.group(view_of(np.ones(3, np.float32), group_ids=[0, 0, 0]), 1, 5, rng).indices) == 3


def test_every_registered_sampler_has_the_one_signature():
    """Wherever a mode's sampler is defined (here, or in the mode's own module as exgrpo's), its
    entry holds it: nothing lists samplers by name, so a new one joins no table."""
    for entry in MODE_REGISTRY.values():
        check_sampler(entry)


def test_randomness_is_injected_not_global():
    view = view_of(np.linspace(0.1, 2, 50).astype(np.float32), versions=np.arange(50))
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    for mode in ("uniform", "advantage", "freshness", "naive"):
        sampler = sampler_from_config(ReplayConfig(mode=mode, beta_steps=100))
        a = sampler(view, 10, 60, np.random.default_rng(7)).indices
        b = sampler(view, 10, 60, np.random.default_rng(7)).indices
        assert np.array_equal(a, b), mode
    assert np.array_equal(np.random.get_state()[1], before)
