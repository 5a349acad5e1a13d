"""KL with replay (docs/METHOD.md section 2, "KL"): upstream's adaptive KL controller reads the fresh
rows' KL, through the real status path; with KL as a loss, the importance weight of the KL term on a
replayed row is pi_theta / pi_behaviour where the behaviour policy's log-probs are known."""
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from openrlhf.models import PolicyLoss
from openrlhf.models.utils import compute_approx_kl, masked_mean
from openrlhf.trainer.ppo_utils.kl_controller import AdaptiveKLController
from openrlhf.trainer.ray.launcher import BaseModelActor
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

from openrlhf_replay.rehearsal.standins import actor_group, in_process_object_store
from openrlhf_replay.trainer.ppo_trainer import _ReplayPPOTrainer
from openrlhf_replay.trainer.ppo_utils.experience import REPLAYED_KEY, stored_token_columns
from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker
from openrlhf_replay.trainer.ray.ppo_actor import ReplayActorPPOTrainer
from replay import ReplayBuffer, ReplayConfig

TARGET, HORIZON, INIT = 0.1, 1000, 0.05


def forward_with_kl(samples_list, kl: float):
    """What upstream's `make_experience` attaches with KL in the reward: log-probs, and each
    token's KL to the reference (`kl` on every token here, so each row's mean is `kl`)."""
    g = torch.Generator().manual_seed(0)
    for s in samples_list:
        s.action_log_probs = -torch.rand(s.action_mask.shape, generator=g) * 3
        s.base_action_log_probs, s.values = None, None
        s.kl = torch.full(s.action_mask.shape, kl)
        s.info["kl"] = masked_mean(s.kl, s.action_mask, dim=-1)
        s.info["logprobs_diff"] = torch.zeros(len(s.sequences))
    return samples_list


def info_status(self, experience, kl_ctl, step, loss_batch_info=None):
    """Upstream's `training_step` as far as the KL controller reads it: the forward and the update
    aside, it merges each `info` tensor into its status, per row ("sample") or per token (0-d)."""
    metrics = {k: v for k, v in experience.info.items() if isinstance(v, torch.Tensor)}
    return {"metrics": metrics, "weights": {k: "token" if v.dim() == 0 else "sample" for k, v in metrics.items()}}


class PolicyRank:
    """One policy rank: our `ReplayActorPPOTrainer.training_step` on each appended micro-batch, and
    upstream `ppo_train`'s reduction of the statistics (a mean over rows)."""

    execute_batch = BaseModelActor.execute_batch  # upstream's dispatch of a batch to `append`

    def __init__(self, args):
        self.strategy = SimpleNamespace(is_rank_0=lambda: False)  # read by `execute_batch`
        self.trainer = ReplayActorPPOTrainer.__new__(ReplayActorPPOTrainer)
        self.trainer.args, self.trainer.actor_loss_fn = args, PolicyLoss()
        self.trainer.enable_split_stats()
        self.experiences = []

    def append(self, experience):
        self.experiences.append(experience)

    def fit(self, kl_ctl: float = 0):
        sums, rows = {}, 0
        for exp in self.experiences:
            status = self.trainer.training_step(exp, kl_ctl, 0)
            for key, value in status["metrics"].items():
                sums[key] = sums.get(key, 0.0) + float(value.float().sum())
            rows += len(exp.sequences)
        self.experiences = []
        return {key: total / rows for key, total in sums.items()}


def test_adaptive_kl_adapts_on_the_fresh_rows_kl_with_replay_on(make_args, experience_maker_cls, rollout_samples,
                                                               monkeypatch):
    monkeypatch.setattr(ActorPPOTrainer, "training_step", info_status)
    args = make_args("--algo.kl.init_coef", INIT, "--algo.kl.target", TARGET, "--algo.kl.horizon", HORIZON,
                     "--replay.mode", "advantage", "--replay.warmup", "1")
    trainer = _ReplayPPOTrainer.__new__(_ReplayPPOTrainer)
    trainer.args, trainer.strategy = args, SimpleNamespace(args=args)
    trainer.kl_ctl = AdaptiveKLController(INIT, TARGET, HORIZON)
    trainer.replay_config = ReplayConfig.from_namespace(args).for_run(10, group_size=4)
    trainer.replay = ReplayBuffer(trainer.replay_config, stored_token_columns(args))
    trainer.experience_maker = experience_maker_cls(ReplayExperienceMaker, args, replay_buffer=trainer.replay)
    trainer.experience_maker.kl_ctl = trainer.kl_ctl  # upstream's maker shares the controller's
    trainer.tokenizer = SimpleNamespace(pad_token_id=0, decode=lambda ids, **kw: ["text"])
    trainer.actor_model_group, trainer.critic_model_group = actor_group([PolicyRank(args)], 1), None
    trainer.vllm_engines = None
    trainer.tensorboard_logger = None  # upstream's `__init__`, without --logger.tensorboard_dir
    rows = args.rollout.batch_size * args.rollout.n_samples_per_prompt
    coef = INIT
    with in_process_object_store():
        for step, fresh_kl in enumerate((0.11, 0.09)):  # the replayed rows of step 1 measured 0.11
            trainer.experience_maker.make_experience = partial(forward_with_kl, kl=fresh_kl)
            status, _ = trainer.train_step(rollout_samples(8, 4, seed=step), step)
            coef *= 1 + (fresh_kl / TARGET - 1) * rows / HORIZON  # upstream's rule, on the fresh rows' KL
            assert trainer.kl_ctl.value == pytest.approx(coef, rel=1e-5), step
            assert status["kl"] == pytest.approx(fresh_kl, rel=1e-5)
    # step 1 replayed rows that measured 0.11 at generation: the controller read 0.09, not their mix
    assert status["replay/replayed"] > 0 and status["replay/kl_replay"] > 0.1


KL_LOSS = ("--algo.kl.init_coef", "0.01", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
           "--algo.kl.unbiased_gradient", "--algo.advantage.is_correction_level", "token",
           "--algo.advantage.is_correction_mode", "clip", "--algo.advantage.is_correction_gating", "ratio")
CURRENT, THETA = -2.0, -1.9  # log-probs of the current policy (the refreshed pi_old) and of pi_theta


def forward_with_reference(samples_list, seed: int = 0):
    """What upstream's `make_experience` attaches with KL as a loss: the actor's log-probs (the
    behaviour policy's, as stored for replay) and the reference's (random here), no KL in the reward."""
    g = torch.Generator().manual_seed(seed)
    for s in samples_list:
        s.action_log_probs = -torch.rand(s.action_mask.shape, generator=g) * 3
        s.base_action_log_probs = -torch.rand(s.action_mask.shape, generator=g) * 3
        s.values, s.kl = None, torch.zeros_like(s.action_log_probs)
        s.info["kl"] = torch.zeros(len(s.sequences))
        s.info["logprobs_diff"] = torch.zeros(len(s.sequences))
    return samples_list


def kl_weight_and_loss(self, experience, kl_ctl, step, loss_batch_info=None):
    """Upstream's `training_step` with the model's forward and update aside: it reads pi_old once,
    `experience.action_log_probs`, and hands it to the policy loss and, as `log_probs_old`, to the
    KL loss (upstream's own `compute_approx_kl`). Records the KL's importance weight per token (its
    gradient over k1, what `unbiased_gradient`'s surrogate w k1^2 / 2 gives) and the policy loss."""
    old = experience.action_log_probs
    log_probs = torch.full_like(old, THETA, requires_grad=True)
    kl_args = self.args.algo.kl
    kl = compute_approx_kl(log_probs, experience.base_action_log_probs, log_probs_old=old,
                           kl_estimator=kl_args.estimator, unbiased_gradient=kl_args.unbiased_gradient)
    kl.sum().backward()
    self.recorded.append((experience, log_probs.grad / (THETA - experience.base_action_log_probs),
                          self.actor_loss_fn(log_probs.detach(), old, experience.advantages,
                                             action_mask=experience.action_mask)[0]))
    return {"metrics": {}, "weights": {}}


def two_steps(make_args, experience_maker_cls, rollout_samples, off_policy: str):
    """Step 0 (warm-up) and step 1 of a run with KL as a loss; returns step 1's batch."""
    args = make_args(*KL_LOSS, "--replay.mode", "advantage", "--replay.warmup", "1", "--replay.off_policy", off_policy)
    buffer = ReplayBuffer(ReplayConfig.from_namespace(args), stored_token_columns(args))
    maker = experience_maker_cls(ReplayExperienceMaker, args, replay_buffer=buffer)
    maker.make_experience = forward_with_reference
    # the actor's forward of `_refresh_old_log_probs`: the current policy's log-probs
    maker._dispatch_forward = lambda group, sync, action_mask, **kw: [torch.full(m.shape, CURRENT) for m in action_mask]
    maker._flatten_results = lambda refs, duplicate: refs
    for step in (0, 1):
        maker.step = step
        batch = maker.make_experience_batch(rollout_samples(8, 4, seed=20 + step, rollout_log_probs=True))
    return args, buffer.config.off_policy_rule, batch


@pytest.mark.parametrize("off_policy", ["stale", "refresh", "m2po"])
def test_the_kl_loss_weighs_a_replayed_row_by_pi_theta_over_pi_behaviour(make_args, experience_maker_cls,
                                                                        rollout_samples, monkeypatch, off_policy):
    monkeypatch.setattr(ActorPPOTrainer, "training_step", kl_weight_and_loss)
    args, rule, batch = two_steps(make_args, experience_maker_cls, rollout_samples, off_policy)
    trainer = ReplayActorPPOTrainer.__new__(ReplayActorPPOTrainer)
    trainer.args, trainer.actor_loss_fn, trainer.recorded = args, PolicyLoss(0.2, 0.28), []
    trainer.enable_split_stats(kl_on_behaviour=rule.behaviour_apart_from_old)
    pi_olds = [e.action_log_probs.clone() for e in batch]
    for exp in batch:
        trainer.training_step(exp, 0.01, 0)
    replayed_tokens = 0
    for (exp, weight, loss), pi_old in zip(trainer.recorded, pi_olds):
        replayed = exp.info[REPLAYED_KEY].bool()[:, None]
        # pi_behaviour: a replayed row's stored log-probs (under refresh and m2po, what
        # `rollout_log_probs` keeps), a fresh row's pi_old (it was sampled by the policy of its step)
        behaviour = torch.where(replayed, exp.rollout_log_probs, pi_old)
        mask = exp.action_mask.bool()
        torch.testing.assert_close(weight[mask], (THETA - behaviour).exp()[mask])
        replayed_tokens += int((mask & replayed).sum())
        # the PPO ratio keeps its pi_old: the refreshed one where the rule recomputes it
        torch.testing.assert_close(loss, PolicyLoss(0.2, 0.28)(torch.full_like(pi_old, THETA), pi_old,
                                                               exp.advantages, action_mask=exp.action_mask)[0])
        assert torch.equal(exp.action_log_probs, pi_old)  # the experience is left as it came
    assert replayed_tokens > 0
    refreshed = torch.cat([(p == CURRENT)[e.info[REPLAYED_KEY].bool()].flatten() for p, e in zip(pi_olds, batch)])
    assert bool(refreshed.all()) == rule.recompute_old  # refresh and m2po: pi_old was the current policy
