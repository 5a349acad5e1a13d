"""Pre-rollout skipping (`--replay.skip`) in upstream's samples generator (docs/METHOD.md,
"Pre-rollout skipping"); the rule itself is `replay/skip.py:SkipRule`.

Seam: `install_skip` wraps two methods of one `SamplesGenerator` instance (the synchronous
controller's, or the async generator actor's), so it composes with any subclass and wrapper:

- `_generate_vllm`, when it draws from the training loader (never the eval loader): upstream
  fills its batch, and dynamic filtering its replacements, from the iterator it is given; here it
  is given `SkippingIterator`, which passes on only the prompts the rule keeps. A skipped prompt
  costs no generation, and the step still dispatches `--rollout.batch_size` prompts. After the
  call, the rule adapts, and the call's `replay/skip_*` figures and the rule's state go with its
  first sample (`SKIP_METRICS_KEY`, `SKIP_STATE_KEY`): the controller logs them with the step that
  trains it, and saves the state that matches the loader position upstream carries with that batch.
- `_process_response_into_experience`: upstream processes one prompt's n responses together;
  their rewards (scores where no reward is given) form the group that updates that prompt's
  history, dynamic filtering's dropped groups included.
"""
from __future__ import annotations

import hashlib
import os

from openrlhf.utils.logging_utils import init_logger

from replay.checkpoint import ReplayCheckpointError, load_state, prune_states, save_state, state_digest
from replay.skip import SkipRule

logger = init_logger(__name__)

SKIP_METRICS_KEY = "replay/skip_metrics"  # sample info keys, popped by the controller before training
SKIP_STATE_KEY = "replay/skip_state"


def prompt_text_uid(text: str) -> int:
    """A prompt's identity as the generator sees it: a 63-bit hash of its text (after the chat template)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") >> 1


class SkippingIterator:
    """The prompt loader's iterator (items of upstream's `collate_fn`: lists of datasources, prompts,
    labels, images), less the prompts the rule skips. Its end is the loader's."""

    def __init__(self, source, rule: SkipRule):
        self.source, self.rule = source, rule

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            item = next(self.source)
            kept = [i for i, prompt in enumerate(item[1]) if not self.rule.skip(prompt_text_uid(prompt))]
            if kept:
                return tuple([part[i] for i in kept] for part in item)


def _group_reward(experience) -> float:
    value = experience.rewards if experience.rewards is not None else experience.scores
    if value is None:
        raise RuntimeError("replay.skip: a generated sample carries no reward or score, so its prompt's history "
                           "cannot be kept (rewards computed later, by a reward model); pass a reward function "
                           "(--reward.remote_url <file>.py) or drop --replay.skip")
    return float(value.reshape(-1)[0])


def install_skip(generator, rule: SkipRule) -> None:
    """Wrap `generator`'s two methods (as they are now) with the skipping seam (module docstring)."""
    generate, process = generator._generate_vllm, generator._process_response_into_experience
    pending: dict[str, list[float]] = {}  # prompt text -> rewards of its group so far
    training = [False]  # inside a training call (eval calls are neither skipped nor observed)

    def observed(response, **generate_kwargs):
        experience = process(response, **generate_kwargs)
        if training[0]:
            n = generate_kwargs.get("n_samples_per_prompt", generator.args.rollout.n_samples_per_prompt)
            prompt = experience.prompts[0]
            rewards = pending.setdefault(prompt, [])
            rewards.append(_group_reward(experience))
            if len(rewards) == n:
                rule.observe(prompt_text_uid(prompt), pending.pop(prompt))
        return experience

    def skipping(dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs):
        if dataloader_iter is not getattr(generator, "_dataloader_iter", None):
            return generate(dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs)
        training[0] = True
        try:
            experiences, consumed, exhausted = generate(SkippingIterator(dataloader_iter, rule), num_prompts,
                                                        dynamic_filtering, **generate_kwargs)
        finally:
            training[0] = False
        if experiences:  # a call that returns nothing trains no step: its tally goes on to the next call
            experiences[0].info[SKIP_METRICS_KEY] = rule.end_call()
            experiences[0].info[SKIP_STATE_KEY] = rule.state_dict()
        return experiences, consumed, exhausted

    generator._generate_vllm = skipping
    generator._process_response_into_experience = observed
    generator.skip_rule = rule


def pop_skip_info(samples) -> tuple[dict[str, float], dict | None]:
    """Take the skip figures and state off a step's samples: (figures summed, or the rates of the
    last call that carried them; the latest state, None when no sample carried one)."""
    metrics, state = {}, None
    for sample in samples:
        found = sample.info.pop(SKIP_METRICS_KEY, None)
        state = sample.info.pop(SKIP_STATE_KEY, state)
        if found is not None:
            metrics = found if not metrics else _merged(metrics, found)
    return metrics, state


def _merged(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Two calls' figures in one step (only with a sample buffer shared across calls): counts add,
    rates and probabilities are the later call's."""
    counts = ("replay/skip_skipped_prompts", "replay/skip_drawn_prompts")
    return {k: before[k] + after[k] if k in counts else after[k] for k in after}


# -------------------------------------------------------------------- checkpoints

SKIP_CKPT_KEY = "skip_state"  # client_states key: the skip state file saved with a checkpoint
SKIP_FILE_PREFIX = "skip_global_step"


def save_skip_state(state: dict, folder: str, global_step: int, keep: int) -> str:
    """Save the rule's state as `<folder>/skip_global_step<N>.npz` (atomically), keep as many as
    upstream keeps checkpoints; returns the file name, which the checkpoint's client states hold."""
    name = f"{SKIP_FILE_PREFIX}{global_step}.npz"
    save_state(os.path.join(folder, name), state)
    prune_states(folder, SKIP_FILE_PREFIX, keep)
    logger.info(f"replay.skip: saved the history of {len(state['uids'])} prompts to {name} "
                f"(state {state_digest(state)})")
    return name


def load_skip_state(states: dict, folder: str, allow_empty: bool) -> dict | None:
    """The skip state saved with the checkpoint whose client states are `states`; None (start
    afresh, with a warning) when it is missing and `allow_empty`, else an error naming the fix."""
    name = states.get(SKIP_CKPT_KEY)
    try:
        if name is None:
            raise ReplayCheckpointError(f"the checkpoint at global step {states.get('global_step')} names no skip "
                                        f"state in {folder} (was it saved without --replay.skip?)")
        state = load_state(os.path.join(folder, name))
        logger.info(f"replay.skip: restored the history of {len(state['uids'])} prompts from {name} "
                    f"(state {state_digest(state)})")
        return state
    except ReplayCheckpointError as e:
        if not allow_empty:
            raise ReplayCheckpointError(f"cannot resume pre-rollout skipping: {e}. To resume it with no prompt "
                                        "history instead, pass --replay.allow_empty_resume") from e
        logger.warning(f"replay.skip: resuming with no prompt history ({e})")
        return None
