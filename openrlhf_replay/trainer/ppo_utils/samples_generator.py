"""Upstream's samples generator, counting what dynamic filtering drops, and refill's no-replacement.

With `--algo.dynamic_filtering_enable`, upstream's `SamplesGenerator._generate_vllm` (OpenRLHF
0.11.2) drops a prompt group whose mean score is outside `--algo.dynamic_filtering_range` and
dispatches one new prompt in its place, until the batch is full or the data loader runs dry. Every
dispatched prompt was generated, so a step's generated rollouts are its prompts consumed x
n_samples_per_prompt, the filtered ones included: `GenerationCounts` keeps that honest count. A
call whose groups were all dropped (the loader's last prompts, at an episode's end) trains no step
and upstream logs nothing for it; its rollouts are counted with the next step's.

With `--replay.refill`, no prompt is dispatched in place of a dropped group: upstream's
`_generate_vllm` runs with its filtering off (one pass over the step's prompts), and the same range
rule (`outside_range`) then drops groups here; the experience maker fills their rows with replayed
rollouts (`ReplayExperienceMaker`, `refill_rows`).

Seam: the controller's `samples_generator` instance is switched to `ReplaySamplesGenerator`
(`ppo_trainer.py`), which only adds behaviour; `generate_samples` and `_generate_vllm` are
upstream's, wrapped.
"""
from __future__ import annotations

from dataclasses import dataclass

from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from openrlhf.utils.logging_utils import init_logger

from replay import ReplayConfig

logger = init_logger(__name__)


@dataclass
class GenerationCounts:
    """One rollout step: rollouts generated (with those of calls before it that returned nothing),
    and the filtered among this call's (with refill, the rows the replay buffer stands in for: no
    prompt replaced them)."""

    generated: int = 0
    filtered: int = 0

    def metrics(self) -> dict[str, float]:
        return {"replay/generated_rollouts": float(self.generated), "replay/filtered_rollouts": float(self.filtered)}


def outside_range(scores: list[float], low: float, high: float) -> bool:
    """Upstream's dynamic-filtering rule: a group is dropped unless low < its mean score < high."""
    mean = sum(scores) / len(scores)
    return not low < mean < high


class ReplaySamplesGenerator(SamplesGenerator):
    """`SamplesGenerator` whose last call's `counts` the controller logs (module docstring)."""

    counts: GenerationCounts = GenerationCounts()
    unlogged: int = 0  # rollouts of calls that returned no sample: no step was logged for them

    def generate_samples(self, **generate_kwargs):
        samples, pass_rate, prompts_consumed, exhausted = super().generate_samples(**generate_kwargs)
        generated = prompts_consumed * generate_kwargs.get("n_samples_per_prompt",
                                                           self.args.rollout.n_samples_per_prompt)
        if not samples:
            self.unlogged += generated
            return samples, pass_rate, prompts_consumed, exhausted
        self.counts = GenerationCounts(generated + self.unlogged, generated - len(samples))
        self.unlogged = 0
        return samples, pass_rate, prompts_consumed, exhausted

    def _generate_vllm(self, dataloader_iter, num_prompts: int, dynamic_filtering, **generate_kwargs):
        if not (dynamic_filtering and ReplayConfig.from_namespace(self.args).refill):
            return super()._generate_vllm(dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs)
        experiences, consumed, exhausted = super()._generate_vllm(dataloader_iter, num_prompts, False,
                                                                  **generate_kwargs)
        n = generate_kwargs.get("n_samples_per_prompt", self.args.rollout.n_samples_per_prompt)
        kept = []
        low, high = self.args.algo.dynamic_filtering_range
        for start in range(0, len(experiences), n):  # upstream returns each prompt's n responses together
            group = experiences[start:start + n]
            if any(e.scores is None for e in group) or not outside_range([e.scores[0].item() for e in group],
                                                                          low, high):
                kept.extend(group)
        dropped = (len(experiences) - len(kept)) // n
        if dropped:
            logger.info(f"replay.refill: dynamic filtering dropped {dropped} of {consumed} groups (mean score "
                        "outside the range); replayed rollouts take their rows, no prompt is added")
        return kept, consumed, exhausted
