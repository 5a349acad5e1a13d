"""Fixtures for the integration tests: upstream's real parser and experience-maker functions.

The one stand-in is the model forward of `make_experience` (a DeepSpeed actor in a Ray worker):
`fake_forward` fills the log-probs it would return. The full path with real models runs in
tests/pipeline (the CPU end-to-end test).
"""
from types import SimpleNamespace

import pytest
import torch

from openrlhf_replay.cli.train_ppo_ray import build_parser
from openrlhf.utils import get_strategy

PAD = SimpleNamespace(pad_token_id=0)  # the experience maker reads only the tokenizer's pad id

BASE_ARGV = [
    "--actor.model_name_or_path", "unused",
    "--algo.advantage.estimator", "group_norm",
    "--algo.kl.init_coef", "0",
    "--actor.eps_clip_low_high", "0.2", "0.28",
    "--rollout.n_samples_per_prompt", "4",
    "--rollout.batch_size", "8",
    "--rollout.micro_batch_size", "4",
    "--train.batch_size", "8",
    "--train.micro_batch_size", "2",
    "--actor.num_gpus_per_node", "1",
    "--actor.lr_scheduler", "constant_with_warmup",
]


@pytest.fixture(scope="session")
def upstream_parser():
    return build_parser(with_replay=False)


@pytest.fixture(scope="session")
def replay_parser():
    return build_parser(with_replay=True)


@pytest.fixture
def make_args(replay_parser):
    """Nested args as upstream's CLI builds them (parse + hierarchize), from BASE_ARGV + extra."""
    from openrlhf.utils.config import hierarchize

    def make(*extra):
        return hierarchize(replay_parser.parse_args(BASE_ARGV + [str(x) for x in extra]))

    return make


def make_samples(n_prompts: int, n: int, seed: int = 0, vocab: int = 50, rollout_log_probs: bool = False):
    """Per-rollout Experiences as upstream's samples generator builds them from vLLM responses
    (its own `_process_response_into_experience`), with 0/1 rewards that vary inside each group.
    `rollout_log_probs`: attach vLLM's log-probs, as upstream does with IS correction on."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    g = torch.Generator().manual_seed(seed)
    samples = []
    for p in range(n_prompts):
        prompt = torch.randint(3, vocab, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        for j in range(n):
            response = torch.randint(3, vocab, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
            reward = float(j % 2) if p % 3 else float(j == 0)  # never a zero-variance group
            samples.append(SamplesGenerator._process_response_into_experience(
                None,
                {"observation_tokens": prompt + response, "action_ranges": [(len(prompt), len(prompt) + len(response))],
                 "reward": reward, "scores": reward, "prompt": f"p{p}",
                 "rollout_log_probs": [-0.1] * (len(prompt) + len(response)) if rollout_log_probs else None,
                 "label": "1", "truncated": False, "extra_logs": {}},
                max_len=64,
            ))
    return samples


def fake_forward(samples_list, seed: int = 0):
    """What `make_experience` attaches after the actor's forward (KL off): log-probs and zero KL."""
    g = torch.Generator().manual_seed(seed)
    for s in samples_list:
        s.action_log_probs = -torch.rand(s.action_mask.shape, generator=g) * 3
        s.base_action_log_probs = None
        s.values = None
        s.kl = torch.zeros_like(s.action_log_probs)
        n = len(s.sequences)
        s.info["kl"] = torch.zeros(n)
        s.info["logprobs_diff"] = torch.zeros(n)
    return samples_list


@pytest.fixture
def experience_maker_cls():
    """Upstream's RemoteExperienceMaker (and ours) with the model forward replaced by fake_forward."""
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    def build(cls, args, **kwargs):
        from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

        maker = cls(None, None, None, None, FixedKLController(0.0), get_strategy(args), PAD, **kwargs)
        maker.make_experience = fake_forward
        return maker

    return build


def fresh_experiences(args, seed: int = 0):
    """A step's fresh Experiences with advantages, through upstream's own split + advantage code."""
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    maker = RemoteExperienceMaker(None, None, None, None, FixedKLController(0.0), get_strategy(args), PAD)
    samples = make_samples(args.rollout.batch_size, args.rollout.n_samples_per_prompt, seed)
    return maker.compute_advantages_and_returns(fake_forward(maker.split_rollout_samples(samples), seed))


@pytest.fixture
def rollout_samples():
    """make_samples, as a fixture (test modules cannot import conftest in importlib mode)."""
    return make_samples


@pytest.fixture
def fresh_batch():
    """fresh_experiences, as a fixture."""
    return fresh_experiences


class _Engines:
    """Stands for vLLM and the reward (upstream's `_dispatch_prompts_to_vllm`): a prompt's label
    says its group's scores, "0" all wrong, "1" all right, "mix" half right; counts what it generated."""

    def __init__(self, n: int) -> None:
        self.n, self.generated = n, 0

    def __call__(self, prompts, labels, *, images=None, **generate_kwargs):
        from openrlhf_replay.rehearsal.standins import _Local

        self.generated += self.n * len(prompts)
        scores = {"0": [0.0] * self.n, "1": [1.0] * self.n, "mix": [float(j % 2) for j in range(self.n)]}
        return [_Local([{"observation_tokens": [5, 6, 7, 8], "action_ranges": [(2, 4)], "reward": s, "scores": s,
                         "prompt": p, "label": label, "truncated": False, "rollout_log_probs": None,
                         "extra_logs": {}} for s in scores[label]]) for p, label in zip(prompts, labels)]


def _counting_generator(args, labels: list[str]):
    """(replay's samples generator over a loader of one prompt a batch, as upstream's, its engines):
    it generates through upstream's own `generate_samples` and `_generate_vllm` loop (filtering and
    replacement prompts); run it inside `standins.in_process_object_store()`."""
    from openrlhf_replay.trainer.ppo_utils.samples_generator import ReplaySamplesGenerator

    loader = [([i], [f"q{i}"], [label], [None]) for i, label in enumerate(labels)]
    gen = ReplaySamplesGenerator(get_strategy(args), loader, None, None, [])
    gen._dispatch_prompts_to_vllm = engines = _Engines(args.rollout.n_samples_per_prompt)
    return gen, engines


@pytest.fixture
def counting_generator():
    """_counting_generator, as a fixture."""
    return _counting_generator
