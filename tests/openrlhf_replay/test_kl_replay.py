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
