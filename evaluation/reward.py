"""OpenRLHF rule-based reward: 1.0 when math-verify judges the response equal to the label.

Use with `--reward.remote_url path/to/evaluation/reward.py`. OpenRLHF 0.11.2
(`openrlhf/utils/agent.py`, `SingleTurnAgentExecutor`) loads this file by path as a module named
"reward_func" and calls `reward_func([query], [prompt], [label])` once per sample through
`asyncio.to_thread`, i.e. from many threads at once. `query` is the decoded prompt + response
tokens (special tokens kept), `prompt` the prompt text, `label` the dataset's gold answer.

Grading goes through the same bounded path as `evaluation.grader.grade` and the evaluation:
the process-wide pool `evaluation.grader.shared_grader()` (worker processes, each sample at most
OPENRLHF_REPLAY_REWARD_TIMEOUT_S seconds of a worker's time, default 10; no signal-based
timeouts in these threads). OPENRLHF_REPLAY_REWARD_WORKERS sets the pool's general workers
(default min(4, cpus); the pool has one fast-lane worker more, for plain-number answers); both are
read when this file is loaded. The answer is extracted as `grade()` extracts it
(`evaluation.verify.extract_answer`): several boxes joined into one answer count together, and a
cut extraction is never rewarded.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

if __name__ != "evaluation.reward":
    # Loaded by file path: make this checkout's `evaluation` package importable.
    _REPO = str(Path(__file__).resolve().parents[1])
    if _REPO not in sys.path:
        sys.path.insert(0, _REPO)

import torch  # noqa: E402

from evaluation import grader as _grading  # noqa: E402
from evaluation.verify import Verdict  # noqa: E402

logger = logging.getLogger(__name__)

_PROMPT_TAIL_CHARS = 200
_TIMEOUT_S = float(os.environ.get("OPENRLHF_REPLAY_REWARD_TIMEOUT_S", 10))
if os.environ.get("OPENRLHF_REPLAY_REWARD_WORKERS"):
    _grading.SHARED_POOL_WORKERS = int(os.environ["OPENRLHF_REPLAY_REWARD_WORKERS"])


def response_text(query: str, prompt: str) -> str:
    """The response part of `query` = prompt + response.

    Normally `query` starts with `prompt`. When decoding does not reproduce the prompt exactly
    (e.g. OpenRLHF cut a long prompt from the left), the response starts after the first
    occurrence of the prompt's last 200 characters; failing that, the whole query is used.
    """
    if query.startswith(prompt):
        return query[len(prompt):]
    tail = prompt[-_PROMPT_TAIL_CHARS:]
    at = query.find(tail) if tail else -1
    if at >= 0:
        return query[at + len(tail):]
    logger.warning("reward_func: prompt not found in query; grading the whole query")
    return query


def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> dict:
    """OpenRLHF's reward hook: rewards 1.0 (CORRECT) or 0.0 (anything else), one per query.

    Returns {"rewards": float tensor (B,), "scores": the same, "extra_logs": {name: tensor
    (B,)}} with extra_logs flags grade_unparseable, grade_timeout and grade_error (a label
    that math-verify cannot parse: logged, rewarded 0.0).
    """
    if not len(queries) == len(prompts) == len(labels):
        raise ValueError(f"reward_func: {len(queries)} queries, {len(prompts)} prompts, "
                         f"{len(labels)} labels")
    grader = _grading.shared_grader()
    futures = [grader.submit(response_text(q, p), str(label), timeout_s=_TIMEOUT_S)
               for q, p, label in zip(queries, prompts, labels)]
    verdicts: list[Verdict | None] = []
    for future, label in zip(futures, labels):
        try:
            verdicts.append(future.result().verdict)
        except Exception as e:  # a bad label must not kill the rollout
            logger.error("reward_func: cannot grade against label %r: %s", label, e)
            verdicts.append(None)
    rewards = torch.tensor([1.0 if v is Verdict.CORRECT else 0.0 for v in verdicts])
    return {
        "rewards": rewards,
        "scores": rewards.clone(),
        "extra_logs": {
            "grade_unparseable": torch.tensor([float(v is Verdict.UNPARSEABLE) for v in verdicts]),
            "grade_timeout": torch.tensor([float(v is Verdict.TIMEOUT) for v in verdicts]),
            "grade_error": torch.tensor([float(v is None) for v in verdicts]),
        },
    }
