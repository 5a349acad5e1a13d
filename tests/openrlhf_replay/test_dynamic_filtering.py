"""Dynamic filtering with replay, at the level of one step (docs/METHOD.md section 2, "Dynamic
filtering"): a short fresh batch over 2 ranks, refill's rows, and upstream's range rule in the
samples generator's no-replacement seam, and what each generation call is counted as. Real
Experience objects from upstream's own split and advantage code; upstream's chunking rule decides
what each rank receives. The whole pipeline runs
it in tests/pipeline/test_cpu_pipeline.py (the `replay` run) and the rehearsal at GPU shape."""
import copy

import numpy as np
import pytest
import torch
from openrlhf.trainer.ppo_utils.experience import make_experience_batch, split_experience_batch

from openrlhf_replay.trainer.ppo_utils.experience import INERT_KEY, REFILL_KEY, REPLAYED_KEY
from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker
from openrlhf_replay.trainer.ppo_utils.samples_generator import GENERATION_KEY, ReplaySamplesGenerator, outside_range
from replay import ReplayBuffer, ReplayConfig


def _chunks(batch, ranks):
    """What each rank receives: upstream's `RayActorGroup.async_run_method_batch` cuts the list into
    `ranks` contiguous chunks of ceil(len / ranks) items."""
    size = -(-len(batch) // ranks)
    return [batch[r * size:(r + 1) * size] for r in range(ranks)]


def _rank_figures(chunk, local_batch: int, micro: int):
    rows = sum(len(e.sequences) for e in chunk)
    flags = {k: torch.cat([torch.as_tensor(e.info[k]).float() for e in chunk]) for k in (REPLAYED_KEY, INERT_KEY)}
    return {"items": len(chunk), "rows": rows, "fresh": int((flags[REPLAYED_KEY] == 0).sum()),
            "inert": int(flags[INERT_KEY].sum()),
            # upstream's actor: micro-batches of train.micro_batch_size (drop_last), an optimizer step per window
            "optimizer_steps": rows // micro // (local_batch // micro), "dropped": rows % micro}


def _maker(make_args, experience_maker_cls, *flags):
    args = make_args("--actor.num_gpus_per_node", 2, "--replay.mode", "advantage", "--replay.warmup", 1, *flags)
    return experience_maker_cls(ReplayExperienceMaker, args,
                                replay_buffer=ReplayBuffer(ReplayConfig.from_namespace(args))), args


@pytest.mark.parametrize("groups", [1, 3, 5])
def test_a_short_fresh_batch_is_completed_so_both_ranks_take_the_same_optimizer_steps(
        make_args, experience_maker_cls, rollout_samples, groups):
    # 8 prompts x 4 a step, training batches of 8 over 2 ranks; the epoch's last step brings only
    # `groups` groups (upstream's dynamic filtering ran the data loader dry).
    maker, args = _maker(make_args, experience_maker_cls)
    maker.step = 0
    maker.make_experience_batch(rollout_samples(8, 4, seed=1))
    maker.step = 1
    batch = maker.make_experience_batch(rollout_samples(groups, 4, seed=2))
    fresh, replayed = 4 * groups, len(maker.composition.replayed)
    assert replayed == int(np.floor(0.5 * 4 * groups / 8 + 0.5)) * 8  # the usual share of the fresh rows kept
    per_rank = [_rank_figures(c, 8 // 2, 2) for c in _chunks(batch, 2)]
    total = sum(f["rows"] for f in per_rank)
    assert total % 8 == 0 and total - fresh - replayed == maker.inert_rows < 8  # inert rows complete the batch
    assert sum(f["fresh"] for f in per_rank) == fresh  # no fresh row lost
    assert sum(f["inert"] for f in per_rank) == maker.inert_rows
    for key in ("items", "rows", "optimizer_steps"):
        assert per_rank[0][key] == per_rank[1][key], (key, per_rank)
    assert per_rank[0]["dropped"] == 0 and per_rank[0]["optimizer_steps"] == total // 8
    # inert rows carry no loss and no token count; the actor collates all rows of a rank as one list
    for e in batch:
        inert = torch.as_tensor(e.info[INERT_KEY]).bool()
        assert not e.action_mask[inert].any()
    make_experience_batch([i for e in batch for i in split_experience_batch(copy.copy(e))])


def test_refill_draws_the_filtered_rows_on_top_of_the_usual_share_and_inert_rows_cover_the_rest(
        make_args, experience_maker_cls, rollout_samples):
    maker, args = _maker(make_args, experience_maker_cls, "--replay.refill", "--algo.dynamic_filtering_enable")
    maker.step, maker.refill_rows = 0, 8  # warm-up: refill draws nothing, inert rows take the 8 rows
    first = maker.make_experience_batch(rollout_samples(6, 4, seed=3))
    assert maker.inert_rows == 8 and len(maker.composition.replayed) == 0
    flags = torch.cat([e.info[REFILL_KEY] for e in first])
    assert len(flags) == 32 and int(flags.sum()) == 8  # the LR is paced as for the 32 rows generated
    maker.step, maker.refill_rows = 1, 12
    second = maker.make_experience_batch(rollout_samples(5, 4, seed=4))
    comp = maker.composition
    # the usual share of the 32 rows generated (16), plus the 12 filtered rows, from the 24 stored
    assert len(comp.replayed) == 24 and comp.refilled == 8 and comp.inert == 4
    rows = torch.cat([e.info[REPLAYED_KEY] for e in second])
    assert len(rows) == 20 + 24 + 4 and int(torch.cat([e.info[REFILL_KEY] for e in second]).sum()) == 12
    per_rank = [_rank_figures(c, 4, 2) for c in _chunks(second, 2)]
    assert per_rank[0]["rows"] == per_rank[1]["rows"] == 24 and per_rank[0]["items"] == per_rank[1]["items"]


def test_refill_generator_applies_upstreams_range_rule_without_replacement(make_args, rollout_samples, monkeypatch):
    """The seam: upstream's `_generate_vllm` runs once with its filter off (no prompt replaces a
    dropped group), and the same range rule then drops groups here, counted for the step."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    args = make_args("--replay.mode", "advantage", "--replay.refill", "--algo.dynamic_filtering_enable",
                     "--algo.dynamic_filtering_range", "0.01", "0.99")
    samples = rollout_samples(4, 4, seed=5)
    for i in range(4, 8):  # groups 1 and 3: all correct, all wrong
        samples[i].scores, samples[i + 8].scores = torch.tensor([1.0]), torch.tensor([0.0])
    calls = []

    def upstream(self, dataloader_iter, num_prompts, dynamic_filtering, **kwargs):
        calls.append(dynamic_filtering)
        return list(samples), num_prompts, False

    gen = object.__new__(ReplaySamplesGenerator)
    gen.args = args
    monkeypatch.setattr(SamplesGenerator, "_generate_vllm", upstream)  # vLLM's part: one pass, 4 groups
    kept, consumed, _ = gen._generate_vllm(iter(()), 4, True, n_samples_per_prompt=4)
    assert calls == [False] and consumed == 4 and len(samples) - len(kept) == 8  # the rows refill stands in for
    assert [id(e) for e in kept] == [id(e) for e in samples[0:4] + samples[8:12]]
    assert outside_range([0, 0], 0.01, 0.99) and outside_range([1, 1], 0.01, 0.99)
    assert not outside_range([0, 1], 0.01, 0.99) and outside_range([0, 1], 0.5, 0.99)  # bounds are exclusive


@pytest.mark.parametrize("refill", [False, True])
def test_each_step_carries_what_its_generation_calls_generated_and_filtered(make_args, counting_generator,
                                                                            refill):
    """Counted in the generator, by the call, and handed to training with the batch (so the async
    generator actor's counts reach the training actor). A call whose groups were all dropped (the
    loader's last prompts) trains no step and upstream logs nothing for it: its rollouts and its
    filtered rows ride with the next batch, before the batch's own call (whose filtered rows, the last
    call's, are the ones refill fills: `ReplayControllerMixin.train_step`)."""
    from openrlhf_replay.rehearsal.standins import in_process_object_store
    from openrlhf_replay.trainer.ppo_utils.samples_generator import GenerationCounts, take_generation_counts

    args = make_args("--replay.mode", "advantage", "--algo.dynamic_filtering_enable", "--rollout.batch_size", 4,
                     "--algo.dynamic_filtering_range", "0.01", "0.99", *(["--replay.refill"] if refill else []))
    replacement = [] if refill else ["mix"]  # what upstream dispatches in place of the dropped "0"
    gen, engines = counting_generator(args, ["mix", "0", "mix", "mix", *replacement, "1", "0"])
    logged = []
    with in_process_object_store():
        for _ in range(3):  # episode 1's two calls (the second all dropped), episode 2's first
            samples, _, _, exhausted = gen.generate_samples(n_samples_per_prompt=4)
            logged.append((len(samples), exhausted, take_generation_counts(samples)))
    # Upstream replaces the dropped "0" by the fifth prompt; refill generates 4 prompts, keeps 3.
    first = GenerationCounts(generated=20, filtered=4) if not refill else GenerationCounts(16, 4)
    assert logged[0] == (16 if not refill else 12, False, [first])
    assert logged[1] == (0, True, [])  # "1" and "0" (upstream finds no prompt to replace them)
    carried = GenerationCounts(generated=8, filtered=8)
    assert logged[2] == (logged[0][0], False, [carried, first])  # the loader walked again: episode 2
    step = sum(logged[2][2], GenerationCounts())
    assert step.metrics() == {"replay/generated_rollouts": 28.0 if not refill else 24.0,
                              "replay/filtered_rollouts": 12.0}
    assert sum(c.generated for _, _, calls in logged for c in calls) == engines.generated
    assert not any(GENERATION_KEY in s.info for s in samples)  # taken off: upstream sees its own info


def test_eval_generation_is_not_counted_as_training_rollouts(make_args, counting_generator):
    """Upstream's evaluation generates through the same `_generate_vllm`: it is no training step's."""
    from openrlhf_replay.rehearsal.standins import in_process_object_store
    from openrlhf_replay.trainer.ppo_utils.samples_generator import take_generation_counts

    args = make_args("--replay.mode", "advantage", "--rollout.batch_size", 2)
    gen, engines = counting_generator(args, ["mix", "0", "1", "mix"])
    gen.eval_dataloader = [([0], ["e0"], ["1"], [None])]
    with in_process_object_store():
        samples, *_ = gen.generate_samples(n_samples_per_prompt=4)
        gen.generate_eval_samples(n_samples_per_prompt=4)
        following, *_ = gen.generate_samples(n_samples_per_prompt=4)
    assert [c.generated for c in take_generation_counts(samples)] == [8]  # no filtering: what it trains
    assert [c.generated for c in take_generation_counts(following)] == [8] and engines.generated == 8 + 4 + 8


def test_a_fresh_batch_too_short_for_a_micro_batch_a_rank_is_cut_finer(make_args, experience_maker_cls,
                                                                       rollout_samples):
    """Upstream's forward dispatch needs an item per rank: one group of 4 left over 2 ranks, with
    micro-batches of 4, is cut in two micro-batches of 2 (upstream's split, at that size, once)."""
    maker, args = _maker(make_args, experience_maker_cls, "--rollout.micro_batch_size", 4)
    short = maker.split_rollout_samples(rollout_samples(1, 4, seed=1))
    assert [len(e.sequences) for e in short] == [2, 2] and args.rollout.micro_batch_size == 4
    full = maker.split_rollout_samples(rollout_samples(2, 4, seed=1))
    assert [len(e.sequences) for e in full] == [4, 4]
    with pytest.raises(ValueError, match="fewer than the 2 data-parallel ranks"):
        maker.split_rollout_samples(rollout_samples(1, 4, seed=1)[:1])
