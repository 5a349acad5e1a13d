"""The lab's session (`benchmarks/lab/se_session.py`): several launcher commands trained one after
another in one Ray instance, with one vLLM engine and one policy actor. What must hold for its runs
to be the runs their commands describe: each starts from its own initial weights, in the policy
actor and in vLLM, whatever the run before it did."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks/lab")]

import se_session  # noqa: E402

LR = 1e-3


def _command(model: Path, data: Path, out: Path, *replay: str) -> list[str]:
    return [
        sys.executable, "-m", "openrlhf_replay.cli.train_ppo_ray",
        "--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(data),
        "--data.input_key", "prompt", "--data.label_key", "label", "--data.apply_chat_template",
        "--reward.remote_url", str(ROOT / "tests/pipeline/parity_reward.py"),
        "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "1", "--vllm.sync_backend", "gloo",
        "--vllm.enforce_eager", "--train.colocate_all", "--ds.attn_implementation", "sdpa", "--ds.zero_stage", "0",
        "--actor.num_gpus_per_node", "1", "--algo.kl.init_coef", "0", "--algo.advantage.estimator", "group_norm",
        "--algo.advantage.is_correction_level", "token",  # logs vllm_kl: vLLM's log-probs against the actor's
        # one optimizer step per training step: Adam's first step moves every weight by at most the LR
        "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "4", "--rollout.micro_batch_size", "16",
        "--train.batch_size", "16", "--train.micro_batch_size", "16",
        "--rollout.max_new_tokens", "16", "--data.max_len", "128", "--data.max_samples", "8",
        "--actor.adam.lr", str(LR), "--actor.adam.weight_decay", "0", "--actor.lr_warmup_ratio", "0",
        "--actor.lr_scheduler", "constant",
        "--ckpt.path", str(out / "ckpt"), "--ckpt.save_steps", "1", "--ckpt.save_hf", "--ckpt.disable_ds",
        "--ckpt.output_dir", str(out / "final"), *replay,
    ]


def _weights(folder: Path) -> tuple[dict, float]:
    """The weights saved in `folder` (as float64), and how far storing rounds a weight, relative
    to its size: bf16 (what the CPU platform picks where the CPU has it) keeps 8 bits."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "model.safetensors"))
    rounding = max(torch.finfo(t.dtype).eps / 2 for t in tensors.values())
    return {k: t.double().numpy() for k, t in tensors.items()}, rounding


def _largest_change(a: dict, b: dict, rounding: float = 0.0) -> float:
    """The largest change of a weight from `b` to `a`, less what storing `a` may have rounded."""
    return max(float((np.abs(a[k] - b[k]) - rounding * np.abs(a[k])).max()) for k in set(a) & set(b))


@pytest.mark.slow
def test_each_run_starts_from_its_own_weights_in_the_actor_and_in_vllm(tmp_path):
    from infra.models import build_tiny_qwen3

    rng = np.random.default_rng(0)
    texts = []
    with open(tmp_path / "prompts.jsonl", "w") as f:
        for _ in range(8):
            a, b = (int(x) for x in rng.integers(2, 50, 2))
            f.write(json.dumps({"prompt": f"What is {a} + {b}?", "label": str(a + b)}) + "\n")
            texts += [f"What is {a} + {b}?", f"The answer is \\boxed{{{a + b}}}."]
    model = build_tiny_qwen3(tmp_path / "tiny", corpus=texts, vocab_size=512)
    jobs = [{"name": name, "out": str(tmp_path / name), "timeout_s": 600,
             "command": _command(model, tmp_path / "prompts.jsonl", tmp_path / name, *replay)}
            for name, replay in (("grpo", ["--replay.mode", "none"]),
                                 ("replay", ["--replay.mode", "advantage", "--replay.warmup", "1"]))]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/lab/se_session.py"), str(tmp_path / "jobs.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OPENRLHF_REPLAY_DEVICE": "cpu", "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    runs = {job["name"]: json.loads((Path(job["out"]) / "steps.json").read_text()) for job in jobs}
    for name, run in runs.items():
        assert [s["step"] for s in run["steps"]] == [1, 2], name
        assert all(s["timing/step_total"] > 0 for s in run["steps"]), name
        assert [s["lab/prompts_consumed"] for s in run["steps"]] == [4, 4], name  # the session's own count
    # each run had its own controller class: upstream's for the first, the replay one for the second
    assert "replay/size" in runs["replay"]["steps"][0] and "replay/size" not in runs["grpo"]["steps"][0]

    initial, _ = _weights(model)
    first_done, _ = _weights(tmp_path / "grpo" / "final")
    after_one_step, rounding = _weights(tmp_path / "replay" / "ckpt" / "global_step1_hf")
    # The first run moved the weights by more than one step can; the second run's first step
    # started from the initial weights again, so it moved none by more than the LR.
    assert _largest_change(first_done, initial) > 1.5 * LR
    assert _largest_change(after_one_step, initial, rounding) <= LR * 1.001
    # vLLM sampled the second run's first step with the initial weights too: its log-probs match
    # the actor's (with the first run's final weights the gap would be the KL between the two).
    for name, run in runs.items():
        assert all(abs(s["vllm_kl"]) < 2e-3 for s in run["steps"]), (name, [s["vllm_kl"] for s in run["steps"]])
    assert "2 run(s); Ray, vLLM and the actors started" in proc.stdout


def test_settings_the_engine_is_built_from_must_agree():
    from openrlhf.utils.config import hierarchize

    from openrlhf_replay.cli.train_ppo_ray import build_parser

    parser = build_parser()

    def args(*extra):
        return hierarchize(parser.parse_args(["--actor.model_name_or_path", "m", *extra]))

    first = args("--data.max_len", "64")
    assert se_session.engine_mismatches(first, args("--data.max_len", "64", "--replay.mode", "uniform")) == []
    assert se_session.engine_mismatches(first, args("--data.max_len", "128")) == [
        "--data.max_len: 64 in the first run, 128 here"]


def test_a_prepare_command_must_end_well_and_make_its_files(tmp_path):
    made = tmp_path / "made.txt"
    job = {"name": "later", "out": str(tmp_path / "later"),
           "prepare": {"command": [sys.executable, "-c", f"open({str(made)!r}, 'w').write('pool'); print('decoded')"],
                       "makes": [str(made)]}}
    se_session.prepare(job)
    assert made.read_text() == "pool" and "decoded" in (tmp_path / "later" / "prepare.log").read_text()
    failing = {**job, "prepare": {"command": [sys.executable, "-c", "import sys; print('no model'); sys.exit(3)"],
                                  "makes": []}}
    with pytest.raises(RuntimeError, match=r"its prepare command ended with 3; see .*prepare\.log"):
        se_session.prepare(failing)
    assert "no model" in (tmp_path / "later" / "prepare.log").read_text()
    silent = {**job, "prepare": {"command": [sys.executable, "-c", "pass"], "makes": [str(tmp_path / "pool.npz")]}}
    with pytest.raises(RuntimeError, match="ended with 0, without .*pool.npz"):
        se_session.prepare(silent)
