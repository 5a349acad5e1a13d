"""Upstream's samples generator, counting what it generates, and refill's no-replacement.

Counting: every generation call of a training step (upstream's `SamplesGenerator._generate_vllm`,
OpenRLHF 0.11.2) is counted where it runs, in whatever process generates (the controller in sync
training, the generator actor in async), and the counts travel with the samples the call hands to
training: the batch's first sample carries them in `info[GENERATION_KEY]`, and the training side
takes them off before upstream sees the batch (`take_generation_counts`). With dynamic filtering,
upstream drops a prompt group whose mean score is outside `--algo.dynamic_filtering_range` and
dispatches one new prompt in its place; every dispatched prompt was generated, so a call generated
its prompts consumed x n_samples_per_prompt rollouts, and filtered those it did not return. A call
whose groups were all dropped (the loader's last prompts, at an episode's end) trains no step and
upstream logs nothing for it: its counts ride with the next batch, beside that batch's own call.

With `--replay.refill`, no prompt is dispatched in place of a dropped group: upstream's
`_generate_vllm` runs with its filtering off (one pass over the step's prompts), and the same range
rule (`outside_range`) then drops groups here; the experience maker fills their rows with replayed
rollouts (`ReplayExperienceMaker`, `refill_rows`: the filtered rows of the batch's own call).

Seam: the `samples_generator` instance (the sync controller's, or the async generator actor's) is
switched to `ReplaySamplesGenerator`, which only adds behaviour; `generate_samples` and
`_generate_vllm` are upstream's, wrapped.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass

from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from openrlhf.utils.logging_utils import init_logger

from replay import ReplayConfig

logger = init_logger(__name__)

GENERATION_KEY = "replay/generation"  # a batch's first sample's info: the GenerationCounts of its calls


@dataclass(frozen=True)
class GenerationCounts:
    """What one generation call (or a sum of calls) generated. A new count is a field here and its
    key in `metrics`: the calls are summed field by field."""

    generated: int = 0  # rollouts generated, the filtered ones included
    filtered: int = 0  # of those, dropped by dynamic filtering (with refill: the rows replay stands in for)

    def __add__(self, other: GenerationCounts) -> GenerationCounts:
        return GenerationCounts(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def metrics(self) -> dict[str, float]:
        return {"replay/generated_rollouts": float(self.generated), "replay/filtered_rollouts": float(self.filtered)}


def take_generation_counts(samples) -> list[GenerationCounts]:
    """The counts of the generation calls behind a training batch, oldest first, taken off its
    samples' info (upstream's experience maker expects per-row tensors there). Empty for a batch
    upstream served from the rollouts of an earlier call (`--rollout.vllm_generate_batch_size`)."""
    return [c for s in samples for c in s.info.pop(GENERATION_KEY, ())]


def outside_range(scores: list[float], low: float, high: float) -> bool:
    """Upstream's dynamic-filtering rule: a group is dropped unless low < its mean score < high."""
    mean = sum(scores) / len(scores)
    return not low < mean < high


class ReplaySamplesGenerator(SamplesGenerator):
    """`SamplesGenerator` that counts its training calls and hands the counts to training with the
    samples (module docstring)."""

    last_call: GenerationCounts | None = None  # the latest `_generate_vllm` call's (eval's too)
    pending: tuple[GenerationCounts, ...] = ()  # calls whose counts no batch has carried yet

    def generate_samples(self, **generate_kwargs):
        self.last_call = None  # upstream calls `_generate_vllm` at most once here: none when it serves a buffer
        samples, pass_rate, prompts_consumed, exhausted = super().generate_samples(**generate_kwargs)
        if self.last_call is not None:
            self.pending += (self.last_call,)
        if samples and self.pending:
            samples[0].info[GENERATION_KEY] = self.pending
            self.pending = ()
        return samples, pass_rate, prompts_consumed, exhausted

    def _generate_vllm(self, dataloader_iter, num_prompts: int, dynamic_filtering, **generate_kwargs):
        n = generate_kwargs.get("n_samples_per_prompt", self.args.rollout.n_samples_per_prompt)
        refill = dynamic_filtering and ReplayConfig.from_namespace(self.args).refill
        experiences, consumed, exhausted = super()._generate_vllm(dataloader_iter, num_prompts,
                                                                  dynamic_filtering and not refill, **generate_kwargs)
        if refill:
            experiences = self._drop_outside_range(experiences, consumed, n)
        self.last_call = GenerationCounts(generated=consumed * n, filtered=consumed * n - len(experiences))
        return experiences, consumed, exhausted

    def _drop_outside_range(self, experiences: list, consumed: int, n: int) -> list:
        """Refill's filter: upstream's range rule over each prompt's `n` responses (upstream returns
        them together), with no prompt dispatched in a dropped group's place."""
        kept = []
        low, high = self.args.algo.dynamic_filtering_range
        for start in range(0, len(experiences), n):
            group = experiences[start:start + n]
            if any(e.scores is None for e in group) or not outside_range([e.scores[0].item() for e in group],
                                                                          low, high):
                kept.extend(group)
        dropped = (len(experiences) - len(kept)) // n
        if dropped:
            logger.info(f"replay.refill: dynamic filtering dropped {dropped} of {consumed} groups (mean score "
                        "outside the range); replayed rollouts take their rows, no prompt is added")
        return kept
