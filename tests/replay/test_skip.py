"""Pre-rollout skipping's rule (replay/skip.py, GRESO's `all_probabilistic` strategy): each prompt's
run of zero-variance groups, the keep probability max(p ** run, 0.01), the adaptation of p toward
the target share, exploration, the state's round trip through a checkpoint file, seeded draws."""
import numpy as np
import pytest

from replay import ReplayConfig, load_state, save_state
from replay.skip import EASY, HARD, KEEP_FLOOR, MIXED, SkipRule, group_kind

ALL_RIGHT, ALL_WRONG, MIXED_GROUP = [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 1]


def _rule(n_prompts=10, seed=0, batch_size=1, **knobs):
    config = ReplayConfig(skip=True, seed=seed, **knobs)
    return SkipRule.from_config(config, n_prompts, batch_size)


def test_a_group_is_easy_hard_or_mixed_by_its_rewards():
    assert group_kind(ALL_RIGHT, 0.5) == EASY and group_kind(ALL_WRONG, 0.5) == HARD
    assert group_kind(MIXED_GROUP, 0.5) == MIXED and group_kind([0.3, 0.3], 0.5) == HARD
    with pytest.raises(ValueError, match="finite rewards"):
        group_kind([1.0, float("nan")], 0.5)


def test_the_history_is_the_run_of_the_latest_kind_and_a_mixed_group_ends_it():
    rule = _rule()
    for rewards in (ALL_RIGHT, ALL_RIGHT, ALL_RIGHT):
        rule.observe(7, rewards)
    assert rule.runs[7] == (EASY, 3)
    rule.observe(7, ALL_WRONG)  # another kind starts a new run
    assert rule.runs[7] == (HARD, 1)
    rule.observe(7, MIXED_GROUP)
    assert rule.runs[7] == (MIXED, 0) and rule.keep_probability(7) == 1.0


def test_the_keep_probability_halves_with_each_zero_variance_group_down_to_the_floor():
    rule = _rule()
    assert rule.keep_probability(1) == 1.0  # never generated: always kept
    for run in range(1, 9):
        rule.observe(1, ALL_WRONG)
        assert rule.keep_probability(1) == pytest.approx(max(0.5 ** run, KEEP_FLOOR))
    assert rule.keep_probability(1) == KEEP_FLOOR  # 0.5 ** 8 < 0.01: it still returns, 1 % of the time


def test_skips_follow_the_keep_probability_and_a_skipped_prompt_returns():
    rule = _rule(n_prompts=1)
    rule.observe(1, ALL_RIGHT)
    rule.observe(1, ALL_RIGHT)  # keep with 0.25
    draws = np.array([rule.skip(1) for _ in range(20000)])
    assert draws.mean() == pytest.approx(0.75, abs=0.02)
    assert not draws.all()  # explored now and then
    assert not any(rule.skip(2) for _ in range(100))  # no history: never skipped


def test_draws_are_seeded_and_use_no_global_state():
    def decisions(seed):
        rule = _rule(seed=seed)
        for uid in range(10):
            rule.observe(uid, ALL_WRONG)
        np.random.seed(123)  # the global generator plays no part
        return [rule.skip(uid % 10) for uid in range(200)]

    assert decisions(4) == decisions(4)
    assert decisions(4) != decisions(5)


def _call(rule, easy, hard, mixed):
    for uid, rewards in enumerate([ALL_RIGHT] * easy + [ALL_WRONG] * hard + [MIXED_GROUP] * mixed):
        rule.skip(uid)
        rule.observe(uid, rewards)
    return rule.end_call()


def test_p_adapts_toward_the_target_only_after_the_first_pass():
    rule = _rule(n_prompts=10, skip_target=0.3)  # targets: easy 0.1, hard 0.2
    first = _call(rule, easy=5, hard=5, mixed=0)  # 10 prompts: the first pass, no history yet
    assert (first["replay/skip_explore_easy"], first["replay/skip_explore_hard"]) == (0.5, 0.5)
    second = _call(rule, easy=1, hard=0, mixed=9)  # easy share 0.1 >= 0.1: skip more; hard 0 < 0.2: skip less
    assert second["replay/skip_explore_easy"] == pytest.approx(0.49)
    assert second["replay/skip_explore_hard"] == pytest.approx(0.51)
    assert second["replay/skip_zero_variance_share"] == pytest.approx(0.1)
    assert second["replay/skip_loader_passes"] == pytest.approx(2.0)


def test_p_stays_within_its_bounds():
    rule = _rule(n_prompts=1, skip_explore=0.1, skip_explore_min=0.05, skip_explore_max=0.12,
                 skip_explore_step=0.04)
    for _ in range(3):
        figures = _call(rule, easy=0, hard=4, mixed=0)  # hard above target, easy below
    assert figures["replay/skip_explore_hard"] == pytest.approx(0.05)
    assert figures["replay/skip_explore_easy"] == pytest.approx(0.12)


def test_a_call_counts_its_skipped_and_drawn_prompts():
    rule = _rule(n_prompts=100)
    for uid in range(4):
        for _ in range(8):
            rule.observe(uid, ALL_RIGHT)  # keep probability 0.01
    rule.end_call()
    skipped = sum(rule.skip(uid % 4) for uid in range(40))
    figures = rule.end_call()
    assert figures["replay/skip_skipped_prompts"] == skipped > 30 and figures["replay/skip_drawn_prompts"] == 40
    assert figures["replay/skip_rate"] == pytest.approx(skipped / 40)
    assert rule.end_call()["replay/skip_drawn_prompts"] == 0  # a new tally per call


def test_the_state_survives_a_checkpoint_file_and_the_draws_continue_as_without_it(tmp_path):
    rule = _rule(n_prompts=6, seed=3)
    for step in range(4):
        _call(rule, easy=2, hard=3, mixed=1)
    path = tmp_path / "skip.npz"
    save_state(path, rule.state_dict())
    resumed = _rule(n_prompts=6, seed=99)  # its own seed is overwritten by the saved generator
    resumed.load_state_dict(load_state(path))
    assert resumed.runs == rule.runs and resumed.explore == rule.explore
    assert resumed.prompts_drawn == rule.prompts_drawn
    assert [resumed.skip(u % 6) for u in range(60)] == [rule.skip(u % 6) for u in range(60)]
    with pytest.raises(ValueError, match="same prompt data"):
        _rule(n_prompts=7).load_state_dict(load_state(path))


@pytest.mark.parametrize("knobs, message", [
    ({"skip_target": 1.5}, "skip_target must be a finite number >= 0.0 and <= 1.0"),
    ({"skip_explore": 0.0}, "skip_explore must be a finite number > 0.0"),
    ({"skip_explore": 0.99}, r"must lie within \[replay.skip_explore_min 0.05, replay.skip_explore_max 0.95\]"),
    ({"skip_explore_step": -0.1}, "skip_explore_step must be a finite number >= 0.0"),
    ({"skip": 1}, "replay.skip must be True or False"),
])
def test_bad_knobs_are_refused_with_the_bound(knobs, message):
    with pytest.raises(ValueError, match=message):
        ReplayConfig(**knobs)


def test_skips_leave_whole_batches_and_a_short_tail_of_a_pass_is_deferred():
    """Batches of 4 from passes of 10 prompts, every prompt a long run of wrong groups (keep 0.01):
    a skip is refused where the batch could no longer fill from the rest of the pass, and a tail
    shorter than a batch is not generated, so every pass keeps a multiple of 4 prompts."""
    rule = _rule(n_prompts=10, batch_size=4)
    for uid in range(10):
        for _ in range(8):
            rule.observe(uid, ALL_WRONG)
    for _ in range(30):  # 30 passes
        kept = [uid for uid in range(10) if not rule.skip(uid)]
        assert len(kept) % 4 == 0, kept
    figures = rule.end_call()
    assert figures["replay/skip_drawn_prompts"] == 300
    kept_total = 300 - figures["replay/skip_skipped_prompts"] - figures["replay/skip_deferred_prompts"]
    assert kept_total % 4 == 0 and figures["replay/skip_skipped_prompts"] > 150
    first = _rule(n_prompts=10, batch_size=4)  # no history: only the tail of 2 is deferred, each pass
    assert [first.skip(u) for u in range(10)] == [False] * 8 + [True] * 2
    assert first.end_call()["replay/skip_deferred_prompts"] == 2
    with pytest.raises(ValueError, match="fewer than a batch"):
        _rule(n_prompts=3, batch_size=4)
