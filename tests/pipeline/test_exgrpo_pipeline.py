"""ExGRPO (`--replay.mode exgrpo`) through the real pipeline on the CPU platform: Ray, the vLLM CPU
engine, DeepSpeed, the tiny random Qwen3 and the coin-flip reward of test_cpu_pipeline.py (whose
settings and run helper are loaded from that file), one rank, two steps, warm-up 1.

What only a real run shows: K reaches the buffer from --rollout.n_samples_per_prompt, the replayed
rows reach upstream's actor with their mixed group's advantage, and the actor's loss takes ExGRPO's
shaped objective (`ShapedSplitStatsPolicyLoss`) inside upstream's training step, finite, with the
per-kind statistics still logged. Training batches of 2 and --replay.ratio 0.125 ask for 2
replayed rows, so two of the first step's 4 questions with 0 < k < 4 successes suffice.
"""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location("cpu_pipeline", Path(__file__).with_name("test_cpu_pipeline.py"))
cpu_pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpu_pipeline)
K = 4  # COMMON's --rollout.n_samples_per_prompt


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from infra.models import build_tiny_qwen3

    tmp = tmp_path_factory.mktemp("exgrpo_pipeline")
    texts = cpu_pipeline._prompts(tmp / "prompts.jsonl")
    model = build_tiny_qwen3(tmp / "tiny-qwen3", corpus=texts, vocab_size=512)
    argv = ["--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(tmp / "prompts.jsonl"),
            "--train.num_episodes", "1", "--train.batch_size", "2", "--train.micro_batch_size", "2",
            "--replay.mode", "exgrpo", "--replay.warmup", "1", "--replay.ratio", "0.125"]
    return cpu_pipeline._run(tmp, "exgrpo", argv, env_extra={"OPENRLHF_REPLAY_DEBUG_DUMP_DIR": str(tmp / "dump")})


def test_exgrpo_replays_with_its_mixed_advantage_and_its_shaped_loss(run):
    from replay.exgrpo import mixed_group_advantage

    assert f"buckets of K = {K} rollouts per prompt" in run["log"] and "off-policy rule exgrpo" in run["log"]
    assert "replay: off-policy rule exgrpo, actor loss ShapedSplitStatsPolicyLoss" in run["log"]
    by_step = lambda key: run["scalars"].get(f"train/{key}", {})  # noqa: E731
    assert by_step("replay/replayed") == {1: 0, 2: 2}
    dump = json.loads((run["dir"].parent / "dump" / "step1.json").read_text())  # the buffer counts from 0
    replayed = [r for r in dump["rows"] if r["replayed"] and not r["inert"]]
    assert len(replayed) == 2
    allowed = [float(a) for a in mixed_group_advantage([1, 2, 3], K, divide_by_std=True)]  # group_norm's scale
    for row in replayed:
        assert any(row["advantage"] == pytest.approx(a, abs=1e-5) for a in allowed), (row["advantage"], allowed)
    # the shaped loss ran in upstream's training step: finite, with the per-kind statistics
    assert all(math.isfinite(v) for v in by_step("policy_loss").values())
    assert 2 in by_step("replay/clip_frac_replay") and 2 in by_step("replay/ratio_mean_replay")
    assert by_step("replay/rank_optimizer_steps_max")[2] == by_step("replay/rank_optimizer_steps_min")[2] == 9
