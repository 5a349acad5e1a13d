"""KL as a loss stores the reference model's log-probs with each rollout instead of recomputing
them for replayed rows (docs/METHOD.md section 2, "KL"). The reference model is frozen, so the two
must agree: checked here on a real model (a random Qwen3 run by upstream's `Actor`, the reference
model's own class), a replayed row re-padded into another micro-batch than it was generated in."""
from types import SimpleNamespace

import numpy as np
import torch
from openrlhf.models import Actor
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.utils import get_strategy

from infra.models import build_tiny_qwen3
from openrlhf_replay.trainer.ppo_utils.experience import experiences_to_rollouts, rollouts_to_experiences
from replay import ReplayBuffer, ReplayConfig

PAD = SimpleNamespace(pad_token_id=0)


def reference(path) -> Actor:
    """The reference model as `ReferenceModelActor` builds it, in fp32 (this test's tolerance)."""
    return Actor(str(path), attn_implementation="sdpa").float().eval()


@torch.no_grad()
def ref_forward(ref: Actor, exp) -> torch.Tensor:
    """`ReferenceModelActor.forward` without its device moves."""
    return ref(exp.sequences, exp.action_mask, exp.attention_mask)


def test_stored_reference_log_probs_equal_a_recompute_on_the_replayed_rows(tmp_path, make_args, rollout_samples):
    path = build_tiny_qwen3(tmp_path / "ref", corpus=["Natalia sold 48 clips; the answer is 72."] * 40,
                            vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=32, intermediate_size=128)
    ref = reference(path)
    args = make_args("--algo.kl.init_coef", "0.001", "--algo.kl.use_loss", "--algo.kl.estimator", "k3")
    maker = RemoteExperienceMaker(None, None, None, None, FixedKLController(0.001), get_strategy(args), PAD)
    fresh = maker.split_rollout_samples(rollout_samples(8, 4, seed=3, vocab=250))
    g = torch.Generator().manual_seed(0)
    for exp in fresh:  # what make_experience attaches with KL as a loss: the reference's log-probs
        exp.action_log_probs = -torch.rand(exp.action_mask.shape, generator=g)
        exp.base_action_log_probs = ref_forward(ref, exp)
        exp.values, exp.kl = None, torch.zeros_like(exp.action_log_probs)
        exp.info["kl"] = exp.info["logprobs_diff"] = torch.zeros(len(exp.sequences))
    fresh = maker.compute_advantages_and_returns(fresh)

    buf = ReplayBuffer(ReplayConfig(mode="advantage", warmup=0), ("ref_logprobs",))
    buf.step(experiences_to_rollouts(fresh, 0, 4, token_columns=("ref_logprobs",)), 0)
    stored = buf.store.gather(np.random.default_rng(0).permutation(len(buf.store)))  # other neighbours, widths
    replayed = rollouts_to_experiences(stored, fresh[0], 3, 0, step=1)

    compared = 0
    for exp in replayed:
        recomputed = ref_forward(ref, exp)
        mask = exp.action_mask.bool()
        assert mask.any()
        torch.testing.assert_close(exp.base_action_log_probs[mask], recomputed[mask], atol=1e-5, rtol=1e-5)
        compared += int(mask.sum())
    assert compared == int(stored.action_mask.sum())
