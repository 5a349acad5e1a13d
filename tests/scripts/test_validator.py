"""The validator (`python -m openrlhf_replay.cli.validate`), in process and as a command: what it
accepts, what it refuses (each with its fix), that Ray never starts, and inputs an earlier step makes."""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared/data/train/deepscaler_math_train.json"

BASE = ["--actor.model_name_or_path", "Qwen/Qwen3-1.7B-Base", "--algo.advantage.estimator", "group_norm",
        "--algo.kl.init_coef", "0", "--rollout.n_samples_per_prompt", "8", "--rollout.batch_size", "128",
        "--rollout.micro_batch_size", "8", "--train.batch_size", "256", "--train.micro_batch_size", "4",
        "--train.colocate_all", "--vllm.num_engines", "8", "--data.prompt_dataset", str(DATA),
        "--data.input_key", "problem", "--data.label_key", "answer",
        "--data.max_samples", "7424", "--actor.lr_scheduler", "constant_with_warmup",
        "--reward.remote_url", str(ROOT / "evaluation/reward.py")]


@pytest.fixture(scope="module")
def validate():
    if not DATA.is_file():
        pytest.skip(f"{DATA} is not here")
    from openrlhf_replay.cli import validate as module

    return module


@pytest.mark.parametrize("module", ["openrlhf.cli.train_ppo_ray", "openrlhf_replay.cli.train_ppo_ray"])
def test_validator_accepts_a_valid_command_and_never_starts_ray(validate, module):
    import ray

    before = os.environ.get(validate.DEVICE_ENV)
    replay = ["--replay.mode", "advantage"] if module == validate.REPLAY_CLI else []
    report = validate.validate(["python", "-m", module, *BASE, *replay])
    assert not ray.is_initialized()
    assert os.environ.get(validate.DEVICE_ENV) == before  # the platform choice does not leak
    assert report.settings["rollout"]["vllm_generate_batch_size"] == 128  # after upstream's own rewrite
    assert any("rollout.vllm_generate_batch_size" in n for n in report.notes)
    assert "1024 fresh rollouts per step" in report.summary


@pytest.mark.parametrize("extra, module, fragment", [
    (["--replay.moed", "advantage"], "openrlhf_replay.cli.train_ppo_ray", "unrecognized arguments: --replay.moed"),
    (["--actor.dual_clip", "ten"], "openrlhf.cli.train_ppo_ray", "invalid float value: 'ten'"),
    (["--replay.mode", "success", "--algo.kl.init_coef", "0.01"], "openrlhf_replay.cli.train_ppo_ray",
     "drop the KL penalty"),
    (["--replay.mode", "advantage", "--train.batch_size", "384"], "openrlhf_replay.cli.train_ppo_ray",
     "not a whole number of --train.batch_size 384 batches"),
    (["--rollout.n_samples_per_prompt", "1"], "openrlhf.cli.train_ppo_ray", "upstream check: group_norm requires"),
    (["--vllm.num_engines", "4"], "openrlhf.cli.train_ppo_ray", "must equal vllm.num_engines x tensor_parallel_size"),
    (["--train.micro_batch_size", "3"], "openrlhf.cli.train_ppo_ray", "multiple of train.micro_batch_size x GPUs"),
    (["--actor.lr_scheduler", "cosine_min_lr"], "openrlhf.cli.train_ppo_ray", "not a transformers scheduler"),
    (["--data.prompt_dataset", "/nonexistent/train.jsonl"], "openrlhf.cli.train_ppo_ray", "no such file"),
    (["--reward.remote_url", "/nonexistent/reward.py"], "openrlhf.cli.train_ppo_ray", "no such reward file"),
    # 7,474 prompts = 58 x 128 + 50: every episode would end with a step of 400 rollouts, which upstream
    # chunks unevenly over 8 ranks (7 micro-batches to seven of them, 1 to the last), for every condition.
    (["--data.max_samples", "100000000"], "openrlhf.cli.train_ppo_ray", "pass --data.max_samples 7424"),
    (["--data.max_samples", "100000000", "--replay.mode", "advantage"], "openrlhf_replay.cli.train_ppo_ray",
     "each episode would end with a step of 50 prompts"),
])
def test_validator_refuses_what_would_fail_later(validate, extra, module, fragment):
    with pytest.raises(validate.Invalid) as caught:
        validate.validate(["python", "-m", module, *BASE, *extra])
    assert any(fragment in e for e in caught.value.errors), caught.value.errors


def test_validator_checks_the_rest_of_a_command_whose_pool_is_pending(tmp_path):
    """A pool an earlier step makes (`--pending`) is not an error while missing; every other check
    still runs, those that depend on a pool being given included."""
    if not DATA.is_file():
        pytest.skip(f"{DATA} is not here")
    pool = str(tmp_path / "pool.npz")
    argv = ["--", "python", "-m", "openrlhf_replay.cli.train_ppo_ray", *BASE, "--replay.mode", "success",
            "--replay.success_pool", pool]

    def cli(*words):
        return subprocess.run([sys.executable, "-m", "openrlhf_replay.cli.validate", *words], cwd=ROOT,
                              capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=3) as pool_of_runs:
        missing, pending, refused = pool_of_runs.map(lambda words: cli(*words), [
            argv, ["--pending", pool, *argv],
            ["--pending", pool, *argv, "--algo.kl.init_coef", "0.01", "--algo.kl.use_loss"]])
    assert missing.returncode == 1 and f"--replay.success_pool: success pool {pool}" in missing.stderr
    assert pending.returncode == 0 and f"validate: note: {pool} does not exist yet: not checked" in pending.stdout
    assert refused.returncode == 1 and "an offline pool holds no reference log-probs" in refused.stderr


@pytest.mark.parametrize("argv, fragment", [
    (["run", "--model", "m", "--output-dir", "o", "--temperature", "-1"], "--temperature must be >= 0"),
    (["run", "--model", "m", "--output-dir", "o", "--benchmarks", "math501"], "unknown benchmark(s) math501"),
    (["run", "--model", "m", "--output-dir", "o", "--prompt-template", "/no/such.txt"], "not an existing file"),
    (["run", "--model", "m"], "the following arguments are required: --output-dir"),
    (["sweep", "--model", "m", "--checkpoints", "c", "--output-dir", "o"], "unrecognized arguments: --model"),
])
def test_validator_checks_evaluation_commands(argv, fragment):
    from openrlhf_replay.cli import validate

    with pytest.raises(validate.Invalid) as caught:
        validate.validate(["python", "-m", "evaluation", *argv])
    assert any(fragment in e for e in caught.value.errors), caught.value.errors
    ok = validate.validate(["python", "-m", "evaluation", "compare", "--baseline", "a", "--runs", "b", "c"])
    assert "compare 2 run(s) against a" in ok.summary and len(ok.notes) == 3


def test_validator_cli_exit_status_and_messages(tmp_path):
    def cli(*argv):
        return subprocess.run([sys.executable, "-m", "openrlhf_replay.cli.validate", *argv], cwd=ROOT,
                              capture_output=True, text=True)

    out = tmp_path / "resolved.json"
    ok = cli("--resolved-json", str(out), "--", "python", "-m", "evaluation", "run", "--model", "m", "--output-dir", "o")
    assert ok.returncode == 0 and "validate: OK" in ok.stdout
    assert json.loads(out.read_text())["n_samples"] == 1
    bad = cli("--", "python", "script.py")
    assert bad.returncode == 1 and "not a `python -m <module> ...` command" in bad.stderr
    unknown = cli("--", "python", "-m", "json.tool")
    assert unknown.returncode == 1 and "unknown module json.tool" in unknown.stderr
