"""ExGRPO's storage rules, run when a step's rollouts enter the store: which are kept
(`keep_successes`, as the keep rule `EXGRPO_KEEP` its entry holds) and with what priority
(`trajectory_scores`, the mode's on-insert hook). The draw, which reads what these rules stored,
is `replay/exgrpo.py`. Reference and rules: `replay/exgrpo.py`'s docstring and docs/METHOD.md
section 3.
"""
from __future__ import annotations

import numpy as np

from replay.keep import KeepRule
from replay.record import RolloutBatch


def trajectory_scores(batch: RolloutBatch) -> np.ndarray:
    """(n,) float64 in (0, 1]: exp of the mean stored log-prob over each rollout's action tokens,
    1 / its perplexity under the policy that generated it. The on-insert hook stores it as the
    rollout's priority; the sampler replays the highest of a question (the lowest-entropy proxy).
    A rollout without an action token scores the smallest positive float: it carries no
    gradient, so it is the last choice."""
    lp = np.where(batch.action_mask, batch.behaviour_logprobs.astype(np.float64), 0.0)
    start, end = batch.response_offsets[:-1], batch.response_offsets[1:]
    sums = np.r_[0.0, np.cumsum(lp)]
    counts = np.r_[0, np.cumsum(batch.action_mask, dtype=np.int64)]
    n_tokens = counts[end] - counts[start]
    with np.errstate(invalid="ignore", divide="ignore"):
        score = np.exp((sums[end] - sums[start]) / n_tokens)
    tiny = np.finfo(np.float64).tiny
    return np.where((n_tokens > 0) & np.isfinite(score), np.maximum(score, tiny), tiny)


def keep_successes(batch: RolloutBatch, ok: np.ndarray, *, threshold: float, min_abs_advantage: float) -> np.ndarray:
    """ExGRPO's keep rule, (n,) bool over one step's rollouts (`ok`: those the store accepts).
    Every success (reward > threshold) with |A| >= min_abs_advantage, i.e. of a group with
    0 < k < K; and of each group whose valid rollouts all succeeded (|A| = 0), its first valid
    success, as the question's retirement marker. Failures are never stored."""
    success = ok & (batch.rewards > threshold)
    informative = np.abs(batch.advantages) >= min_abs_advantage
    keep = success & informative
    _, group = np.unique(batch.group_ids, return_inverse=True)
    n_groups = int(group.max(initial=-1)) + 1
    failed = np.bincount(group, weights=ok & ~success, minlength=n_groups) > 0
    solved = ~failed & (np.bincount(group, weights=ok, minlength=n_groups) > 0)
    marker_rows = np.flatnonzero(success & ~informative & solved[group])
    _, first = np.unique(group[marker_rows], return_index=True)
    keep[marker_rows[first]] = True
    return keep


def _keep_successes(batch: RolloutBatch, ok: np.ndarray, *, success_threshold: float,
                    min_abs_advantage: float) -> np.ndarray:
    return keep_successes(batch, ok, threshold=success_threshold, min_abs_advantage=min_abs_advantage)


# ExGRPO's entry (replay/modes.py) holds this rule; what it skips are failures (and the surplus
# successes of solved groups), so they count as unsuccessful.
EXGRPO_KEEP = KeepRule("exgrpo", _keep_successes, ("success_threshold", "min_abs_advantage"),
                       skipped_counter="skipped_unsuccessful")
