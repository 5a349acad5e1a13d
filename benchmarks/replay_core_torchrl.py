"""The TorchRL side of `replay_core.py`: the same replay step on TorchRL's `PrioritizedReplayBuffer`
(`TorchRLList`: a `ListStorage` of per-rollout tensors; `TorchRLPadded`: a `LazyTensorStorage`
padded to the longest rollout), served to the driver over a pipe (`serve_torchrl`). It runs in
its own process, with .venv-torchrl's interpreter (`replay_core.py --side torchrl` starts it).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import ctypes
import gc
import tracemalloc

import numpy as np
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ListStorage, PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer

from replay_core_workload import FULL_SIZE, QUICK_SIZE, TORCHRL_STORAGES, StoreConfig, Workload, checksum, describe, make_step

def _identity(items):
    return items


class TorchRLList:
    """TorchRL as a user would set it up for variable-length rollouts: `PrioritizedReplayBuffer`
    over a `ListStorage` of per-rollout tensors (alpha, eps as the workload; beta 0.4), priority
    |A| set with `update_priority` after each `extend` (TorchRL stores (|A| + eps) ** alpha, the
    core's priority), sampling with its compiled sum tree.

    Why a ListStorage: rollouts differ in length (16 .. 4,096 tokens) and a `LazyTensorStorage`
    needs one shape, i.e. every rollout padded to 1,024 prompt + 4,096 response tokens: ~36 B per
    stored token instead of ~9, and 3-5x slower steps here (`--torchrl-storage padded`). The
    list holds the payload plus one tuple and four tensor objects per rollout.

    Differences a user cannot avoid: TorchRL's prioritized sampler draws with replacement (it has
    no without-replacement variant: a few of the 512 are repeats), and it has no age-based
    eviction: for `paper` its ring buffer holds (max_age + 1) x rollouts per step, which is exact
    here because every step inserts the same number.

    Its timed insert starts, like the core's, from the step's packed batch (torch views of the
    flat arrays, made before timing) and includes splitting it into the per-rollout tensors the
    list holds (views, no copy), which a user must do to insert a batch; the core's timed insert
    likewise includes its own copy of the batch.
    """

    def __init__(self, cfg: StoreConfig, w: Workload) -> None:
        self.w = w
        self.capacity = cfg.steady_live(w.rollouts_per_step)
        self.rb = PrioritizedReplayBuffer(alpha=w.alpha, beta=w.beta, eps=w.eps, storage=ListStorage(self.capacity),
                                          collate_fn=_identity)
        self.rb.set_rng(torch.Generator().manual_seed(w.seed))

    def prepare(self, fields: dict[str, np.ndarray]):
        return _packed_tensors(fields)

    def step(self, t, step: int) -> tuple[dict[str, float], dict]:
        c0, t0 = time.process_time(), time.perf_counter()
        p_len, r_len = t["prompt_offsets"].diff().tolist(), t["response_offsets"].diff().tolist()
        items = [tuple(p) for p in zip(t["prompt_ids"].split(p_len), t["response_ids"].split(r_len),
                                       t["behaviour_logprobs"].split(r_len), t["action_mask"].split(r_len),
                                       t["advantages"].tolist())]
        index = self.rb.extend(items)
        self.rb.update_priority(index, t["advantages"].abs())
        t1 = time.perf_counter()
        drawn, info = self.rb.sample(self.w.draw, return_info=True)
        t2 = time.perf_counter()
        prompts, responses, logprobs, masks, advantages = zip(*drawn)
        out = {
            "prompt_ids": torch.cat(prompts),
            "prompt_offsets": _offsets_of(prompts),
            "response_ids": torch.cat(responses),
            "response_offsets": _offsets_of(responses),
            "behaviour_logprobs": torch.cat(logprobs),
            "action_mask": torch.cat(masks),
            "advantages": torch.tensor(advantages, dtype=torch.float32),
        }
        t3, c3 = time.perf_counter(), time.process_time()
        ms = {"step_ms": t3 - t0, "insert_ms": t1 - t0, "draw_ms": t2 - t1, "gather_ms": t3 - t2, "step_cpu_ms": c3 - c0}
        ms = {k: v * 1e3 for k, v in ms.items()}
        ms["repeats"] = len(info["index"]) - len(np.unique(np.asarray(info["index"])))
        return ms, out

    def __len__(self) -> int:
        return len(self.rb)

    def memory(self) -> dict[str, float]:
        """Bytes of the tensors the storage holds (each underlying storage once, so a step's
        storage counts whole while any of its rollouts is live), plus the two priority trees,
        plus the per-rollout object overhead measured here, over live prompt + response tokens."""
        items = self.rb.storage._storage  # noqa: SLF001 - a benchmark may look inside
        storages, tokens = {}, 0
        for it in items:
            for x in it[:4]:
                s = x.untyped_storage()
                storages[s.data_ptr()] = s.nbytes()
            tokens += len(it[0]) + len(it[1])
        tensor_bytes = sum(storages.values())
        per_item = _object_overhead_per_item()
        held = tensor_bytes + _tree_bytes(self.capacity) + per_item * len(items)
        return {"bytes_held": held, "live_tokens": tokens, "bytes_per_token": held / tokens,
                "tensor_bytes_per_token": tensor_bytes / tokens, "overhead_bytes_per_rollout": per_item}


class TorchRLPadded:
    """The other TorchRL setup: `TensorDictPrioritizedReplayBuffer` over a `LazyTensorStorage`,
    every rollout padded to the longest possible prompt and response (1,024 and 4,096 tokens
    here; padded in the timed insert, from the same packed batch as the list setup), priority read
    from a "priority" key on extend. Gathering the packed tensors then means dropping the padding
    (boolean indexing by length)."""

    def __init__(self, cfg: StoreConfig, w: Workload) -> None:
        self.w = w
        self.capacity = cfg.steady_live(w.rollouts_per_step)
        self.rb = TensorDictPrioritizedReplayBuffer(alpha=w.alpha, beta=w.beta, eps=w.eps,
                                                    storage=LazyTensorStorage(self.capacity), priority_key="priority")
        self.rb.set_rng(torch.Generator().manual_seed(w.seed))
        self.cols_p = torch.arange(w.prompt_clip[1])
        self.cols_r = torch.arange(w.response_clip[1])

    def prepare(self, fields: dict[str, np.ndarray]):
        return _packed_tensors(fields)

    def _padded(self, t: dict) -> TensorDict:

        fields = {k: v.numpy() for k, v in t.items()}
        n, wp, wr = self.w.rollouts_per_step, self.w.prompt_clip[1], self.w.response_clip[1]
        p_len, r_len = np.diff(fields["prompt_offsets"]), np.diff(fields["response_offsets"])

        def pad(flat, lengths, width, dtype):  # (n, width), right-padded
            out = np.zeros((n, width), dtype)
            rows = np.repeat(np.arange(n), lengths)
            out[rows, np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = flat
            return torch.from_numpy(out)

        return TensorDict({
            "prompt_ids": pad(fields["prompt_ids"], p_len, wp, np.int32),
            "prompt_len": torch.from_numpy(p_len),
            "response_ids": pad(fields["response_ids"], r_len, wr, np.int32),
            "behaviour_logprobs": pad(fields["behaviour_logprobs"], r_len, wr, np.float32),
            "action_mask": pad(fields["action_mask"], r_len, wr, np.bool_),
            "response_len": torch.from_numpy(r_len),
            "advantages": torch.from_numpy(fields["advantages"]),
            "priority": torch.from_numpy(np.abs(fields["advantages"])),
        }, batch_size=[n])

    def step(self, t, step: int) -> tuple[dict[str, float], dict]:
        c0, t0 = time.process_time(), time.perf_counter()
        self.rb.extend(self._padded(t))
        t1 = time.perf_counter()
        s = self.rb.sample(self.w.draw)
        t2 = time.perf_counter()
        valid_p = self.cols_p < s["prompt_len"][:, None]  # (k, 1024)
        valid_r = self.cols_r < s["response_len"][:, None]  # (k, 4096)
        zero = torch.zeros(1, dtype=torch.int64)
        out = {
            "prompt_ids": s["prompt_ids"][valid_p],
            "prompt_offsets": torch.cat([zero, s["prompt_len"].cumsum(0)]),
            "response_ids": s["response_ids"][valid_r],
            "response_offsets": torch.cat([zero, s["response_len"].cumsum(0)]),
            "behaviour_logprobs": s["behaviour_logprobs"][valid_r],
            "action_mask": s["action_mask"][valid_r],
            "advantages": s["advantages"],
        }
        t3, c3 = time.perf_counter(), time.process_time()
        ms = {"step_ms": t3 - t0, "insert_ms": t1 - t0, "draw_ms": t2 - t1, "gather_ms": t3 - t2, "step_cpu_ms": c3 - c0}
        ms = {k: v * 1e3 for k, v in ms.items()}
        ms["repeats"] = len(s["index"]) - len(torch.unique(s["index"]))
        return ms, out

    def __len__(self) -> int:
        return len(self.rb)

    def memory(self) -> dict[str, float]:
        st = self.rb.storage._storage  # noqa: SLF001
        tensor_bytes = sum(v.untyped_storage().nbytes() for v in st.values())
        n = len(self.rb)
        tokens = int(st["prompt_len"][:n].sum() + st["response_len"][:n].sum())
        held = tensor_bytes + _tree_bytes(self.capacity)
        return {"bytes_held": held, "live_tokens": tokens, "bytes_per_token": held / tokens,
                "tensor_bytes_per_token": tensor_bytes / tokens}


TORCHRL_SETUPS = {"list": TorchRLList, "padded": TorchRLPadded}


def _packed_tensors(fields: dict[str, np.ndarray]) -> dict:
    """The step's packed batch as torch tensors (views: no copy), where both TorchRL setups start."""
    return {k: torch.from_numpy(v) for k, v in fields.items()}


def _offsets_of(parts) -> torch.Tensor:  # (k + 1,) int64

    lengths = torch.tensor([p.numel() for p in parts], dtype=torch.int64)  # 1-D; numel(): Tensor.__len__ is slow
    return torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])


def _tree_bytes(capacity: int) -> int:
    """TorchRL's sum and min trees: float32, 2 x (capacity rounded up to a power of two) slots each."""
    return 2 * 2 * (1 << (capacity - 1).bit_length()) * 4


def _object_overhead_per_item(n: int = 20_000) -> float:
    """Bytes per ListStorage item (a tuple of four tensor views and a float) beyond the tensor
    data: malloc'd bytes (torch's C++ tensor objects; glibc's count of bytes in use, which
    freed memory being reused cannot hide, unlike RSS) plus Python objects (tracemalloc)."""


    class _Mallinfo2(ctypes.Structure):
        _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    in_use = lambda: (lambda m: m.uordblks + m.hblkhd)(libc.mallinfo2())  # noqa: E731
    base = torch.zeros(n * 4, dtype=torch.int32)
    make = lambda: [tuple(base[4 * i + j:4 * i + j + 1] for j in range(4)) + (float(i),) for i in range(n)]  # noqa: E731
    gc.collect()
    before = in_use()
    items = make()
    c_bytes = in_use() - before
    del items
    gc.collect()
    tracemalloc.start()  # a second pass: tracemalloc's own bookkeeping would inflate the malloc count
    before = tracemalloc.get_traced_memory()[0]
    items = make()
    py_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del items
    return max(c_bytes, 0) / n + max(py_bytes, 0) / n


def serve_torchrl(args: argparse.Namespace) -> None:
    """`--side torchrl`: answer the driver's requests on stdin, one JSON line each way.

    {"step": s} -> run step s (its workload made here from (seed, step)), reply the timings, the
    live count and the workload checksum; {"memory": true} -> reply memory figures; EOF -> exit.
    """
    proto, sys.stdout = sys.stdout, sys.stderr  # replies only on the real stdout; stray prints go to stderr

    if args.torchrl_threads:
        torch.set_num_threads(args.torchrl_threads)
    w, configs = QUICK_SIZE if args.quick else FULL_SIZE
    assert tuple(sorted(TORCHRL_SETUPS)) == tuple(sorted(TORCHRL_STORAGES))
    side = TORCHRL_SETUPS[args.torchrl_storage](configs[args.config], w)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads()}), file=proto, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if "step" in req:
            fields = make_step(w, req["step"])
            t0 = time.perf_counter()
            prepared = side.prepare(fields)
            prepare_ms = (time.perf_counter() - t0) * 1e3
            ms, out = side.step(prepared, req["step"])
            reply = {**ms, "prepare_ms": prepare_ms, "live": len(side), "checksum": checksum(fields),
                     "gathered": describe(out), "gathered_rollouts": len(out["advantages"])}
        else:
            reply = side.memory()
        print(json.dumps(reply), file=proto, flush=True)
