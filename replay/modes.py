"""The built-in replay modes and off-policy rules, one registry entry each (`replay/registry.py`).

Every default of a mode is here, beside its sampler, keep rule, composer, hooks and checks;
docs/METHOD.md section 3 is the table of the same. A mode may instead live in a module of its own
under `replay/plugins/` (README, "Adding a sampler or a mode"). RLEP's pool keeps every success of
a prompt: a prompt returns once per epoch, so an age limit shorter than an epoch would empty it
before its prompt comes back.
FreshPER keeps every rollout, as its reference buffer does (its priority is |reward|, not |A|), and
its alpha is 0.6; the method's is 0.5.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

import replay.exgrpo as exgrpo
import replay.samplers as samplers
from replay.composer import Composition, compose, compose_rlep, fresh_only, nominal_replay_count
from replay.exgrpo_keep import EXGRPO_KEEP
from replay.holding import KEEP_RULE, PRIORITY_RULE
from replay.keep import EVERYTHING, NONZERO_ADVANTAGE, NONZERO_GROUP, SUCCESSES
from replay.pool import load_pool
from replay.registry import CheckpointRules, ModeHooks, OffPolicyRule, ReplayMode, mode_names, off_policy_names, \
    register_mode, register_off_policy


def ratio_target(config: Any, n_fresh: int, n_groups: int, multiple_of: int = 1) -> int:
    """Fresh-anchored modes: ratio x n_fresh in whole multiples of `multiple_of`."""
    return nominal_replay_count(n_fresh, config.ratio, multiple_of)


def refuses_refill(why: str) -> Callable[[Any], None]:
    """A mode's `check` that refuses `--replay.refill`, saying `why` it cannot take filtered groups' rows."""
    def check(config: Any) -> None:
        if config.refill:
            raise ValueError(f"replay.refill fills the groups dynamic filtering drops with replayed rollouts, which "
                             f"replay.mode {config.mode!r} cannot do ({why}): unset replay.refill, or use another mode")
    return check


def runs_with(estimators: tuple[str, ...], why: str, kl_in_reward: bool = True) -> Callable[[Any, Any], list[str]]:
    """A mode's `launch_errors`: it runs only with upstream's advantage `estimators` (`why` says
    why), and, unless `kl_in_reward`, not with KL folded into the reward (it recomputes advantages
    as it composes a step, which would drop the penalty folded into the per-token ones)."""
    def errors(config: Any, args: Any) -> list[str]:
        out, estimator, kl = [], args.algo.advantage.estimator, args.algo.kl
        if estimator not in estimators:
            out.append(f"--replay.mode {config.mode} runs with --algo.advantage.estimator {' or '.join(estimators)} "
                       f"({why}), not {estimator}; pass --algo.advantage.estimator {estimators[0]}")
        if kl.init_coef > 0 and not kl.use_loss and not kl_in_reward:
            out.append(f"--replay.mode {config.mode} recomputes advantages as it composes a step, which would drop "
                       "the KL penalty folded into the per-token advantages; use KL as a loss (--algo.kl.use_loss) "
                       "or --algo.kl.init_coef 0")
        return out
    return errors


# -------------------------------------------------------------------- FreshPER


class FreshPERHooks(ModeHooks):
    """Prioritised replay's state (FreshPER, `reward_fresh`): a rollout enters at |reward| + eps,
    and each drawn one is updated to max(|reward|, 1e-6), raising the running maximum. The state is
    the store's priorities column and max_priority, saved with the store."""

    def insert_priorities(self, fresh, config):
        return samplers.reward_fresh_priorities(fresh.rewards, config.eps)

    def after_draw(self, store, composition, config):
        drawn = composition.indices
        store.update_priorities(drawn, samplers.replayed_priorities(store.view().rewards[drawn]))


def _freshness_check(config) -> None:
    if config.eps == 0:
        raise ValueError(f"replay.eps = {config.eps!r} in freshness mode gives a rollout of reward 0 the priority "
                         "0, with which it cannot be stored: make it positive (the default is 1e-6)")


def _freshness_check_buffer(config) -> None:
    if config.beta_steps is None and config.beta_start != config.beta_end:
        raise ValueError(f"replay.beta_steps is unset: the freshness importance weights anneal over it from "
                         f"beta_start {config.beta_start} to beta_end {config.beta_end}; set it to the run's length "
                         "in steps (config.for_run(steps)), or beta_end to beta_start for a fixed beta")


def _freshness_for_run(config, steps: int, group_size: int | None):
    return config if config.beta_steps is not None else dataclasses.replace(config, beta_steps=steps)


# What freshness mode's stored priorities mean: a holding rule, so a file kept by another does not resume.
FRESHNESS_PRIORITY_RULE = ("reward_fresh: (|reward| + eps) x exp(-age / tau), the newest insertion at the running "
                           "maximum, the drawn updated to max(|reward|, 1e-6)")


class FreshnessCheckpoint(CheckpointRules):
    """FreshPER's stored priorities mean `FRESHNESS_PRIORITY_RULE`; format-1 code kept and ranked
    rollouts by another rule, so its files do not resume here."""

    def holding(self, config):
        return {PRIORITY_RULE: FRESHNESS_PRIORITY_RULE}

    def format_1(self, config, rules):
        old = {KEEP_RULE: "nonzero_advantage", PRIORITY_RULE: "(|A| + eps) ** alpha x exp(-age / tau)",
               "replay.min_abs_advantage": config.min_abs_advantage}
        return {k: v for k, v in rules.items() if k != PRIORITY_RULE} | old


def _advantage_check(config) -> None:
    if config.eps == 0 and config.min_abs_advantage == 0:
        raise ValueError(
            f"replay.eps = {config.eps!r} with replay.min_abs_advantage = {config.min_abs_advantage!r} would store "
            "rollouts with priority 0 that can never be drawn: make one of them positive")


# -------------------------------------------------------------------- RLEP


def _per_prompt_target(config, n_fresh: int, n_groups: int, multiple_of: int = 1) -> int:
    """RLEP: `per_prompt` for each fresh group, exact (the integration adds inert rows)."""
    return config.per_prompt * n_groups


def _per_prompt_text(config, prompts: int, fresh: int) -> str:
    return f"--replay.per_prompt {config.per_prompt} x {prompts} prompts"


def _rlep_describe(config, args, rows: int, common: str) -> str:
    pool = (f"from the first step, from the offline pool {config.success_pool} (no warm-up: it is full before "
            "the run)" if config.success_pool else f"after step {config.warmup}, from the in-run pool (the run's "
            "own successes: a prompt's from its second visit, once per epoch)")
    return (f"replay: mode success (RLEP), up to {config.per_prompt} successes of each of the {args.rollout.batch_size} "
            f"prompts (min of that and its stored successes) join its group of {args.rollout.n_samples_per_prompt} "
            f"{pool}, completed by inert rows to whole --train.batch_size {args.train.batch_size} batches (at most "
            f"{rows} rows); pi_old of replayed rows: {config.effective_off_policy}")


def _compose_fresh_anchored(fresh, store, sampler, config, step, rng, multiple_of=1, *, divide_by_std=True, extra=0):
    """`compose`, with the composers' common signature (group advantages are not recomputed)."""
    return compose(fresh, store, sampler, config, step, rng, multiple_of, extra)


# -------------------------------------------------------------------- the entries

COMMON = dict(composer=_compose_fresh_anchored, target=ratio_target)

register_mode(ReplayMode(
    name="naive", help="whole groups, FIFO, uniform with replacement", sampler=samplers.group,
    keep=NONZERO_GROUP, **COMMON))
register_mode(ReplayMode(
    name="uniform", help="every stored rollout equally likely", sampler=samplers.uniform,
    knobs=lambda c: dict(replacement=c.replacement), keep=NONZERO_ADVANTAGE, max_age_steps=10, **COMMON))
register_mode(ReplayMode(
    name="advantage", help="the method: priority (|A| + eps) ** alpha", sampler=samplers.advantage,
    knobs=lambda c: dict(alpha=c.effective_alpha, eps=c.eps, replacement=c.replacement),
    keep=NONZERO_ADVANTAGE, max_age_steps=10, alpha=0.5, check=_advantage_check, **COMMON))
register_mode(ReplayMode(
    name="freshness", help="FreshPER: PER by |reward| decayed by age, every rollout stored",
    sampler=samplers.freshness,
    knobs=lambda c: dict(alpha=c.effective_alpha, tau=c.tau, beta_start=c.beta_start, beta_end=c.beta_end,
                         beta_steps=c.beta_steps),
    keep=EVERYTHING, alpha=0.6, hooks=FreshPERHooks, check=_freshness_check, check_buffer=_freshness_check_buffer,
    for_run=_freshness_for_run, checkpoint=FreshnessCheckpoint(), **COMMON))
register_mode(ReplayMode(
    name="success", help="RLEP: verified-correct rollouts join their prompt's fresh group",
    sampler=samplers.success, knobs=lambda c: dict(threshold=c.success_threshold, per_prompt=c.per_prompt),
    keep=SUCCESSES, composer=compose_rlep, target=_per_prompt_target, off_policy="recompute", load_pool=load_pool,
    check=refuses_refill("RLEP's replayed successes join the fresh group of their own prompt, and a filtered group "
                         "has no rows left to join"),
    launch_errors=runs_with(("group_norm", "dr_grpo"), "it recomputes group advantages over the enlarged groups",
                            kl_in_reward=False),
    count_text=_per_prompt_text, describe=_rlep_describe))

# -------------------------------------------------------------------- age 0 (a control)


def compose_age0(fresh, store, sampler, config, step, rng, multiple_of=1, *, divide_by_std=True, extra=0):
    """A control, not a method: the replay part is drawn from this step's own fresh rollouts with
    A != 0, so a step trains as many rows, and takes as many optimizer steps, as `uniform` does,
    with no old data. After the warm-up, ratio x n rows: every such row once in a random order,
    then again in the same order while more are needed (a step with fewer of them than that); none
    when the step has none. The store is not read (its `indices` are empty); pi_old is the
    behaviour log-prob, so a row's second pass is clipped against the policy that generated it."""
    if extra:
        raise ValueError("age0 cannot take the rows of filtered groups (replay.refill): it draws from the step's "
                         "own rollouts, and a filtered group has none left")
    eligible = np.flatnonzero(np.abs(fresh.advantages) > config.min_abs_advantage)
    target = ratio_target(config, len(fresh), 0, multiple_of)
    info = {"candidates": float(len(eligible)), "ess": float(len(eligible))}
    if step < config.effective_warmup or not len(eligible) or not target:
        return fresh_only(fresh, info)
    rows = np.resize(rng.permutation(eligible), target)
    return Composition(fresh, fresh.select(rows), np.ones(target, np.float32), np.zeros(0, np.int64), info)


register_mode(ReplayMode(
    name="age0", help="a control: the replay part is this step's own rollouts with A != 0 (no old data)",
    keep=NONZERO_ADVANTAGE, max_age_steps=1, composer=compose_age0, target=ratio_target,
    check=refuses_refill("it draws from the step's own rollouts, and a filtered group has none left")))

# -------------------------------------------------------------------- ExGRPO


class ExGRPOHooks(ModeHooks):
    """ExGRPO's trajectory choice: a rollout enters with its `trajectory_scores` (1 / its perplexity
    under the policy that generated it) as its stored priority, and the sampler replays the highest
    of a question. A draw changes nothing; the state is the store's priorities column."""

    def insert_priorities(self, fresh, config):
        return exgrpo.trajectory_scores(fresh)


def _exgrpo_knobs(config) -> dict[str, Any]:
    return dict(group_size=config.group_size, threshold=config.success_threshold,
                min_abs_advantage=config.min_abs_advantage)


def _exgrpo_for_run(config, steps: int, group_size: int | None):
    """K, the run's rollouts per prompt, unless set."""
    if group_size is None or config.group_size is not None:
        return config
    return dataclasses.replace(config, group_size=group_size)


def _exgrpo_check_buffer(config) -> None:
    if config.group_size is None or config.group_size < 2:
        raise ValueError(f"replay.group_size is {config.group_size!r}: exgrpo buckets a question by its successes out "
                         "of K rollouts, K >= 2; the integration sets it from --rollout.n_samples_per_prompt "
                         "(ReplayConfig.for_run(steps, group_size)); with the core alone, set replay.group_size")


def _compose_exgrpo(fresh, store, sampler, config, step, rng, multiple_of=1, *, divide_by_std=True, extra=0):
    """The fresh-anchored batch, each replayed row with its mixed group's advantage
    (`exgrpo.mixed_group_advantage` at its question's latest success count, on the fresh rows'
    scale: `divide_by_std` unless dr_grpo) in place of the one frozen at its own step: the
    advantage the reference gives it beside K - 1 fresh rollouts of its question."""
    comp = compose(fresh, store, sampler, config, step, rng, multiple_of, extra)
    if not len(comp.replayed):
        return comp
    uids, k, _, _ = exgrpo.questions(store.view(), threshold=config.success_threshold,
                                     min_abs_advantage=config.min_abs_advantage)
    at = np.searchsorted(uids, comp.replayed.prompt_uids)  # uids ascend; every drawn one is there
    adv = exgrpo.mixed_group_advantage(k[at], config.group_size, divide_by_std).astype(np.float32)
    return dataclasses.replace(comp, replayed=comp.replayed.replace(advantages=adv))


def _exgrpo_describe(config, args, rows: int, common: str) -> str:
    return (f"replay: mode exgrpo (ExGRPO), after step {config.warmup} one stored success of each of up to {rows} "
            f"questions a step (fewer when fewer are replayable, in whole --train.batch_size {args.train.batch_size} "
            f"batches) beside {args.rollout.batch_size * args.rollout.n_samples_per_prompt} fresh rollouts; buckets "
            f"of K = {config.group_size or args.rollout.n_samples_per_prompt} rollouts per prompt; replayed rows: "
            f"their mixed group's advantage, off-policy rule {config.effective_off_policy}")


register_mode(ReplayMode(
    name="exgrpo", help="ExGRPO: questions of medium success rate, each its lowest-perplexity stored success, "
    "trained on a shaped objective", sampler=exgrpo.exgrpo, knobs=_exgrpo_knobs, keep=EXGRPO_KEEP,
    composer=_compose_exgrpo, target=ratio_target, off_policy="exgrpo", hooks=ExGRPOHooks,
    check_buffer=_exgrpo_check_buffer, for_run=_exgrpo_for_run,
    launch_errors=runs_with(("group_norm", "dr_grpo", "rloo"), "its retirement marker is a success of advantage 0, "
                            "which an all-correct group has under these", kl_in_reward=False),
    describe=_exgrpo_describe))

# Upstream's IS corrections that weigh a token by pi_old / pi_behaviour (token level, by the ratio):
# `clip` truncates the weight to the threshold band, `mask` drops tokens outside it.
TOKEN_CLIP = ("token", "clip", "ratio")
TOKEN_MASK = ("token", "mask", "ratio")

register_off_policy(OffPolicyRule(
    name="stale", help="pi_old is the stored behaviour log-prob"))
register_off_policy(OffPolicyRule(
    name="refresh", help="pi_old recomputed under the current weights, with a truncated IS weight",
    recompute_old=True, corrections=(TOKEN_CLIP,)))
register_off_policy(OffPolicyRule(
    name="recompute", help="pi_old recomputed under the current weights, no IS weight (RLEP's reference)",
    recompute_old=True, behaviour_weight=False))
register_off_policy(OffPolicyRule(
    name="m2po", help="M2PO: as refresh, and each micro-batch masks its tokens of largest "
    "(log pi_old - log pi_behaviour)^2 until their mean is below --replay.m2_threshold",
    recompute_old=True, corrections=(TOKEN_MASK, TOKEN_CLIP), corrections_hint="M2PO=1 in examples/scripts sets them",
    loss_settings=lambda c: dict(m2_threshold=c.m2_threshold)))

register_off_policy(OffPolicyRule(
    name="exgrpo", help="ExGRPO: pi_old is the stored behaviour log-prob, and replayed rows train on "
    "-A w / (w + 0.1), unclipped (policy shaping)",
    loss="openrlhf_replay.trainer.ray.ppo_actor:ShapedSplitStatsPolicyLoss"))

MODES = mode_names()  # the built-in ones; `registry.mode_names()` also lists those registered later
OFF_POLICY = off_policy_names()
