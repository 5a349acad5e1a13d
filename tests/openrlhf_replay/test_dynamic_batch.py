"""Dynamic batching with replay (`openrlhf_replay/trainer/ray/dynamic_batch.py`): a step's batch from
the real replay experience maker, dealt by upstream's `balance_experiences`, packed by upstream's
`NaiveReplayBuffer.setup_dynamic_batch` under a real (one-rank, gloo) process group. Upstream's
buffer trains only the fresh steps' worth of rows; ours trains every fresh, replayed and inert row,
in token-budget micro-batches, and every rank takes the same optimizer steps."""
import copy
import socket

import pytest
import torch
from openrlhf.trainer.ppo_utils.experience import balance_experiences
from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
from openrlhf.utils import get_strategy
from torch import distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from openrlhf_replay.trainer.ppo_utils.experience import INERT_KEY, REPLAYED_KEY
from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker
from openrlhf_replay.trainer.ray.dynamic_batch import AllRowsReplayBuffer, dynamic_steps
from openrlhf_replay.trainer.ray.ppo_actor import TRAINED_KINDS, count_trained_rows
from replay import ReplayBuffer, ReplayConfig

TOKENS = 40  # --train.max_tokens_per_gpu: a few rows per micro-batch (rows here are 3 to 13 tokens)
DYNAMIC = ["--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", TOKENS, "--rollout.max_tokens_per_gpu", TOKENS]
RATIO = ["--replay.mode", "advantage", "--replay.warmup", "1", "--replay.ratio", "0.5"]
RLEP = ["--replay.mode", "success", "--replay.warmup", "1", "--replay.per_prompt", "2", "--replay.off_policy", "stale"]


@pytest.fixture(scope="module")
def one_rank_group():
    """A real process group of one rank (gloo), as the actor's data-parallel group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    dist.destroy_process_group()


def replay_step(make_args, experience_maker_cls, rollout_samples, mode, *gpus):
    """Args and the second step's batch (the first is warm-up) as the controller hands it to the
    actors with dynamic batching on: the replay maker's list, then upstream's balance_experiences."""
    args = make_args(*mode, *DYNAMIC, *gpus)
    maker = experience_maker_cls(ReplayExperienceMaker, args, replay_buffer=ReplayBuffer(ReplayConfig.from_namespace(args)))
    maker.step = 0
    maker.make_experience_batch(rollout_samples(8, 4, seed=8))
    maker.step = 1  # RLEP: the same prompts come back, so their successes are replayed
    batch = maker.make_experience_batch(rollout_samples(8, 4, seed=8))
    return args, balance_experiences(batch, args)


def packed(buffer_cls, experiences, args, mesh, monkeypatch):
    """An actor's buffer after `append` and `setup_dynamic_batch`, as `ppo_train` leaves it."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # upstream names cuda:<index> in __init__
    buffer = buffer_cls(sample_batch_size=1, cpu_offload=False, dynamic_batch=True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    for exp in experiences:
        buffer.append(copy.deepcopy(exp))
    strategy = get_strategy(args)
    strategy.ds_device_mesh, strategy.world_size = mesh, 1
    buffer.setup_dynamic_batch(strategy)
    return buffer


def trained(buffer) -> dict:
    """Rows by kind in the micro-batches the buffer yields, as the actor counts them."""
    counts = dict.fromkeys(TRAINED_KINDS, 0)
    for i in range(len(buffer)):
        count_trained_rows(counts, buffer.collate_fn([buffer[i]]).info)
    return counts


@pytest.mark.parametrize("mode", [RATIO, RLEP], ids=["advantage", "success"])
def test_every_fresh_and_replayed_row_is_packed_by_tokens(make_args, experience_maker_cls, rollout_samples,
                                                          one_rank_group, monkeypatch, mode):
    args, experiences = replay_step(make_args, experience_maker_cls, rollout_samples, mode)
    flags = torch.cat([torch.as_tensor(e.info[REPLAYED_KEY]) for e in experiences]).bool()
    inert = torch.cat([torch.as_tensor(e.info[INERT_KEY]) for e in experiences]).bool()
    expected = {"fresh": 32, "replayed": int((flags & ~inert).sum()), "inert": int(inert.sum())}
    assert expected["replayed"] > 0 and (mode is RATIO or expected["inert"] > 0)
    rows = sum(expected.values())

    ours = packed(AllRowsReplayBuffer, experiences, args, one_rank_group, monkeypatch)
    assert trained(ours) == expected  # fresh + replayed + inert, each once
    assert sum(ours.dynamic_optimizer_step) == rows // args.train.batch_size  # whole training batches
    for indices in ours.dynamic_indices:  # upstream's token budget holds for replayed rows too
        assert sum(int(ours.items[i].total_length) for i in indices) <= TOKENS
    assert len(ours.dynamic_indices) > sum(ours.dynamic_optimizer_step)  # micro-batches, not whole batches

    upstream = packed(NaiveReplayBuffer, experiences, args, one_rank_group, monkeypatch)
    assert sum(upstream.dynamic_optimizer_step) == 32 // args.train.batch_size  # the fresh steps only
    assert sum(trained(upstream).values()) == 32 < rows  # what this module fixes: replayed rows dropped


def test_two_ranks_get_equal_whole_batches_and_take_equal_steps(make_args, experience_maker_cls, rollout_samples):
    """Upstream's balance_experiences deals rows by length, not kind: each rank's fresh share may
    differ, but its row count is the same whole number of local batches, so the steps agree."""
    for mode in (RATIO, RLEP):
        args, per_rank = replay_step(make_args, experience_maker_cls, rollout_samples, mode,
                                     "--actor.num_gpus_per_node", "2")
        rows = [len(e.sequences) for e in per_rank]
        assert len(rows) == 2 and dynamic_steps(rows, args.train.batch_size) == sum(rows) // args.train.batch_size


def test_rows_that_would_go_untrained_stop_the_step():
    assert dynamic_steps([12, 12], 8) == 3
    with pytest.raises(RuntimeError, match=r"\[12, 8\] rows"):
        dynamic_steps([12, 8], 8)  # upstream would take the smaller rank's 2 steps and drop 4 rows
    with pytest.raises(RuntimeError, match="not the same whole number"):
        dynamic_steps([10], 8)
