"""Real Ray: upstream's chunking hands every rank the same fresh/replay split, refresh mode
recomputes log-probs through the actor group, and the CPU platform's driver waits for the vLLM
engines it created. (The replay controller and policy actor classes start as Ray actors in every
replay run of tests/pipeline, tests/faults and the quickstart; the LR schedule's length is
checked for every condition by tests/scripts/test_rehearsal.py.)"""
import sys
import time

import pytest
import torch

ray = pytest.importorskip("ray")
from openrlhf.trainer.ray.launcher import RayActorGroup  # noqa: E402

from openrlhf_replay.trainer.ppo_utils.experience import (  # noqa: E402
    REPLAYED_KEY,
    experiences_to_rollouts,
    mark_fresh,
    rollouts_to_experiences,
)
from openrlhf_replay.trainer.ppo_utils.experience_maker import arrange_for_ranks, share_for_ranks  # noqa: E402
from replay import ReplayBuffer, ReplayConfig  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    # Logical resources: upstream's actors ask Ray for GPUs (nothing here touches CUDA), and each
    # multi-rank group keeps a placement group of {GPU: 1, CPU: 1} bundles for the whole module.
    ray.init(num_cpus=16, num_gpus=16, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


class ChunkRecorder:
    """Stands in for a training actor (which cannot load a model here): takes upstream's actor
    constructor arguments and reports what `execute_batch` received. Plain, so that its worker
    process imports nothing heavy."""

    def __init__(self, world_size, rank, master_addr, master_port):
        self.rank = rank

    def get_master_addr_port(self):
        return "127.0.0.1", 0

    def execute_batch(self, method_name, all_data, start_idx, end_idx):
        return [(bool(e.info[REPLAYED_KEY].any()), len(e.sequences)) for e in all_data["experience"][start_idx:end_idx]]


@pytest.mark.parametrize("ranks, ratio", [(1, 0.5), (2, 1.0), (4, 0.25), (4, 0.5)])
def test_every_rank_gets_the_same_micro_batches_and_mix(local_ray, make_args, ranks, ratio, fresh_batch):
    args = make_args("--actor.num_gpus_per_node", ranks, "--rollout.batch_size", 16, "--rollout.micro_batch_size", 2,
                     "--train.batch_size", 16, "--replay.mode", "advantage", "--replay.ratio", ratio,
                     "--replay.warmup", 0)
    buf = ReplayBuffer(ReplayConfig.from_namespace(args))
    buf.step(experiences_to_rollouts(fresh_batch(args, seed=0), 0, 4), 0)
    fresh = fresh_batch(args, seed=1)
    mark_fresh(fresh)
    comp = buf.step(experiences_to_rollouts(fresh, 1, 4), 1, multiple_of=args.train.batch_size)
    k = len(comp.replayed)
    assert k == round(ratio * 64 / 16) * 16
    shares = share_for_ranks([len(e.sequences) for e in fresh], comp, ranks, 16, 2)  # the experience maker's rule
    per_rank = [[e for lo, hi in s.parts for e in rollouts_to_experiences(s.rows.select(list(range(lo, hi))),
                                                                           fresh[0], hi - lo, 0, step=1)]
                for s in shares]
    arranged = arrange_for_ranks(fresh, per_rank, [s.fresh for s in shares])

    group = RayActorGroup(1, ranks, ray.remote(ChunkRecorder), num_gpus_per_actor=1)
    received = ray.get(group.async_run_method_batch(method_name="append", experience=arranged))
    assert len(received) == ranks
    micro_batches = {len(r) for r in received}
    assert len(micro_batches) == 1  # every rank: the same number of micro-batches
    replayed_rows = [sum(n for is_replay, n in r if is_replay) for r in received]
    fresh_rows = [sum(n for is_replay, n in r if not is_replay) for r in received]
    assert replayed_rows == [k // ranks] * ranks and fresh_rows == [64 // ranks] * ranks


class ForwardRecorder(ChunkRecorder):
    """Stands in for the policy actor's forward: log-probs of -0.25 on every action token."""

    def execute_batch(self, method_name, all_data, start_idx, end_idx):
        assert method_name == "forward"
        return [-0.25 * mask.float() for mask in all_data["action_mask"][start_idx:end_idx]]


def test_refresh_recomputes_old_log_probs_through_the_actor_group(local_ray, make_args, experience_maker_cls,
                                                                 rollout_samples):
    from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker

    args = make_args("--replay.mode", "uniform", "--replay.warmup", 1, "--replay.off_policy", "refresh",
                     "--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "clip")
    maker = experience_maker_cls(ReplayExperienceMaker, args, replay_buffer=ReplayBuffer(ReplayConfig.from_namespace(args)))
    maker.actor_model_group = RayActorGroup(1, 1, ray.remote(ForwardRecorder), num_gpus_per_actor=1)
    maker.step = 0
    maker.make_experience_batch(rollout_samples(8, 4, seed=1, rollout_log_probs=True))
    maker.step = 1
    out = maker.make_experience_batch(rollout_samples(8, 4, seed=2, rollout_log_probs=True))
    replayed = [e for e in out if bool(e.info[REPLAYED_KEY].any())]
    assert sum(len(e.sequences) for e in replayed) == 16
    for e in replayed:
        mask = e.action_mask.bool()
        assert torch.equal(e.action_log_probs[mask], torch.full((int(mask.sum()),), -0.25))  # pi_old: current policy
        assert (e.rollout_log_probs[mask] != -0.25).all()  # pi_behaviour: what the store kept


def test_recompute_gives_replayed_rows_the_current_policy_without_an_importance_weight(
        local_ray, make_args, experience_maker_cls, rollout_samples):
    """RLEP's default: pi_old of replayed rows is recomputed, and with upstream's IS correction on
    for the fresh rows, pi_behaviour of replayed rows is too, so their weight is exactly 1. Inert
    rows complete the exact count to whole training batches."""
    from openrlhf_replay.trainer.ppo_utils.experience import INERT_KEY
    from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker

    args = make_args("--replay.mode", "success", "--replay.warmup", 1, "--replay.per_prompt", 1,
                     "--algo.advantage.is_correction_level", "token")
    assert ReplayConfig.from_namespace(args).effective_off_policy == "recompute"
    maker = experience_maker_cls(ReplayExperienceMaker, args, replay_buffer=ReplayBuffer(ReplayConfig.from_namespace(args)))
    maker.actor_model_group = RayActorGroup(1, 1, ray.remote(ForwardRecorder), num_gpus_per_actor=1)
    maker.step = 0
    maker.make_experience_batch(rollout_samples(8, 4, seed=1, rollout_log_probs=True))
    maker.step = 1  # the same prompts again: each has a stored success
    out = maker.make_experience_batch(rollout_samples(8, 4, seed=1, rollout_log_probs=True))
    replayed = [e for e in out if bool(e.info[REPLAYED_KEY].any())]
    assert len(maker.composition.replayed) == 8 and maker.composition.inert == 0  # min(M = 1, successes) x 8
    for e in replayed:
        mask = e.action_mask.bool()
        assert torch.equal(e.action_log_probs[mask], torch.full((int(mask.sum()),), -0.25))  # pi_old: current
        assert torch.equal(e.rollout_log_probs[mask], e.action_log_probs[mask])  # IS weight exp(0) = 1
    fresh = [e for e in out if not bool(e.info[REPLAYED_KEY].any())]
    assert all((e.action_log_probs[e.action_mask.bool()] != -0.25).all() for e in fresh)  # upstream's own
    assert all(not e.info[INERT_KEY].any() for e in out)


class EngineStandIn:
    """Stands in for a vLLM engine actor: a constructor that takes its time or fails."""

    def __init__(self, start_s: float = 0.0, fail: bool = False):
        time.sleep(start_s)
        if fail:
            raise RuntimeError("no model here")

    def get_num_unfinished_requests(self):
        return 0


def test_the_driver_waits_for_its_engines_and_stops_on_a_failed_or_slow_start(local_ray, monkeypatch):
    from openrlhf_replay.cpu import CpuPlatformError, patches

    engine = ray.remote(num_cpus=0)(EngineStandIn)
    monkeypatch.setenv(patches.ENGINE_START_TIMEOUT_ENV, "60")
    patches._starting_engines.append((time.monotonic(), engine.remote(start_s=1)))
    patches.wait_for_engines()  # it started: the wait returns, and nothing is left to check
    assert patches._starting_engines == []
    patches.wait_for_engines()

    patches._starting_engines.append((time.monotonic(), engine.remote(fail=True)))
    with pytest.raises(CpuPlatformError, match="the vLLM engine failed to start") as failed:
        patches.wait_for_engines()
    assert "no model here" in str(failed.value.__cause__)

    # The timeout runs from the engine's creation (100 s ago here), not from the start of the wait.
    slow = engine.remote(start_s=60)
    patches._starting_engines.append((time.monotonic() - 100, slow))
    t0 = time.monotonic()
    with pytest.raises(CpuPlatformError, match="did not start within 60 s"):
        patches.wait_for_engines()
    assert time.monotonic() - t0 < 10
    ray.kill(slow)
