"""What `replay_core.py` measures, shared by its two processes (the project's store here, TorchRL's
in `replay_core_torchrl.py`): the workload of rollout steps, the store settings compared, and the
fingerprints both sides print so that a run can check they saw the same data. Numpy only."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `replay` importable (the TorchRL side needs only numpy)
    sys.path.insert(0, str(ROOT))

from replay.composer import group_normalise  # noqa: E402  (numpy only, as the TorchRL side needs)

TORCHRL_STORAGES = ("list", "padded")
"""The TorchRL setups `--torchrl-storage` chooses from (`replay_core_torchrl.TORCHRL_SETUPS`)."""


# ------------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class Workload:
    """The synthetic GRPO workload, identical on both sides."""

    # One setting a line, as every config dataclass here: runs of them share a shape, not content.

    groups_per_step: int = 128
    """prompts per step"""
    group_size: int = 8
    """rollouts per prompt"""
    prompt_mean: float = 128.0
    """mean prompt length (tokens) of the lognormal before clipping"""
    prompt_sigma: float = 0.5
    prompt_clip: tuple[int, int] = (16, 1024)
    response_mean: float = 1024.0
    """mean response length (tokens) of the lognormal before clipping"""
    response_sigma: float = 0.7
    response_clip: tuple[int, int] = (16, 4096)
    draw: int = 512
    """rollouts drawn (and gathered) per step"""
    alpha: float = 0.5
    """priority exponent: p = (|A| + eps) ** alpha"""
    eps: float = 1e-6
    beta: float = 0.4
    """TorchRL's importance-weight exponent (its buffer requires one; the core's advantage sampler has none)"""
    vocab: int = 151_936
    seed: int = 0
    kl_column: str | None = None
    """the per-token column KL adds to every rollout (`KL_COLUMNS`; None: KL off)"""

    @property
    def rollouts_per_step(self) -> int:
        return self.groups_per_step * self.group_size


@dataclass(frozen=True)
class StoreConfig:
    name: str
    capacity: int
    """rollouts held at most"""
    max_age: int | None
    """steps a rollout may age before eviction (None: no limit)"""

    def steady_live(self, per_step: int) -> int:
        """Live rollouts at steady state (every step inserts `per_step`)."""
        if self.max_age is None:
            return self.capacity
        return min(self.capacity, (self.max_age + 1) * per_step)

    def warmup_steps(self, per_step: int) -> int:
        """Steps until the store is at steady state, plus two (allocator and caches settle)."""
        return math.ceil(self.steady_live(per_step) / per_step) + 2


FULL_SIZE = (Workload(), {"full": StoreConfig("full", 30_000, None), "paper": StoreConfig("paper", 30_000, 10)})
QUICK_SIZE = (
    Workload(groups_per_step=16, prompt_mean=32.0, prompt_clip=(8, 128), response_mean=128.0,
             response_clip=(8, 512), draw=64),
    {"full": StoreConfig("full", 1_000, None), "paper": StoreConfig("paper", 1_000, 3)},
)


# ------------------------------------------------------------------------------ workload


def _lognormal_lengths(rng: np.random.Generator, mean: float, sigma: float, clip: tuple[int, int],
                       n: int) -> np.ndarray:
    mu = math.log(mean) - sigma * sigma / 2  # so that the (unclipped) mean is `mean`
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), *clip).astype(np.int64)


# --kl: the optional per-token column the run's KL adds to every stored rollout (None: KL off).
KL_COLUMNS = {"off": None, "reward": "token_advantages", "loss": "ref_logprobs"}


def make_step(w: Workload, step: int) -> dict[str, np.ndarray]:
    """The fresh rollouts of `step` as RolloutBatch fields (flat, columnar), from (seed, step) alone."""
    rng = np.random.default_rng([w.seed, step])
    g, s, n = w.groups_per_step, w.group_size, w.rollouts_per_step
    group = np.repeat(np.arange(g), s)  # (n,)
    p_len = _lognormal_lengths(rng, w.prompt_mean, w.prompt_sigma, w.prompt_clip, g)  # (g,)
    r_len = _lognormal_lengths(rng, w.response_mean, w.response_sigma, w.response_clip, n)  # (n,)
    prompts = rng.integers(0, w.vocab, int(p_len.sum()), dtype=np.int32)
    p_off = np.r_[0, np.cumsum(p_len)]
    # The 8 rollouts of a group share their prompt; each stores its own copy (as OpenRLHF does).
    prompt_ids = np.concatenate([prompts[p_off[j]:p_off[j + 1]] for j in group.tolist()])
    n_resp = int(r_len.sum())
    rewards = (rng.random(n) < np.repeat(rng.random(g), s)).astype(np.float32)
    kl = {w.kl_column: -rng.exponential(size=n_resp).astype(np.float32)} if w.kl_column else {}
    return kl | {
        "prompt_ids": prompt_ids,
        "prompt_offsets": np.r_[0, np.cumsum(p_len[group])].astype(np.int64),
        "response_ids": rng.integers(0, w.vocab, n_resp, dtype=np.int32),
        "response_offsets": np.r_[0, np.cumsum(r_len)].astype(np.int64),
        "action_mask": np.ones(n_resp, np.bool_),
        "behaviour_logprobs": -rng.exponential(size=n_resp).astype(np.float32),
        "rewards": rewards,
        "advantages": group_normalise(rewards, group),
        "prompt_uids": (group + step * g).astype(np.int64),
        "group_ids": group.astype(np.int64),
        "versions": np.full(n, step, np.int64),
        "reuse_counts": np.zeros(n, np.int32),
    }


def checksum(fields: dict[str, np.ndarray]) -> int:
    """Cheap fingerprint of a step's workload, compared across the two processes."""
    total = 0
    for k in ("prompt_ids", "response_ids", "response_offsets", "behaviour_logprobs", "advantages"):
        a = fields[k]
        total = (total * 1_000_003 + int(np.frombuffer(a.tobytes()[::97], np.uint8).sum()) + a.size) % (1 << 61)
    return total


def payload_bytes(n_prompt_tokens: int, n_response_tokens: int) -> int:
    """int32 ids of prompt and response tokens + float32 log-probs of response tokens."""
    return 4 * n_prompt_tokens + 8 * n_response_tokens


def describe(out: dict) -> dict[str, str]:
    """What was gathered: name -> dtype (compared across the two sides)."""
    return {k: str(v.dtype).removeprefix("torch.") for k, v in out.items()}
