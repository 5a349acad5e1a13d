"""PPO with a critic (`gae`) and replay (docs/METHOD.md section 2, "A critic"), through upstream's
real experience-maker code: a replayed row's values are the current critic's, and its advantages
and returns are GAE on its stored per-token rewards (KL penalty included) and those values,
whitened with the step's fresh statistics. Checked against GAE computed by hand.

Stand-ins: the model forwards (a DeepSpeed actor and critic in Ray workers): the actor's log-probs
and KL as in test_experience_kl.py, and a critic whose value of a column is a fixed function of
the tokens up to it, so a test can compute it again. The real critic runs in
tests/pipeline/test_cpu_pipeline.py."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from openrlhf.models.utils import compute_approx_kl, masked_mean
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.utils import get_strategy

from openrlhf_replay.trainer.ppo_utils.critic import Whitening
from openrlhf_replay.trainer.ppo_utils.experience import REPLAYED_KEY, stored_token_columns
from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker
from replay import ReplayBuffer, ReplayConfig

PAD = SimpleNamespace(pad_token_id=0)
COEF, GAMMA, LAMBD = 0.05, 0.9, 0.8


def critic_values(sequences, action_mask, scale: float) -> torch.Tensor:
    """(B, T - 1) a stand-in critic: column j's value depends on tokens 0..j only, as a causal
    model's does; `scale` plays the critic's weights (another scale: a trained critic)."""
    prefix = sequences[:, :-1].float().cumsum(-1)
    return torch.sin(prefix * 0.1) * scale * action_mask.float()


class Maker(ReplayExperienceMaker):
    """The real experience maker, its model forwards replaced (module docstring)."""

    critic_scale = 1.0

    def make_experience(self, samples_list):
        g = torch.Generator().manual_seed(7 + len(self.forwards))
        for s in samples_list:
            s.action_log_probs = -torch.rand(s.action_mask.shape, generator=g) * 3
            base = -torch.rand(s.action_mask.shape, generator=g) * 3
            s.kl = compute_approx_kl(s.action_log_probs, base, kl_estimator="k1")
            s.base_action_log_probs = None
            s.values = critic_values(s.sequences, s.action_mask, self.critic_scale)
            s.info["kl"] = masked_mean(s.kl, s.action_mask, dim=-1)
            s.info["logprobs_diff"] = torch.zeros(len(s.sequences))
            self.forwards.append((s.sequences.clone(), s.kl.clone(), s.action_mask.clone()))
        return samples_list

    def _dispatch_forward(self, group, sync_condition, **kw):
        assert group is self.critic_model_group  # only the critic is asked for replayed rows
        return [critic_values(s, m, self.critic_scale) for s, m in zip(kw["sequences"], kw["action_mask"])]

    def _flatten_results(self, refs, duplicate_factor):
        return refs


@pytest.fixture
def maker(make_args):
    args = make_args("--replay.mode", "advantage", "--replay.warmup", "0", "--algo.advantage.estimator", "gae",
                     "--critic.num_gpus_per_node", "1", "--rollout.n_samples_per_prompt", "1",
                     "--algo.kl.init_coef", str(COEF), "--algo.advantage.gamma", str(GAMMA),
                     "--algo.advantage.lambd", str(LAMBD))
    columns = stored_token_columns(args)
    assert columns == ("token_rewards",)  # KL in the reward lives inside the per-token reward
    m = Maker(None, "critic-group", None, None, FixedKLController(COEF), get_strategy(args), PAD,
              replay_buffer=ReplayBuffer(ReplayConfig.from_namespace(args), columns))
    m.forwards = []
    return m


def hand_gae(rewards: np.ndarray, values: np.ndarray) -> np.ndarray:
    """GAE over one response's action tokens, by the textbook recursion (value 0 after the end)."""
    adv, last = np.zeros(len(rewards)), 0.0
    for t in reversed(range(len(rewards))):
        nxt = values[t + 1] if t + 1 < len(rewards) else 0.0
        last = rewards[t] + GAMMA * nxt - values[t] + GAMMA * LAMBD * last
        adv[t] = last
    return adv


def by_sequence(maker, outcome_of):
    """{sequence: (per-token rewards, action columns)} for every row of the maker's forwards so far,
    by hand: the outcome on the last action token, -COEF x KL on every action token."""
    out = {}
    for sequences, kl, mask in maker.forwards:
        for i in range(len(sequences)):
            cols = np.flatnonzero(mask[i].numpy())
            seq = tuple(sequences[i][: cols[-1] + 2].tolist())
            r = -COEF * kl[i].numpy()[cols]
            r[-1] += outcome_of[seq]
            out[seq] = (r, cols)
    return out


def test_a_replayed_row_trains_on_gae_of_its_stored_rewards_and_the_current_critic(maker, rollout_samples):
    step0 = rollout_samples(8, 1, seed=1)
    outcome = {}
    for s in step0:
        n = int(s.attention_mask.sum())
        outcome[tuple(s.sequences[0][:n].tolist())] = float(s.rewards[0])
    maker.step = 0
    maker.make_experience_batch(step0)
    # Groups of one (PPO's n = 1): GAE's advantages are not a group's, so every rollout is stored.
    assert len(maker.replay) == 8
    maker.critic_scale = 3.0  # the critic trained between the steps
    step1 = rollout_samples(8, 1, seed=2)
    for s in step1:
        n = int(s.attention_mask.sum())
        outcome[tuple(s.sequences[0][:n].tolist())] = float(s.rewards[0])
    maker.step = 1
    batch = maker.make_experience_batch(step1)
    stored = by_sequence(maker, outcome)

    fresh_raw, fresh_masks, replayed = [], [], []
    for exp in batch:
        for i in range(len(exp.sequences)):
            n = int(exp.attention_mask[i].sum())
            seq = tuple(exp.sequences[i][:n].tolist())
            rewards, cols = stored[seq]
            values = critic_values(exp.sequences[i : i + 1], exp.action_mask[i : i + 1], 3.0)[0].numpy()[cols]
            raw = hand_gae(rewards, values)
            if float(exp.info[REPLAYED_KEY][i]):
                replayed.append((exp, i, cols, raw, values))
            else:
                fresh_raw.append(raw)
                fresh_masks.append(cols)
    assert len(replayed) == 8 and len(fresh_raw) == 8
    flat = np.concatenate(fresh_raw)
    mean, rstd = flat.mean(), 1 / np.sqrt(max(flat.var(), 1e-8))  # upstream's whitening, by hand
    for exp, i, cols, raw, values in replayed:
        np.testing.assert_allclose(exp.values[i].numpy()[cols], values, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(exp.returns[i].numpy()[cols], raw + values, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(exp.advantages[i].numpy()[cols], (raw - mean) * rstd, rtol=1e-4, atol=1e-4)
        assert exp.values[i].abs().sum() > 0 and exp.returns[i].abs().sum() > 0
    # The fresh rows are upstream's: whitened with the same statistics.
    for exp in batch:
        for i in range(len(exp.sequences)):
            if not float(exp.info[REPLAYED_KEY][i]):
                n = int(exp.attention_mask[i].sum())
                rewards, cols = stored[tuple(exp.sequences[i][:n].tolist())]
                values = exp.values[i].numpy()[cols]
                want = (hand_gae(rewards, values) - mean) * rstd
                np.testing.assert_allclose(exp.advantages[i].numpy()[cols], want, rtol=1e-4, atol=1e-4)


def test_the_store_holds_the_per_token_reward_and_gae_priority(maker, rollout_samples):
    """What enters the buffer: the per-token reward upstream's GAE received (outcome on the last
    action token, the KL penalty on every one) and, as the rollout's |A|, the whitened GAE
    advantage of its first action token."""
    samples = rollout_samples(8, 1, seed=3)
    outcome = {tuple(s.sequences[0][: int(s.attention_mask.sum())].tolist()): float(s.rewards[0]) for s in samples}
    maker.step = 0
    fresh = maker.make_experience_batch(samples)
    want = by_sequence(maker, outcome)
    firsts = {}
    for exp in fresh:
        for i in range(len(exp.sequences)):
            n = int(exp.attention_mask[i].sum())
            cols = np.flatnonzero(exp.action_mask[i].numpy())
            firsts[tuple(exp.sequences[i][:n].tolist())] = float(exp.advantages[i][cols[0]])
    batch = maker.replay.store.gather(np.arange(len(maker.replay)))
    assert len(batch) == 8
    assert batch.token_rewards is not None and batch.token_advantages is None
    for j in range(len(batch)):
        seq = tuple(np.r_[batch.prompt(j), batch.response(j)].tolist())
        r = batch.token_rewards[batch.response_offsets[j]:batch.response_offsets[j + 1]]
        np.testing.assert_allclose(r, want[seq][0], rtol=1e-5, atol=1e-6)
        assert batch.advantages[j] == pytest.approx(firsts[seq], rel=1e-5, abs=1e-6)


def test_whitening_statistics_reproduce_upstreams(make_args):
    """`Whitening.of` on the raw GAE advantages gives exactly upstream's whitened output."""
    from openrlhf_replay.trainer.ppo_utils.critic import GaeCall

    g = torch.Generator().manual_seed(0)
    calls = []
    for _ in range(3):
        mask = torch.rand(4, 9, generator=g) > 0.3
        calls.append(GaeCall(torch.zeros(4, 9), torch.randn(4, 9, generator=g) * 2 + 0.5, mask))
    for no_std in (False, True):
        w = Whitening.of(calls, no_std)
        tokens = torch.cat([c.advantages[c.action_mask] for c in calls])
        assert w.mean == pytest.approx(float(tokens.mean()), rel=1e-6)
        assert w.rstd == (1.0 if no_std else pytest.approx(float(1 / tokens.var(unbiased=False).sqrt()), rel=1e-5))
