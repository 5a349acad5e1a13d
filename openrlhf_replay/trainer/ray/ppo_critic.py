"""The critic's training actor with replay: it trains on replayed rows as on fresh ones, and says so.

Upstream's controller hands the critic group the same Experience list as the policy actors
(`PPOTrainer.train_step`, `append`), replayed rows included, each with the current critic's values
and the returns recomputed from its stored rewards (`ppo_utils/critic.py`). What replay changes
for the critic is what it changes for the policy actor (`ppo_actor.py`):

- its LR schedule (upstream's default for the critic is `cosine_with_min_lr`) is sized from the
  fresh batches, so it follows rollout steps (`lr_schedule.py`), or it would run past its end,
  paced by the policy actor's own rule (`experience.py:paced_rows`), so the two schedules agree;
- with dynamic batching it packs every row it holds (`dynamic_batch.py`), none dropped;
- it reports the rows that reached its loss by kind, summed over its ranks
  (`replay/critic_trained_rows_{fresh,replayed}`), and its optimizer steps' spread over its ranks.

Seams (OpenRLHF 0.11.2): `CriticModelActor.init_model_from_pretrained` builds `self.trainer`
(its class switched to the subclass below) and `self.critic_scheduler` (paced in place); `append`
and `fit` are wrapped; `CriticPPOTrainer.training_step` is wrapped.
"""
from __future__ import annotations

import ray
from openrlhf.trainer.ray.ppo_critic import CriticModelActor, CriticPPOTrainer

from openrlhf_replay.trainer.lr_schedule import RolloutPacedLR, pace_by_rollout_steps
from openrlhf_replay.trainer.ppo_utils.experience import REPLAYED_KEY, paced_rows
from openrlhf_replay.trainer.ray.dynamic_batch import AllRowsReplayBuffer
from openrlhf_replay.trainer.ray.ppo_actor import TRAINED_KINDS, count_trained_rows, rank_spread
from openrlhf_replay.utils import undecorated
from replay import ReplayConfig


class ReplayCriticPPOTrainer(CriticPPOTrainer):
    """`CriticPPOTrainer` that counts the rows reaching its loss, by kind."""

    trained_rows: dict

    def training_step(self, experience, step, loss_batch_info=None):
        status = super().training_step(experience, step, loss_batch_info)
        if REPLAYED_KEY in experience.info:
            count_trained_rows(self.trained_rows, experience.info)
        return status


class _ReplayCriticModelActor(undecorated(CriticModelActor)):
    def init_model_from_pretrained(self, strategy, pretrain, max_steps):
        super().init_model_from_pretrained(strategy, pretrain, max_steps)
        self._rows = {"fresh_rows": 0, "rows": 0}
        if ReplayConfig.from_namespace(strategy.args).enabled:
            self.trainer.__class__ = ReplayCriticPPOTrainer  # upstream builds it inline
            self.trainer.trained_rows = dict.fromkeys(TRAINED_KINDS, 0)
            pace_by_rollout_steps(self.critic_scheduler)  # after upstream has loaded a checkpoint's state
            if strategy.args.train.dynamic_batch_enable:
                self.trainer.replay_buffer.__class__ = AllRowsReplayBuffer

    def append(self, experience):
        self._rows["rows"] += len(experience.sequences)
        self._rows["fresh_rows"] += paced_rows(experience)  # the policy actor's rule, so the schedules agree
        super().append(experience)

    def fit(self):
        engine = self.critic  # the DeepSpeed engine itself (upstream's `prepare` of a non-Actor model)
        steps_before = engine.global_steps
        if isinstance(self.critic_scheduler, RolloutPacedLR):  # the same share on every rank
            rows = self.strategy.all_reduce(dict(self._rows), op="sum")
            self.critic_scheduler.pace(round(rows["fresh_rows"]), round(rows["rows"]))
        status = super().fit()
        trained = getattr(self.trainer, "trained_rows", None)
        if trained is not None:
            sums = self.strategy.all_reduce({k: float(n) for k, n in trained.items()}, op="sum")
            status.update({f"replay/critic_trained_rows_{k}": v for k, v in sums.items() if k != "inert"})
            status.update(rank_spread(self.strategy, {"critic_optimizer_steps": engine.global_steps - steps_before}))
            self.trainer.trained_rows = dict.fromkeys(trained, 0)
        self._rows = dict.fromkeys(self._rows, 0)
        return status


ReplayCriticModelActor = ray.remote(num_gpus=1)(_ReplayCriticModelActor)
