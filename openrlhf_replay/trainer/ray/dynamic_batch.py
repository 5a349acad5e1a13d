"""Dynamic batching with replay: a rank packs every row it holds, fresh and replayed, none dropped.

Upstream's `NaiveReplayBuffer.setup_dynamic_batch` (OpenRLHF 0.11.2) caps a rank's optimizer steps
at the fresh ones, rollout.batch_size x n_samples_per_prompt // train.batch_size, and packs only
the rows those steps hold: with replay, the replayed rows beyond were silently never trained.

The rule here, in one place (`dynamic_steps`): a rank takes rows // (train.batch_size / ranks)
optimizer steps, from the rows it holds. Replay adds whole training batches (docs/METHOD.md
section 9; RLEP's inert rows complete its count) and upstream's controller deals the step's rows
over the ranks in equal numbers (`balance_experiences`), so that division is exact and the same on
every rank; if it is not, the step stops with the counts rather than leave rows out or let the
ranks' collectives diverge. Upstream then packs each step's rows into micro-batches by
`--train.max_tokens_per_gpu`, replayed rows exactly as fresh ones.

Seam: the actor's `replay_buffer` instance is switched to `AllRowsReplayBuffer`, whose
`setup_dynamic_batch` hands upstream's own a view of the arguments in which the fresh-step cap
equals the steps above. Nothing of upstream's packing is copied.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
from torch import distributed as dist


def dynamic_steps(rows_per_rank: Sequence[int], train_batch_size: int) -> int:
    """Optimizer steps every rank takes this rollout step: its rows in local training batches of
    train_batch_size / ranks. Raises (naming the counts) when a rank's rows would be left out."""
    ranks = len(rows_per_rank)
    local_batch = train_batch_size // ranks
    if len(set(rows_per_rank)) != 1 or rows_per_rank[0] % local_batch:
        raise RuntimeError(
            f"dynamic batching: the ranks hold {list(rows_per_rank)} rows, which are not the same whole number of "
            f"local training batches ({train_batch_size} / {ranks} ranks = {local_batch} rows each); rows would go "
            "untrained. Fresh and replayed rows must be whole --train.batch_size batches (the launcher checks this)")
    return rows_per_rank[0] // local_batch


def _with_step_cap(strategy, steps: int):
    """A shallow view of `strategy` whose args make upstream's fresh-step cap
    (rollout.batch_size x n_samples_per_prompt // train.batch_size) equal `steps`; the real
    strategy and its args are left untouched."""
    args = copy.copy(strategy.args)
    args.rollout = copy.copy(args.rollout)
    args.rollout.batch_size, args.rollout.n_samples_per_prompt = steps * args.train.batch_size, 1
    view = copy.copy(strategy)
    view.args = args
    return view


class AllRowsReplayBuffer(NaiveReplayBuffer):
    """Upstream's actor buffer whose dynamic batches hold all its rows (module docstring)."""

    def setup_dynamic_batch(self, strategy):
        dp_group = strategy.ds_device_mesh["dp"].get_group()
        mine = torch.tensor([len(self.items)], dtype=torch.long, device=torch.cuda.current_device())
        rows = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group=dp_group))]
        dist.all_gather(rows, mine, group=dp_group)  # every rank sees every count, so all raise alike
        steps = dynamic_steps([int(r.item()) for r in rows], strategy.args.train.batch_size)
        super().setup_dynamic_batch(_with_step_cap(strategy, steps))
        packed = sum(len(indices) for indices in self.dynamic_indices)
        if packed != len(self.items):  # upstream's packing changed: fail loudly, never train on fewer rows
            raise RuntimeError(f"dynamic batching packed {packed} of this rank's {len(self.items)} rows")
