"""OpenRLHF rule-based reward: 1.0 when math-verify judges the response equal to the label.

Use with `--reward.remote_url path/to/evaluation/reward.py`. OpenRLHF 0.11.2
(`openrlhf/utils/agent.py`, `SingleTurnAgentExecutor`) loads this file by path as a module named
"reward_func" and calls `reward_func([query], [prompt], [label])` once per sample through
`asyncio.to_thread`, i.e. from many threads at once. `query` is the decoded prompt + response
tokens (special tokens kept), `prompt` the prompt text, `label` the dataset's gold answer.

Grading uses the same extraction and math-verify call as the evaluation (`evaluation.grader`),
in a module-level `Grader` (worker processes with a wall-clock limit per sample, so no
signal-based timeouts in these threads). Environment: OPENRLHF_REPLAY_REWARD_WORKERS (default
min(4, cpus)), OPENRLHF_REPLAY_REWARD_TIMEOUT_S (default 10).
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from pathlib import Path

if __name__ != "evaluation.reward":
    # Loaded by file path: make this checkout's `evaluation` package importable (spawned
    # grader workers inherit sys.path).
    _REPO = str(Path(__file__).resolve().parents[1])
    if _REPO not in sys.path:
        sys.path.insert(0, _REPO)

import torch  # noqa: E402

from evaluation.grader import Grader, Verdict  # noqa: E402

logger = logging.getLogger(__name__)

_PROMPT_TAIL_CHARS = 200
_grader: Grader | None = None
_grader_pid = 0
_grader_lock = threading.Lock()


def _get_grader() -> Grader:
    """The process-wide Grader, created on first use (again in a forked child: a fork does not
    copy the dispatcher thread)."""
    global _grader, _grader_pid
    with _grader_lock:
        if _grader is None or _grader_pid != os.getpid():
            _grader_pid = os.getpid()
            workers = os.environ.get("OPENRLHF_REPLAY_REWARD_WORKERS")
            timeout_s = float(os.environ.get("OPENRLHF_REPLAY_REWARD_TIMEOUT_S", 10))
            _grader = Grader(workers=int(workers) if workers else None, timeout_s=timeout_s)
            atexit.register(_grader.close)
        return _grader


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
    grader = _get_grader()
    futures = [grader.submit(response_text(q, p), str(label))
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
