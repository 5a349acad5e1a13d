"""Training actors that report their statistics per kind of row, and their own balance across ranks.

Upstream's `ActorPPOTrainer` averages every statistic over all rows of a micro-batch. With replay
that mixes two populations: one clip fraction for fresh and replayed rows together (a stale replay
fighting the clip would hide inside it), and generation statistics (reward, response length,
truncation, group reward std, ...) averaged with replayed rows, which carry stored copies or
zeros. Here each such statistic is logged per kind of row (`<name>@fresh` / `<name>@replay`, see
`split_by_row_kind`): upstream's generation keys then describe fresh rollouts only, as the
controller's `rollout/*` statistics do.

Each rank also reports what it trained on, reduced over the ranks as min and max: Experience
micro-batches received (fresh and replayed), optimizer steps taken, and a checksum of its
weights. Equal min and max mean balanced ranks; unequal ones are the first sign of a hang.

The actor's LR scheduler follows rollout steps, not optimizer steps: each rollout step moves it by
its fresh optimizer steps, as in GRPO, whatever replay adds (`openrlhf_replay/trainer/lr_schedule.py`).

Seams used (OpenRLHF 0.11.2): `PolicyModelActor.init_model_from_pretrained` builds `self.trainer`
(its class is switched to the subclass below, which only adds behaviour) and `self.actor_scheduler`
(paced in place), `append` and `fit` (wrapped: `fit` first tells the scheduler the step's rows),
`ActorPPOTrainer.training_step` (wrapped; with KL as a loss under `refresh` or `m2po`, replayed
rows' pi_old reads pi_behaviour for the KL's importance weight, `behaviour_weighted_kl`) and
`PolicyLoss.forward` (wrapped: the per-row statistics come from its inputs; with ExGRPO's
off-policy rule, replayed rows take its shaped objective, `openrlhf_replay/trainer/exgrpo_loss.py`).
"""
from __future__ import annotations

import contextlib
import importlib

import ray
import torch
from openrlhf.models import PolicyLoss
from openrlhf.models.utils import compute_approx_kl
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor
from openrlhf.utils.logging_utils import init_logger

from openrlhf_replay.trainer.exgrpo_loss import ShapedReplayPolicyLoss
from openrlhf_replay.trainer.lr_schedule import RolloutPacedLR, pace_by_rollout_steps
from openrlhf_replay.trainer.ppo_utils.experience import INERT_KEY, REPLAYED_KEY, paced_rows, per_kind
from openrlhf_replay.trainer.ray.dynamic_batch import AllRowsReplayBuffer
from openrlhf_replay.trainer.ray.m2po import m2po_keep
from openrlhf_replay.utils import undecorated
from replay import ReplayConfig

logger = init_logger(__name__)  # upstream's handler: a bare logger prints nothing inside a Ray actor

# Generation statistics that mean something on replayed rows too (stored with the rollout).
REPLAYED_ROW_STATS = ("reward", "response_length")


def row_ratio_stats(log_probs, old_log_probs, advantages, action_mask, clip_low: float, clip_high: float):
    """Per-row PPO statistics, all (B,): fraction of tokens whose ratio is clipped (as upstream
    counts it: the clipped surrogate is the smaller one), mean ratio, and mean |log ratio|."""
    mask = action_mask.float()
    tokens = mask.sum(-1).clamp(min=1)
    log_ratio = (log_probs - old_log_probs).detach().float().clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - clip_low, 1 + clip_high) * advantages
    clipped = (surr2 < surr1).float()
    return (clipped * mask).sum(-1) / tokens, (ratio * mask).sum(-1) / tokens, (log_ratio.abs() * mask).sum(-1) / tokens


def _replayed_rows(info: dict, device=None, key: str = REPLAYED_KEY) -> torch.Tensor:
    """(B,) float: 1.0 on replayed rows (`key`: on rows flagged so). After the actor's collate, 0-d
    info values arrive as a list; a missing key reads 0 on every row."""
    if key not in info:
        return torch.zeros(len(info[REPLAYED_KEY]), device=device)
    return torch.as_tensor([float(x) for x in info[key]], device=device)


class SplitStatsPolicyLoss(PolicyLoss):
    """Upstream's `PolicyLoss` (same loss, same return), which also writes per-row clip and ratio
    statistics, per kind of row, into the info dict of the micro-batch being trained (`row_info`);
    with KL as a loss (`row_ref_log_probs` set), each row's KL to the reference model too, as the
    KL loss computes it (`replay/kl_fresh`, `replay/kl_replay`).

    With `m2_threshold` set (`--replay.off_policy m2po`), upstream's loss first loses the tokens M2PO
    masks (`m2po.m2po_keep`, over every token of the micro-batch, fresh and replayed, as AReaL's
    `grpo_loss_fn`): they leave the action mask the loss reads, and `replay/m2po_masked_*` says
    which share of each kind's tokens went."""

    row_info: dict | None = None
    row_ref_log_probs: torch.Tensor | None = None  # (B, T - 1) the micro-batch's base_action_log_probs
    ratio_old_log_probs: torch.Tensor | None = None  # (B, T - 1) pi_old, when upstream hands the loss another
    kl_estimator: str = "k1"
    m2_threshold: float | None = None

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, **kwargs):
        if self.ratio_old_log_probs is not None:  # see ReplayActorPPOTrainer.behaviour_weighted_kl
            old_log_probs = self.ratio_old_log_probs
        behaviour = kwargs.get("rollout_log_probs")
        if self.m2_threshold is not None and action_mask is not None and behaviour is not None:
            kept = m2po_keep(old_log_probs, behaviour, action_mask, self.m2_threshold)
            self._log_m2po(action_mask, kept)
            action_mask = kept.to(action_mask.dtype)
        out = super().forward(log_probs, old_log_probs, advantages, action_mask=action_mask, **kwargs)
        info = self.row_info
        if info is not None and REPLAYED_KEY in info and action_mask is not None:
            replayed, inert = _replayed_rows(info), _replayed_rows(info, key=INERT_KEY)
            stats = row_ratio_stats(log_probs, old_log_probs, advantages, action_mask,
                                    self.clip_eps_low, self.clip_eps_high)
            names = ["clip_frac", "ratio_mean", "abs_log_ratio"]
            if self.row_ref_log_probs is not None:
                kl = compute_approx_kl(log_probs.detach(), self.row_ref_log_probs, kl_estimator=self.kl_estimator)
                mask = action_mask.float()
                stats, names = (*stats, (kl * mask).sum(-1) / mask.sum(-1).clamp(min=1)), names + ["kl"]
            for name, value in zip(names, stats):
                info.update(per_kind(f"replay/{name}_fresh", value.cpu(), replayed, "fresh"))
                info.update(per_kind(f"replay/{name}_replay", value.cpu(), replayed, "replay", inert))
        return out

    def _log_m2po(self, action_mask: torch.Tensor, kept: torch.Tensor) -> None:
        """Per row, the share of its tokens M2PO masked, by kind (`replay/m2po_masked_fresh|replay`)."""
        info = self.row_info
        if info is None or REPLAYED_KEY not in info:
            return
        tokens = action_mask.float().sum(-1)
        masked = ((action_mask.bool() & ~kept).float().sum(-1) / tokens.clamp(min=1)).detach().cpu()
        replayed, inert = _replayed_rows(info), _replayed_rows(info, key=INERT_KEY)
        info.update(per_kind("replay/m2po_masked_fresh", masked, replayed, "fresh"))
        info.update(per_kind("replay/m2po_masked_replay", masked, replayed, "replay", inert))


class ShapedSplitStatsPolicyLoss(SplitStatsPolicyLoss, ShapedReplayPolicyLoss):
    """`SplitStatsPolicyLoss` over ExGRPO's `ShapedReplayPolicyLoss` (the loss the off-policy rule
    `exgrpo` names): the micro-batch's replayed rows, read from the flags of `row_info`, train on
    -A w / (w + 0.1), the fresh ones on upstream's loss; the per-kind statistics are kept (of
    replayed rows, `clip_frac` says where upstream's clip would bind: shaping has none)."""

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, **kwargs):
        info = self.row_info
        flagged = info is not None and REPLAYED_KEY in info
        self.replayed_rows = _replayed_rows(info, log_probs.device).bool() if flagged else None
        try:
            return super().forward(log_probs, old_log_probs, advantages, action_mask=action_mask, **kwargs)
        finally:
            self.replayed_rows = None


def policy_loss_class(rule) -> type[SplitStatsPolicyLoss]:
    """The actor's loss class under off-policy rule `rule`: the class its `loss` names
    ("module:Class", e.g. ExGRPO's `ShapedSplitStatsPolicyLoss`), else `SplitStatsPolicyLoss`."""
    if rule.loss is None:
        return SplitStatsPolicyLoss
    module, _, name = rule.loss.partition(":")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, SplitStatsPolicyLoss)):
        raise TypeError(f"off-policy rule {rule.name}: its loss {rule.loss!r} is not a subclass of "
                        "SplitStatsPolicyLoss (openrlhf_replay/trainer/ray/ppo_actor.py)")
    return cls


class ReplayActorPPOTrainer(ActorPPOTrainer):
    """`ActorPPOTrainer` whose statistics are split by kind of row."""

    kl_on_behaviour = False  # the KL loss's importance weight reads replayed rows' `rollout_log_probs`

    def enable_split_stats(self, loss_class: type[SplitStatsPolicyLoss] = SplitStatsPolicyLoss,
                           loss_settings: dict | None = None, kl_on_behaviour: bool = False) -> None:
        """`loss_class` and `loss_settings`: the off-policy rule's loss (`policy_loss_class`) and
        the attributes it sets on it (M2PO's `m2_threshold`). `kl_on_behaviour`: the rule's
        `behaviour_apart_from_old` (`behaviour_weighted_kl`)."""
        self.actor_loss_fn.__class__ = loss_class  # same state, the extra behaviour of its class
        for name, value in (loss_settings or {}).items():
            setattr(self.actor_loss_fn, name, value)
        self.kl_on_behaviour = kl_on_behaviour
        self.trained_rows = dict.fromkeys(TRAINED_KINDS, 0)

    @contextlib.contextmanager
    def behaviour_weighted_kl(self, experience):
        """Upstream's `training_step` reads pi_old once, `experience.action_log_probs`, and hands it
        both to the PPO ratio and to the KL loss, whose importance weight pi_theta / pi_old
        (`--algo.kl.unbiased_gradient`) stands for pi_theta / (the policy that sampled the tokens).
        A replayed row whose pi_old was recomputed (`refresh`, `m2po`) was sampled by pi_behaviour,
        which its `rollout_log_probs` keep: for the span of the step, replayed rows' pi_old reads
        pi_behaviour there, and the loss takes the ratio's pi_old from `ratio_old_log_probs`."""
        kl, behaviour = self.args.algo.kl, experience.rollout_log_probs
        if not (self.kl_on_behaviour and kl.use_loss and kl.init_coef > 0 and kl.unbiased_gradient
                and behaviour is not None and REPLAYED_KEY in experience.info):
            yield
            return
        old = experience.action_log_probs
        replayed = _replayed_rows(experience.info, old.device).bool()[:, None]
        self.actor_loss_fn.ratio_old_log_probs = old
        experience.action_log_probs = torch.where(replayed, behaviour.to(old.dtype), old)
        try:
            yield
        finally:
            experience.action_log_probs, self.actor_loss_fn.ratio_old_log_probs = old, None

    def training_step(self, experience, kl_ctl, step, loss_batch_info=None):
        kl = self.args.algo.kl
        self.actor_loss_fn.row_info = experience.info
        if kl.use_loss and kl.init_coef > 0:  # KL as a loss: its per-row value, per kind of row
            self.actor_loss_fn.row_ref_log_probs = experience.base_action_log_probs
            self.actor_loss_fn.kl_estimator = kl.estimator
        try:
            with self.behaviour_weighted_kl(experience):
                status = super().training_step(experience, kl_ctl, step, loss_batch_info)
        finally:
            self.actor_loss_fn.row_info = self.actor_loss_fn.row_ref_log_probs = None
        if REPLAYED_KEY in experience.info:
            # KL in the reward: `info["kl"]` is each row's KL at generation, carried by replayed rows too.
            carried = REPLAYED_ROW_STATS + (("kl",) if kl.init_coef > 0 and not kl.use_loss else ())
            count_trained_rows(self.trained_rows, experience.info)
            split_generation_stats(status, _replayed_rows(experience.info),
                                   _replayed_rows(experience.info, key=INERT_KEY), carried)
        return status


TRAINED_KINDS = ("fresh", "replayed", "inert")


def count_trained_rows(counts: dict, info: dict) -> None:
    """Add a trained micro-batch's rows to `counts` by kind (`TRAINED_KINDS`): what reached the
    loss, after upstream's (dynamic) micro-batching, so a dropped row shows as a shortfall."""
    replayed, inert = _replayed_rows(info).bool(), _replayed_rows(info, key=INERT_KEY).bool()
    counts["fresh"] += int((~replayed).sum())
    counts["replayed"] += int((replayed & ~inert).sum())
    counts["inert"] += int(inert.sum())


def split_generation_stats(status: dict, replayed: torch.Tensor, inert: torch.Tensor | None = None,
                           carried: tuple[str, ...] = REPLAYED_ROW_STATS) -> None:
    """In a `training_step` result, replace each per-row statistic of generation (upstream's
    sample-weighted keys; not this project's `replay/` keys) by its fresh-rows part, and add the
    replayed-rows part of those a stored rollout carries (`carried`; `kl` also as `replay/kl_fresh`,
    the name KL as a loss logs it under)."""
    metrics, weights = status["metrics"], status["weights"]
    for key in [k for k, w in weights.items() if w == "sample" and not k.startswith("replay/")]:
        value = metrics.pop(key).float().reshape(-1)
        del weights[key]
        parts = per_kind(key, value, replayed, "fresh")
        if key in carried:
            parts |= per_kind(f"replay/{key}_replay", value, replayed, "replay", inert)
        if key == "kl" and key in carried:
            parts |= per_kind("replay/kl_fresh", value, replayed, "fresh")
        metrics.update(parts)
        weights.update(dict.fromkeys(parts, "sample"))


class _ReplayPolicyModelActor(undecorated(PolicyModelActor)):
    def init_model_from_pretrained(self, strategy, pretrain, max_steps=None, vllm_engines=None):
        super().init_model_from_pretrained(strategy, pretrain, max_steps, vllm_engines)
        self._received = {"fresh": 0, "replayed": 0, "fresh_rows": 0, "rows": 0}
        config = ReplayConfig.from_namespace(strategy.args)
        if config.enabled:
            # Upstream builds its ActorPPOTrainer inline; building a second one would open a
            # second weight-sync group to vLLM, so the instance is switched to the subclass.
            self.trainer.__class__ = ReplayActorPPOTrainer
            rule = config.off_policy_rule
            self.trainer.enable_split_stats(policy_loss_class(rule), rule.loss_settings(config),
                                            rule.behaviour_apart_from_old)
            logger.info(f"replay: off-policy rule {rule.name}, actor loss {type(self.trainer.actor_loss_fn).__name__}")
            pace_by_rollout_steps(self.actor_scheduler)  # after upstream has loaded a checkpoint's state
            if strategy.args.train.dynamic_batch_enable:  # pack replayed rows too (dynamic_batch.py)
                self.trainer.replay_buffer.__class__ = AllRowsReplayBuffer

    def append(self, experience):
        flags = experience.info.get(REPLAYED_KEY)
        replayed_rows = 0 if flags is None else int(torch.as_tensor(flags).bool().sum())
        self._received["replayed" if replayed_rows else "fresh"] += 1
        self._received["rows"] += len(experience.sequences)
        self._received["fresh_rows"] += paced_rows(experience)  # the critic's rule too
        super().append(experience)

    def fit(self, kl_ctl: float = 0):
        engine = self.actor.model
        steps_before = engine.global_steps
        if isinstance(self.actor_scheduler, RolloutPacedLR):
            # Summed over the ranks: dynamic batching deals rows by length, not by kind, so one
            # rank's fresh share may differ from another's; the LR must not.
            rows = self.strategy.all_reduce({k: self._received[k] for k in ("fresh_rows", "rows")}, op="sum")
            self.actor_scheduler.pace(round(rows["fresh_rows"]), round(rows["rows"]))
        status = super().fit(kl_ctl)
        mine = {"fresh_micro_batches": self._received["fresh"], "replayed_micro_batches": self._received["replayed"],
                "optimizer_steps": engine.global_steps - steps_before}
        trained = getattr(self.trainer, "trained_rows", None)
        if trained is not None:  # rows that reached the loss, by kind, summed over the ranks
            status.update({f"replay/trained_rows_{k}": v for k, v in
                           self.strategy.all_reduce({k: float(n) for k, n in trained.items()}, op="sum").items()})
            mine["trained_rows"] = sum(trained.values())
            self.trainer.trained_rows = dict.fromkeys(trained, 0)
        if self.strategy.args.ds.zero_stage < 3:  # ZeRO-3 ranks hold different shards: nothing to compare
            mine["weights_checksum"] = sum(p.detach().double().abs().sum() for p in engine.parameters()).item()
        status.update(rank_spread(self.strategy, mine))
        self._received = dict.fromkeys(self._received, 0)
        return status


def rank_spread(strategy, values: dict) -> dict:
    """`replay/rank_<name>_min` and `_max` of each value over the data-parallel ranks (float64)."""
    out = {}
    for name, value in values.items():
        mine = torch.tensor([float(value)], dtype=torch.float64)
        out[f"replay/rank_{name}_max"] = strategy.all_reduce(mine.clone(), op="max").item()
        out[f"replay/rank_{name}_min"] = -strategy.all_reduce(-mine, op="max").item()
    return out


ReplayPolicyModelActor = ray.remote(num_gpus=1)(_ReplayPolicyModelActor)
