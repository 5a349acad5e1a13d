"""A diagnostic: the rows of a step's training batch, as the loss will read them, written to JSON.

With `OPENRLHF_REPLAY_DEBUG_DUMP_DIR` set, the experience maker writes `<dir>/step<N>.json` for
each step that replays: per row its tokens, action mask, pi_old (`action_log_probs`),
pi_behaviour (`rollout_log_probs`, when upstream keeps them), advantage, reward, kind (fresh,
replayed, inert) and the sampler's importance weight, with a critic its values and returns, plus each replayed row's stored behaviour
log-probs. Tests read it to check what the trainer trains on; a run does not need it.
"""
from __future__ import annotations

import json
import os

import numpy as np

from openrlhf_replay.trainer.ppo_utils.experience import INERT_KEY, IS_WEIGHT_KEY, REPLAYED_KEY

DUMP_DIR_ENV = "OPENRLHF_REPLAY_DEBUG_DUMP_DIR"


def _rows(experiences) -> list[dict]:
    rows = []
    for exp in experiences:
        for i in range(len(exp.sequences)):
            n = int(exp.attention_mask[i].sum())
            mask = exp.action_mask[i][: n - 1].bool()
            first = int(mask.int().argmax()) if bool(mask.any()) else 0
            row = {
                "sequence": exp.sequences[i][:n].tolist(),
                "action_mask": mask.tolist(),
                "pi_old": exp.action_log_probs[i][: n - 1].float().tolist(),
                "advantage": float(exp.advantages[i][first]),
                "reward": float(exp.rewards[i]),
                "replayed": bool(float(exp.info[REPLAYED_KEY][i])),
                "inert": bool(float(exp.info[INERT_KEY][i])),
                "is_weight": float(exp.info[IS_WEIGHT_KEY][i]),
            }
            if exp.rollout_log_probs is not None:
                row["pi_behaviour"] = exp.rollout_log_probs[i][: n - 1].float().tolist()
            if exp.values is not None:  # a critic's run: what its loss reads, per action column
                row["values"] = exp.values[i][: n - 1].float().tolist()
                row["returns"] = exp.returns[i][: n - 1].float().tolist()
            rows.append(row)
    return rows


def dump_step(step: int, batch, composition) -> None:
    """Write the step's rows (`batch`: the Experience list handed to the actors) when the
    environment asks for it and the step replays."""
    folder = os.environ.get(DUMP_DIR_ENV)
    if not folder or not len(composition.replayed):
        return
    stored = composition.replayed
    doc = {
        "step": step,
        "rows": _rows(batch),
        "stored_behaviour": [stored.behaviour_logprobs[a:b].tolist() for a, b in
                             zip(stored.response_offsets[:-1], stored.response_offsets[1:])],
        "stored_versions": np.asarray(stored.versions).tolist(),
        "inert": int(composition.inert),
    }
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".step{step}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, os.path.join(folder, f"step{step}.json"))
