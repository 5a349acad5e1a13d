"""KL as a loss: store the reference log-probs with each rollout, or recompute them for the replayed
rows? Prints both costs per replayed response token on this machine (docs/METHOD.md section 2, "KL").

- store: the column's bytes (4 per response token, held for the rollout's life) and the time the
  store spends copying it in on insertion and out on a draw (`RolloutStore.insert` + `gather`
  with and without the column, on the same rollouts);
- recompute: a forward of the reference model (upstream's `Actor`, as `ReferenceModelActor` runs
  it, fp32 on this CPU) over replayed micro-batches, per response token.

    python benchmarks/kl_ref_cost.py [--models tiny,smollm2]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from infra.hardware import cpu_description
from infra.models import build_tiny_qwen3, default_cache_dir, prepare_smollm2
from replay.keep import EVERYTHING
from replay.store import RolloutStore
from replay.testing import random_batch

ROWS, PROMPT, RESPONSE = 8, 64, 448  # one micro-batch of replayed rows


def store_cost_us_per_token(reps: int = 5) -> float:
    """Extra insert + gather time of the ref_logprobs column, microseconds per response token."""
    rng = np.random.default_rng(0)
    batch = random_batch(rng, 128, 8, version=0, response_len=(256, 2048))
    with_ref = batch.replace(ref_logprobs=batch.behaviour_logprobs.copy())
    times = {}
    for name, b, cols in (("plain", batch, ()), ("ref", with_ref, ("ref_logprobs",))):
        best = float("inf")
        for _ in range(reps):
            store = RolloutStore(100_000, None, keep=EVERYTHING, token_columns=cols)
            t0 = time.perf_counter()
            store.insert(b, version=0)
            store.gather(np.arange(0, len(store), 2))  # half of them replayed
            best = min(best, time.perf_counter() - t0)
        times[name] = best
    tokens = len(batch.response_ids) * 1.5  # inserted + gathered response tokens
    return (times["ref"] - times["plain"]) / tokens * 1e6


@torch.no_grad()
def recompute_us_per_token(path, reps: int = 3) -> tuple[float, int]:
    from openrlhf.models import Actor

    ref = Actor(str(path), attn_implementation="sdpa").float().eval()
    params = sum(p.numel() for p in ref.parameters())
    vocab = ref.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    seqs = torch.randint(3, vocab, (ROWS, PROMPT + RESPONSE), generator=g)
    attention = torch.ones_like(seqs)
    action = torch.zeros(ROWS, PROMPT + RESPONSE - 1, dtype=torch.bool)
    action[:, PROMPT - 1:] = True
    ref(seqs, action, attention)  # warm-up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        ref(seqs, action, attention)
        best = min(best, time.perf_counter() - t0)
    return best / (ROWS * RESPONSE) * 1e6, params


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny,smollm2", help="comma-separated subset of tiny,smollm2")
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"CPU: {cpu_description()}, torch threads {torch.get_num_threads()}")
    print(f"store: 4 bytes per response token held; copying it in and out {store_cost_us_per_token():.4f} us/token")
    builders = {"tiny": lambda: build_tiny_qwen3(default_cache_dir() / "tiny-qwen3"), "smollm2": prepare_smollm2}
    for name in args.models.split(","):
        us, params = recompute_us_per_token(builders[name]())
        print(f"recompute ({name}, {params / 1e6:.1f}M parameters, fp32, {ROWS} rows x {PROMPT} + {RESPONSE} "
              f"tokens): {us:.1f} us per replayed response token")


if __name__ == "__main__":
    main()
