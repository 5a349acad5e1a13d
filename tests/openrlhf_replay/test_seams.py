"""The upstream seams this integration relies on (OpenRLHF 0.11.2): if an upgrade moves one, this
fails here, with the seam's name, instead of deep inside a Ray worker."""
import importlib.metadata
import inspect

import pytest
from openrlhf.models import PolicyLoss
from openrlhf.trainer.ppo_trainer import BasePPOTrainer, PPOTrainer
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from openrlhf.trainer.ray.launcher import RayActorGroup
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor
from openrlhf.trainer.ray.ppo_critic import CriticModelActor, CriticPPOTrainer
from openrlhf.utils.logging_utils import TensorboardLogger

from openrlhf_replay import OPENRLHF_VERSION
from openrlhf_replay.utils import undecorated

SEAMS = [
    (BasePPOTrainer.train_step, ["self", "rollout_samples", "global_step"]),
    (BasePPOTrainer._compute_rollout_stats, ["self", "experiences"]),
    (BasePPOTrainer.save_logs_and_checkpoints, ["self", "global_step", "logs_dict", "client_states"]),
    (BasePPOTrainer.init_checkpoint_states, ["self"]),
    (undecorated(PPOTrainer).get_max_steps, ["self"]),
    (undecorated(PPOTrainer).__init__, ["self", "pretrain", "strategy", "actor_model_group", "critic_model_group",
                                        "reward_model_group", "reference_model_group", "vllm_engines", "generate_kwargs"]),
    (RemoteExperienceMaker.__init__, ["self", "actor_model_group", "critic_model_group", "reward_model_group",
                                      "initial_model_group", "kl_controller", "strategy", "tokenizer", "kwargs"]),
    (RemoteExperienceMaker.make_experience_batch, ["self", "rollout_samples"]),
    (RemoteExperienceMaker._dispatch_forward, ["self", "group", "sync_condition", "kwargs"]),
    (RemoteExperienceMaker._flatten_results, ["self", "refs", "duplicate_factor"]),
    (ActorPPOTrainer.training_step, ["self", "experience", "kl_ctl", "step", "loss_batch_info"]),
    (undecorated(PolicyModelActor).init_model_from_pretrained, ["self", "strategy", "pretrain", "max_steps",
                                                                "vllm_engines"]),
    (PolicyLoss.forward, ["self", "log_probs", "old_log_probs", "advantages", "action_mask", "rollout_log_probs",
                          "dp_size", "batch_num_tokens", "global_batch_size"]),
    (RayActorGroup.async_run_method_batch, ["self", "method_name", "kwargs"]),
    # counting generation where it runs (trainer/ppo_utils/samples_generator.py)
    (SamplesGenerator.generate_samples, ["self", "generate_kwargs"]),
    (SamplesGenerator._generate_vllm, ["self", "dataloader_iter", "num_prompts", "dynamic_filtering",
                                       "generate_kwargs"]),
    # PPO with a critic (trainer/ppo_utils/critic.py, trainer/ray/ppo_critic.py)
    (RemoteExperienceMaker.get_advantages_and_returns, ["self", "values", "rewards", "action_mask", "gamma", "lambd"]),
    (CriticPPOTrainer.training_step, ["self", "experience", "step", "loss_batch_info"]),
    (undecorated(CriticModelActor).init_model_from_pretrained, ["self", "strategy", "pretrain", "max_steps"]),
    (undecorated(CriticModelActor).append, ["self", "experience"]),
    (undecorated(CriticModelActor).fit, ["self"]),
    # the step's histograms (openrlhf_replay/logging_utils.py)
    (TensorboardLogger.log_train, ["self", "global_step", "logs_dict"]),
]


def test_pinned_openrlhf_is_installed():
    assert importlib.metadata.version("openrlhf") == OPENRLHF_VERSION


@pytest.mark.parametrize("func, params", SEAMS, ids=lambda x: getattr(x, "__qualname__", ""))
def test_seam_signature(func, params):
    # Ray's actor decorator adds a `_ray_trace_ctx` parameter to the methods it wraps
    assert [p for p in inspect.signature(func).parameters if p != "_ray_trace_ctx"] == params


def test_sources_still_have_the_assumptions_the_seams_make():
    import openrlhf.cli.train_ppo_ray as cli

    src = inspect.getsource(cli)
    # parser inline under __main__, nested by hierarchize, trainer imported inside train()
    assert "args = parser.parse_args()" in src and "args = hierarchize(args)" in src
    assert "from openrlhf.trainer.ppo_trainer import PPOTrainer" in inspect.getsource(cli.train)
    assert "PolicyModelActor," in inspect.getsource(cli.train)
    assert "CriticModelActor," in inspect.getsource(cli.train)  # bound from its module when the CLI runs
    # the experience maker is built in BasePPOTrainer.__init__ and used by train_step
    assert "self.experience_maker = RemoteExperienceMaker(" in inspect.getsource(BasePPOTrainer.__init__)
    assert "self.experience_maker.make_experience_batch(rollout_samples)" in inspect.getsource(BasePPOTrainer.train_step)
    # the actor's trainer and its loss are plain attributes set once
    init = inspect.getsource(undecorated(PolicyModelActor).init_model_from_pretrained)
    assert "self.trainer = ActorPPOTrainer(" in init
    # the LR scheduler the replay actor paces: built by prepare, its checkpoint state loaded before
    # init returns (so a saved position is there when it is paced), the trainer's the same object
    assert init.index("self.actor, self.actor_optim, self.actor_scheduler = strategy.prepare(") < init.index(
        "strategy.load_ckpt(") < init.index("actor_scheduler=self.actor_scheduler,")
    assert "self.actor_loss_fn = PolicyLoss(" in inspect.getsource(ActorPPOTrainer.__init__)
    # KL with replay: the controller reads `kl` from what ppo_train returns (split by kind there),
    # and the actor reads pi_old once, for the ratio and the KL's weight (`behaviour_weighted_kl`)
    step = inspect.getsource(BasePPOTrainer.train_step)
    assert step.index("status = self.ppo_train(global_step)") < step.index('if "kl" in status:')
    train = inspect.getsource(ActorPPOTrainer.training_step)
    assert train.count("experience.action_log_probs") == 1
    assert "old_action_log_probs = experience.action_log_probs" in train
    assert "log_probs_old=old_action_log_probs" in train
    # the controller's TensorBoard logger: built once, written by save_logs_and_checkpoints through
    # log_train only, into the writer the histograms share
    assert "self.tensorboard_logger = TensorboardLogger(self.args)" in inspect.getsource(BasePPOTrainer.__init__)
    assert "self.tensorboard_logger.log_train(global_step, logs_dict)" in inspect.getsource(
        BasePPOTrainer.save_logs_and_checkpoints)
    assert "self.writer = SummaryWriter(" in inspect.getsource(TensorboardLogger.__init__)
