"""ExGRPO's experience management: which stored questions to replay, and which trajectory of each.

ExGRPO (Zhan et al., arXiv 2510.02245, ICLR 2026). Reference code: ElliottYan/LUFFY, folder
`ExGRPO/`, modules under `exgrpo/verl/verl/mix_src/` (called "ref:" below). Its rules, as its
training script `exp_scripts/run_exgrpo.sh` runs them (K = 8 rollouts per question,
`experience_lbound=0`, `experience_rbound=7`, `exp_bucket_manager=normal`, `exp_metric=ent`,
`exp_select_mode=argmin`):

- *Collection* (ref: `experience/experience_trainer_ops.py:collect_experience_entries`): a
  question whose group has k of K rollouts correct, 0 < k < K, files every correct trajectory
  under the question and moves the question to bucket k, its latest count. k = 0 changes nothing
  (the question keeps its former bucket); k = K retires it (below).
- *Retirement* (ref: `mix_trainer_experience.py:ExperienceMixRayPPOTrainer.fit`, the
  `solve_all` branch, then `experience_trainer_ops.py:cleanup_experience_buckets`): a question
  whose group is all correct joins `skip_uid_set` for good and its experience is dropped.
- *Question draw* (ref: `experience/weighted_bucket_sampler.py:WeightedBucketSampler`, `normal`
  weighting, and `.sample`): bucket k weighs N(k; K / 2, 1), a Gaussian density over the success
  count (mean accuracy 0.5, standard deviation one success); the n questions of a step split over
  the non-empty buckets by one multinomial draw; a bucket asked for more questions than it holds
  gives them all and the excess goes, one at a time, to a bucket with room, picked in proportion
  to its probability; within a bucket questions are drawn uniformly without replacement.
- *Trajectory choice* (ref: `experience/experience_helpers.py:compute_postcal_metrics`,
  `select_best_experiences`): of the drawn question's stored correct trajectories, the one of
  lowest mean entropy under the *current* policy (a forward pass over every candidate at draw
  time), first of equals. Its mask, `~(responses != pad_token_id)`, takes the mean over the
  padding after the response, not over its tokens (docs/METHOD.md section 3, ExGRPO).

What a numpy core can do: it never runs the policy, so the trajectory choice here ranks by what
the store holds, each trajectory's mean log-prob under the policy that generated it
(`trajectory_scores`: exp(mean log pi_b) = 1 / perplexity, kept as the rollout's stored priority
by the on-insert hook, highest chosen). That is the lowest mean sampled-token surprisal
-log pi_b(o_t), a one-sample estimate of the entropy at each position, under the behaviour
policy rather than the current one, and over the response's own tokens, as the paper describes it.
The reference's own alternative metric (`exp_metric=ppl`) is this perplexity, under the current
policy (its code uses the same pad mask). Exact fidelity needs the integration to compute each
candidate's mean entropy under the current weights before the choice (the reference's cost: one
forward over every stored success of every drawn question).

How the store carries the reference's state (`keep_successes`): every success of a group with
A != 0 (0 < k < K) is stored; of a group where every valid rollout succeeded (A = 0 under
group_norm, dr_grpo and rloo), one success is stored as a retirement marker. The sampler then
reads a question's bucket as the number of stored successes of its latest stored group, and
treats a question with any stored marker as retired.
"""
from __future__ import annotations

import math

import numpy as np

from replay.exgrpo_keep import keep_successes, trajectory_scores  # noqa: F401 (the storage rules)
from replay.samplers import Draw
from replay.store import StoreView

# ref: `WeightedBucketSampler._normal_mapping`: sigma = 1, in successes out of K.
BUCKET_SIGMA = 1.0


# -------------------------------------------------------------------- the replayed rows' advantage


def mixed_group_advantage(k: np.ndarray, group_size: int, divide_by_std: bool = False) -> np.ndarray:
    """The advantage a replayed success gets in the reference: it joins K - 1 fresh rollouts of
    its question and the group's mean is subtracted, without std (ref: `run_exgrpo.sh`,
    `algorithm.grpo_use_std=False`; `mix_trainer_experience.py:fit` -> `compute_advantage`). Here
    the fresh rollouts' success rate is taken at its expectation, the question's latest k / K:
    1 - m with m = (1 + (K - 1) k / K) / K. (k,) -> float64.

    `divide_by_std` (a run whose fresh rows are `group_norm`'s): divided by that group's std as
    group_norm takes it, with Bessel's correction, sqrt(K m (1 - m) / (K - 1)) for 0/1 rewards,
    so that replayed and fresh advantages share a scale (exact where (K - 1) k / K is whole)."""
    k = np.asarray(k, np.float64)
    mean = (1.0 + (group_size - 1) * k / group_size) / group_size
    if not divide_by_std:
        return 1.0 - mean
    std = np.sqrt(np.maximum(group_size * mean * (1.0 - mean) / (group_size - 1), 0.0))
    return (1.0 - mean) / (std + 1e-9)


# -------------------------------------------------------------------- the question table


def bucket_weights(counts: np.ndarray, group_size: int) -> np.ndarray:
    """N(k; K / 2, sigma = 1) of each bucket's success count k, float64 (ref: `_normal_mapping`)."""
    z = (np.asarray(counts, np.float64) - group_size / 2) / BUCKET_SIGMA
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi * BUCKET_SIGMA ** 2)


def questions(view: StoreView, *, threshold: float, min_abs_advantage: float
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The replayable questions of `view`: (uids (Q,), latest success count k (Q,), best row (Q,)
    into the view, number of retired questions). A question is replayable when it has a stored
    success with |A| >= min_abs_advantage and no retirement marker (a stored success with a
    smaller |A|). k counts the stored successes of its latest group (highest version, then group
    id); its best row is the success of highest stored priority (`trajectory_scores`), the
    earliest stored among equals (the reference's argmin takes the first)."""
    success = view.rewards > threshold
    informative = np.abs(view.advantages) >= min_abs_advantage
    retired = np.unique(view.prompt_uids[success & ~informative])
    rows = np.flatnonzero(success & informative & ~np.isin(view.prompt_uids, retired))
    if not len(rows):
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, len(retired)
    uid, ver, gid = view.prompt_uids[rows], view.versions[rows], view.group_ids[rows]
    order = np.lexsort((gid, ver, uid))  # by question, then group, latest last
    u, v, g = uid[order], ver[order], gid[order]
    new_q = np.r_[True, u[1:] != u[:-1]]
    new_group = new_q | np.r_[False, (v[1:] != v[:-1]) | (g[1:] != g[:-1])]
    group_of = np.cumsum(new_group) - 1
    last = np.r_[np.flatnonzero(new_q)[1:], len(u)] - 1  # each question's last row, its latest group
    k = np.bincount(group_of)[group_of[last]]
    # Best: highest priority, then lowest serial, per question.
    best = np.lexsort((view.serials[rows], -view.priorities[rows], uid))
    first_of_q = best[np.r_[True, uid[best][1:] != uid[best][:-1]]]
    return u[last], k.astype(np.int64), rows[first_of_q], len(retired)


def bucket_draw(k: np.ndarray, n: int, group_size: int, rng: np.random.Generator) -> np.ndarray:
    """min(n, Q) distinct question indices into `k` (each question's bucket), by the reference's
    rule (`WeightedBucketSampler.sample`): multinomial counts over the non-empty buckets with
    probabilities `bucket_weights` / their sum; a bucket's excess over its size goes, one at a
    time, to a bucket with room, picked in proportion to its probability; uniform without
    replacement within a bucket. Returned in random order, so a cut of the tail is unbiased."""
    n = min(int(n), len(k))
    if n <= 0:
        return np.zeros(0, np.int64)
    buckets, inverse, sizes = np.unique(k, return_inverse=True, return_counts=True)
    p = bucket_weights(buckets, group_size)
    p = p / p.sum()
    counts = rng.multinomial(n, p)
    excess = int(np.maximum(counts - sizes, 0).sum())
    counts = np.minimum(counts, sizes)
    for _ in range(excess):  # n <= Q, so there is always room
        room = np.flatnonzero(counts < sizes)
        counts[rng.choice(room, p=p[room] / p[room].sum())] += 1
    picked = [rng.choice(np.flatnonzero(inverse == b), size=c, replace=False)
              for b, c in enumerate(counts) if c]
    return rng.permutation(np.concatenate(picked)).astype(np.int64)


# -------------------------------------------------------------------- the sampler


def exgrpo(view: StoreView, k: int, step: int, rng: np.random.Generator, *,
           fresh_prompt_uids: np.ndarray | None = None, group_size: int, threshold: float,
           min_abs_advantage: float) -> Draw:
    """ExGRPO: min(k, Q) questions by `bucket_draw` over the replayable questions (`questions`),
    one trajectory each, its highest-priority stored success (`trajectory_scores`). No
    importance weight (the reference's draw returns none; the loss shapes the replayed rows
    instead). The step's fresh prompts play no part, as in the reference's collate function."""
    if group_size < 2:
        raise ValueError(f"exgrpo: group_size (rollouts per prompt) must be >= 2, got {group_size}")
    uids, counts, best, n_retired = questions(view, threshold=threshold, min_abs_advantage=min_abs_advantage)
    drawn = bucket_draw(counts, k, group_size, rng)
    picked = best[drawn]
    return Draw.of(picked, ess=len(uids), candidates=len(uids), questions_retired=n_retired,
                   bucket_mean=counts[drawn].mean() if len(drawn) else 0.0,
                   score_mean=view.priorities[picked].mean() if len(picked) else 0.0)
