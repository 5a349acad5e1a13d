"""FreshPER (`freshness` mode) against its reference code, through the public `ReplayBuffer`.

`ReferencePER` below re-implements, independently of `replay/`, what FreshPER's reference buffer
does with a critic-free method (Vision-CAIR/Freshness-Aware-PER, roll/agentic/replay_buffer/
trajectory_buffer.py with priority_functions.py:reward_fresh_priority, age decay on, FIFO
eviction): every trajectory stored at priority |reward| + eps, entering its segment tree at the
running maximum priority ** alpha; before each draw every entry's leaf refreshed to
max(priority * exp(-age / age_decay), 1e-8) ** alpha (`refresh_all_age_decay`); after a draw the
drawn entries' priority set to max(|reward|, 1e-6) and the running maximum raised
(`update_priorities` with the `reward` update metric).

Timeline: the reference stores a step's rollouts and then draws in the same step; the buffer
draws in the next step, before storing that step's own. So here the reference stores step t - 1's
rollouts just before the draw of step t, after the refresh, and ages are counted at step t.
"""
import math

import numpy as np
import pytest

from replay import ReplayBuffer, ReplayCheckpointError, ReplayConfig, RolloutBatch, load_state, save_state
from replay.composer import group_normalise

ALPHA, TAU, EPS = 0.6, 3.0, 1e-6  # a short decay time, so that age matters within 20 steps


class ReferencePER:
    """The reference buffer's rule, one entry per stored trajectory, oldest first."""

    def __init__(self, capacity, alpha, age_decay, eps, enter_at_max=True):
        self.capacity, self.alpha, self.age_decay, self.eps = capacity, alpha, age_decay, eps
        self.enter_at_max = enter_at_max  # False: a control that breaks the insertion rule
        self.entries = []  # dicts: serial, stored_at, reward, priority, leaf
        self.max_priority = 1.0

    def push(self, serial, reward, step):
        if len(self.entries) >= self.capacity:
            self.entries.pop(0)  # FIFO: the oldest slot is reused
        priority = abs(reward) + self.eps  # reward_fresh at age 0
        leaf = (self.max_priority if self.enter_at_max else priority) ** self.alpha
        self.entries.append(dict(serial=serial, stored_at=step, reward=reward, priority=priority, leaf=leaf))

    def refresh(self, step):
        for e in self.entries:
            decayed = e["priority"] * math.exp(-(step - e["stored_at"]) / self.age_decay)
            e["leaf"] = max(decayed, 1e-8) ** self.alpha

    def probabilities(self):
        leaves = np.array([e["leaf"] for e in self.entries])
        return {e["serial"]: p for e, p in zip(self.entries, leaves / leaves.sum())}

    def update(self, serials, step):
        by_serial = {e["serial"]: e for e in self.entries}
        for s in serials:
            e = by_serial[s]
            e["priority"] = max(abs(e["reward"]), 1e-6)
            e["leaf"] = (e["priority"] * math.exp(-(step - e["stored_at"]) / self.age_decay)) ** self.alpha
            self.max_priority = max(self.max_priority, e["priority"])


def fresh_batch(rewards, step):
    """Groups of 4 with the given rewards (flat), group-normalised advantages."""
    rewards = np.asarray(rewards, np.float32)
    n = len(rewards)
    group = np.arange(n) // 4
    return RolloutBatch.from_lists([[1, 2]] * n, [[3, 4]] * n, [[True, True]] * n, [[-0.5, -0.5]] * n,
                                   rewards.tolist(), group_normalise(rewards, group).tolist(),
                                   (group + 10 * step).tolist(), (group + 10 * step).tolist(), step)


def scenario(steps=20, seed=0):
    """Rewards per step: 8 or 12 rollouts, mostly 0 / 1, a few 2.5 (they raise the running maximum
    once drawn)."""
    rng = np.random.default_rng(seed)
    return [rng.choice([0.0, 1.0, 2.5], size=4 * int(rng.integers(2, 4)), p=[0.5, 0.4, 0.1]) for _ in range(steps)]


def coupled_counts(trials, *, controls=()):
    """Observed draws of the buffer per (step, serial), beside the reference's expected draws given
    the same history (the reference updates with the rollouts the buffer drew), summed over trials."""
    rewards = scenario()
    config = ReplayConfig(mode="freshness", warmup=2, ratio=0.5, capacity=40, tau=TAU, eps=EPS, beta_steps=20)
    observed, expected = {}, {name: {} for name in ("reference",) + tuple(controls)}
    for trial in range(trials):
        buf = ReplayBuffer(ReplayConfig(**(config.to_dict() | {"seed": trial})))
        refs = {"reference": ReferencePER(40, ALPHA, TAU, EPS)} | {name: make() for name, make in controls.items()}
        serial, pending = 0, []
        for step, r in enumerate(rewards):
            for ref in refs.values():
                ref.refresh(step)
                for s, reward in pending:
                    ref.push(s, reward, step - 1)
            probabilities = {name: ref.probabilities() if ref.entries else {} for name, ref in refs.items()}
            held = buf.store.view()  # the draw indexes the rollouts held before this step's insertion
            assert held.serials.tolist() == [e["serial"] for e in refs["reference"].entries]
            comp = buf.step(fresh_batch(r, step), step)
            drawn = held.serials[comp.indices].tolist()
            for s in drawn:
                observed[step, s] = observed.get((step, s), 0) + 1
            for name, probs in probabilities.items():
                for s, p in probs.items():
                    expected[name][step, s] = expected[name].get((step, s), 0.0) + len(drawn) * p
            for ref in refs.values():
                ref.update(drawn, step)
            pending = list(zip(range(serial, serial + len(r)), r.tolist()))
            serial += len(r)
    return observed, expected


def pooled_chi_square(observed, expected, min_expected=5.0):
    """Pearson's statistic and its upper-tail p-value (Wilson-Hilferty) over cells (step, serial).

    Per step, the cells of least expectation are pooled until each pooled cell expects >= 5 draws;
    each step's total is fixed, so it has (cells - 1) degrees of freedom. The p-value assumes
    independent draws; the buffer's stratified draws vary less, so it errs on the side of passing.
    """
    stat, df = 0.0, 0
    for step in sorted({t for t, _ in expected}):
        cells = sorted((e, observed.get((t, s), 0)) for (t, s), e in expected.items() if t == step)
        merged, acc_e, acc_o = [], 0.0, 0
        for e, o in cells:
            acc_e, acc_o = acc_e + e, acc_o + o
            if acc_e >= min_expected:
                merged.append((acc_e, acc_o))
                acc_e, acc_o = 0.0, 0
        if merged and acc_e:
            last_e, last_o = merged.pop()
            merged.append((last_e + acc_e, last_o + acc_o))
        stat += sum((o - e) ** 2 / e for e, o in merged)
        df += len(merged) - 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return stat, df, 0.5 * math.erfc(z / math.sqrt(2))


def test_draw_frequencies_follow_the_reference_rule_over_20_steps():
    controls = {"no insertion at max": lambda: ReferencePER(40, ALPHA, TAU, EPS, enter_at_max=False),
                "exponent 1": lambda: ReferencePER(40, 1.0, TAU, EPS),
                "no age decay": lambda: ReferencePER(40, ALPHA, 1e12, EPS)}
    observed, expected = coupled_counts(80, controls=controls)
    assert sum(observed.values()) == pytest.approx(sum(expected["reference"].values()))
    stat, df, p = pooled_chi_square(observed, expected["reference"])
    assert df > 100 and p > 1e-3, (stat, df, p)
    # Controls: each rule changed in one respect is rejected by the same statistic.
    for name in controls:
        c_stat, c_df, c_p = pooled_chi_square(observed, expected[name])
        assert c_p < 1e-6, (name, c_stat, c_df, c_p)


def issue_example_counts(seed, draw_step=2):
    """Step 0 stores a lone success ([1,0,0,0], A = 1.5), a success among three ([1,1,1,0],
    A = 0.5), an all-correct group ([1,1,1,1], A = 0) and 148 failed groups (so that 600 can be
    drawn); step 1 a failed group; step 2 draws 600 (stratified). Returns the draws of the first
    12 rollouts of step 0, by their place, and the expected draws of one step-0 success."""
    buf = ReplayBuffer(ReplayConfig(mode="freshness", warmup=draw_step, ratio=600 / 16, seed=seed, beta_steps=10))
    buf.step(fresh_batch([1, 0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1] + [0] * 592, 0), 0)
    for step in range(1, draw_step):
        buf.step(fresh_batch([0, 0, 0, 0], step), step)
    view = buf.store.view()  # as the draw sees it
    comp = buf.step(fresh_batch([0] * 16, draw_step), draw_step)
    assert len(comp.indices) == 600
    serials = view.serials[comp.indices]
    counts = np.bincount(serials[serials < 12], minlength=12)
    p = np.where(view.newest, 1.0, np.maximum(view.priorities * np.exp(-(draw_step - view.versions) / 500.0), 1e-8))
    p = p ** 0.6
    return counts, 600 * p[0] / p.sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equal_age_and_reward_are_drawn_equally_whatever_the_advantage(seed):
    counts, each = issue_example_counts(seed)
    successes = counts[[0, 4, 5, 6, 8, 9, 10, 11]]  # A = 1.5, three of 0.5, four of 0
    failures = counts[[1, 2, 3, 7]]
    # Stratified draws: every index within 2 of its expectation, so equal ones within 4 of each other.
    assert np.all(np.abs(successes - each) < 2) and successes.max() - successes.min() < 4, successes
    assert failures.sum() <= 1  # priority (1e-6) ** 0.6 against 1 for a success
    # Control: the former rule's 1.93x for the lone success would lie far outside this bound.
    assert each * 3 ** 0.6 - each > 8


def three_steps_and_a_former_checkpoint(config: ReplayConfig, rewards: list[int], path) -> ReplayBuffer:
    """A buffer after three steps of `rewards`, its state also saved at `path` as the former code
    wrote it: format 1, no recorded rules, no priorities."""
    buf = ReplayBuffer(config)
    for step in range(3):
        buf.step(fresh_batch(rewards, step), step)
    state = buf.state_dict()
    former = state | {"format_version": 1, "store": {k: v for k, v in state["store"].items()
                                                     if k not in ("priorities", "max_priority", "newest_serial")}}
    former.pop("holding_rules")
    save_state(path, former)
    return buf


def test_a_checkpoint_of_the_former_freshness_rule_is_refused_with_the_fix(tmp_path):
    config = ReplayConfig(mode="freshness", warmup=1, seed=4, beta_steps=10)
    path = tmp_path / "former.npz"
    buf = three_steps_and_a_former_checkpoint(config, [1, 0, 0, 0, 1, 1, 1, 1], path)
    state = buf.state_dict()
    with pytest.raises(ReplayCheckpointError) as err:
        ReplayBuffer.load(path, config)
    message = str(err.value)
    assert "keep rule nonzero_advantage" in message and "keep rule all" in message
    assert "(|A| + eps) ** alpha" in message and "reward_fresh" in message
    assert "--replay.allow_empty_resume" in message and "code that wrote it" in message
    # A checkpoint recording another priority rule is refused alike; one of this code loads and
    # continues exactly (priorities and the running maximum included).
    other = state | {"holding_rules": state["holding_rules"] | {"priority rule": "something else"}}
    with pytest.raises(ValueError, match="priority rule something else"):
        ReplayBuffer(config).load_state_dict(other)
    buf.save(tmp_path / "now.npz")
    again = ReplayBuffer.load(tmp_path / "now.npz", config)
    assert np.array_equal(again.store.view().priorities, buf.store.view().priorities)
    assert again.store.view().max_priority == buf.store.view().max_priority
    assert np.array_equal(again.store.view().newest, buf.store.view().newest)
    a, b = again.step(fresh_batch([0, 1, 0, 0], 3), 3), buf.step(fresh_batch([0, 1, 0, 0], 3), 3)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.weights, b.weights)


def test_a_former_checkpoint_of_an_unchanged_mode_still_loads(tmp_path):
    config = ReplayConfig(mode="advantage", warmup=1, seed=4)
    buf = three_steps_and_a_former_checkpoint(config, [1, 0, 0, 0, 1, 1, 1, 0], tmp_path / "former.npz")
    again = ReplayBuffer.load(tmp_path / "former.npz", config)
    assert np.array_equal(again.store.view().serials, buf.store.view().serials)
    assert load_state(tmp_path / "former.npz")["format_version"] == 1
