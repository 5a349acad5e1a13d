"""The launch scripts, proven up to where a GPU is needed (their lints and the image's:
tests/scripts/test_lints.py).

- every script's dry run builds its exact command and checks it against the installed parsers
  (upstream's for the baseline, ours for the replay conditions, the evaluation CLI's), the
  replay rules and the launch-time checks, at the default 1.7B settings and other GPU counts;
- the real launch path (output directory, metadata, DONE marker, refusals) runs with a stand-in
  interpreter that records the command instead of training;
- the validator itself: tests/scripts/test_validator.py.
"""
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "examples/scripts"
TRAINING = ["train_grpo", "train_grpo_replay", "train_grpo_naive_replay", "train_grpo_uniform_replay",
            "train_grpo_freshness_replay", "train_grpo_success_replay", "train_grpo_exgrpo_replay"]
DATA = ROOT.parent / "shared/data/train/deepscaler_math_train.json"


def _env(tmp: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MODEL", "NUM_GPUS", "NUM_NODES", "OUTPUT_DIR", "SEED", "CONDITION", "RUN_DIR", "CHECKPOINT")}
    env.update(PYTHON=sys.executable, RUNS_DIR=str(tmp / "runs"), RAY_ADDRESS="")
    if not DATA.is_file():  # the shared data beside the repository is not everywhere
        fake = tmp / "train.json"
        fake.write_text(json.dumps([{"problem": "1 + 1?", "answer": "2"}]))
        env["DATA"] = str(fake)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run(script: str, env: dict, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPTS / f"{script}.sh"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


# -------------------------------------------------------------------- dry runs

# (script, environment): the baseline and the method at the default 1.7B / 8 GPUs, each importing
# the real launcher stack (~10 s of CPU). The other replay scripts differ only in --replay flags,
# and every training script's command is validated through the same checks by the rehearsal
# (tests/scripts/test_rehearsal.py: at 1-32 GPUs and three scales); the commands the scripts build
# are checked with a stand-in python below (test_every_condition_shares_the_baseline_settings,
# test_gpu_count_and_model_scale_shape_the_command).
DRY_RUNS = [("train_grpo", {}), ("train_grpo_replay", {}), ("train_grpo_replay", {"M2PO": "1"}),
            ("train_grpo_exgrpo_replay", {}), ("train_grpo_success_replay", {})] + [
    ("eval", {}),
    ("eval", {"CONDITION": "grpo_replay"}),
    ("eval", {"CONDITION": "grpo_replay", "SWEEP": 1}),
    ("compare", {}),
]
REFUSED = ("train_grpo", {"NUM_GPUS": 3})  # 256 rollouts do not split into micro-batches of 4 over 3 GPUs


def _case_id(case):
    script, env = case
    return script + "".join(f"-{k}={v}" for k, v in env.items())


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """Every dry run of DRY_RUNS (and REFUSED), three at a time: each imports the real launcher stack
    (~10 s of CPU)."""
    tmp = tmp_path_factory.mktemp("dry")

    def one(case):
        script, extra = case
        return _run(script, _env(tmp, DRY_RUN=1, **extra))

    cases = DRY_RUNS + [REFUSED]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = dict(zip(map(_case_id, cases), pool.map(one, cases)))
    results["runs_dir"] = tmp / "runs"
    return results


@pytest.mark.parametrize("case", DRY_RUNS, ids=_case_id)
def test_dry_run_validates_the_exact_command(dry_runs, case):
    script, extra = case
    proc = dry_runs[_case_id(case)]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    command = next(line for line in proc.stdout.splitlines() if line.startswith(f"{script}: command: "))
    module = {"train_grpo": "openrlhf.cli.train_ppo_ray", "eval": "evaluation", "compare": "evaluation"}.get(
        script, "openrlhf_replay.cli.train_ppo_ray")
    assert f" -m {module} " in command
    assert re.search(r"^validate: OK .* -m " + re.escape(module), proc.stdout, re.M), proc.stdout[-2000:]
    if script.startswith("train_"):
        gpus = int(extra.get("NUM_NODES", 1)) * int(extra.get("NUM_GPUS", 8))
        assert f"--vllm.num_engines {gpus} " in command
        assert f"x {gpus} GPUs x " in proc.stdout  # the validator's batch summary
        assert "1024 fresh rollouts per step" in proc.stdout
    if script == "train_grpo_replay" and not extra:
        assert "512 replayed + 1024 fresh rollouts per step after step 20" in proc.stdout
    if script == "train_grpo_exgrpo_replay":  # K from the run's group size, its shaped objective by default
        assert re.search(r"^replay: mode exgrpo \(ExGRPO\), after step 20 one stored success of each of up to 512 "
                         r"questions .* buckets of K = 8 rollouts per prompt; .* off-policy rule exgrpo$",
                         proc.stdout, re.M), proc.stdout[-2000:]
    if script == "train_grpo_success_replay":  # as on a fresh clone: the pool an earlier script makes is missing
        pool = dry_runs["runs_dir"] / "Qwen3-1.7B-Base/success_pool_seed42.npz"
        assert f"note: no success pool at {pool} yet (build_success_pool.sh makes it)" in proc.stdout
        assert f"validate: note: {pool} does not exist yet: not checked" in proc.stdout
        assert command.endswith(f"--replay.success_pool {pool}")
    if extra.get("M2PO"):  # M2PO's rule and AReaL's behaviour-weight cap win over the script's stale
        assert command.endswith("--replay.off_policy m2po --algo.advantage.is_correction_level token "
                                "--algo.advantage.is_correction_mode mask --algo.advantage.is_correction_gating ratio "
                                "--algo.advantage.is_correction_threshold 5.0"), command
        assert "grpo_replay_m2po_seed42" in command


def test_dry_runs_write_nothing(dry_runs):
    assert not dry_runs["runs_dir"].exists()


def test_dry_run_refuses_a_gpu_count_the_batches_do_not_split_over(dry_runs):
    proc = dry_runs[_case_id(REFUSED)]
    assert proc.returncode != 0
    assert "validate: INVALID" in proc.stderr
    assert "multiple of train.micro_batch_size x GPUs = 4 x 3 = 12" in proc.stderr


def test_the_cpu_scripts_dry_run_without_running(tmp_path):
    """The CPU scripts train when run: a dry run of a whole sweep only checks them (a run would
    take minutes, the lab hours: the timeout catches one that starts)."""
    lab = _run("sample_efficiency", _env(tmp_path, DRY_RUN=1), "--quick", "--out-dir", str(tmp_path / "lab"),
               timeout=120)
    assert lab.returncode == 0 and "sample_efficiency: dry run: settings OK" in lab.stdout, lab.stderr[-2000:]
    bad = _run("sample_efficiency", _env(tmp_path, DRY_RUN=1), "--no-such-setting", timeout=120)
    assert bad.returncode == 2 and "unrecognized arguments: --no-such-setting" in bad.stderr
    quick = _run("quickstart_cpu", _env(tmp_path, DRY_RUN=1, RUN_DIR=tmp_path / "quick"), timeout=300)
    assert quick.returncode == 0 and "quickstart: dry run: " in quick.stdout, quick.stdout[-2000:] + quick.stderr[-2000:]
    assert not (tmp_path / "lab").exists() and not (tmp_path / "quick").exists()


def test_bad_settings_fail_before_python(tmp_path):
    proc = _run("train_grpo_replay", _env(tmp_path, DRY_RUN=1, NUM_GPUS="eight"))
    assert proc.returncode != 0 and "NUM_GPUS=eight: must be an integer >= 1" in proc.stderr
    proc = _run("eval", _env(tmp_path, DRY_RUN=1, CHECKPOINT="x", SWEEP=1))
    assert proc.returncode != 0 and "SWEEP=1 takes RUN_DIR or CONDITION" in proc.stderr


# -------------------------------------------------------------------- the real launch path, without training

STUB = """#!{python}
# Stands in for python: records its arguments (one JSON line), writes the validator's JSON,
# fails when STUB_FAIL is set (the validator call excepted). The scripts' prompt count runs for real.
import json, os, sys
argv = sys.argv[1:]
if argv[:2] == ["-m", "openrlhf_replay.cli.prompts"]:
    os.execv(sys.executable, [sys.executable, *argv])
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps(argv) + "\\n")
print("stub:", " ".join(argv[:2]))
if "--resolved-json" in argv:
    open(argv[argv.index("--resolved-json") + 1], "w").write("{{}}")
elif os.environ.get("STUB_FAIL"):
    sys.exit(1)
"""


@pytest.fixture
def stub(tmp_path):
    path = tmp_path / "bin/python"
    path.parent.mkdir()
    path.write_text(STUB.format(python=sys.executable))
    path.chmod(0o755)
    log = tmp_path / "argv.jsonl"

    def env(**extra):
        return _env(tmp_path, PYTHON=path, STUB_LOG=log, **extra)

    def calls():
        lines = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return [json.loads(line) for line in lines]

    env.calls = calls
    env.path = path
    return env


def _flags(argv: list[str]) -> dict[str, list[str]]:
    """`[-m module] --flag v1 v2 --switch` -> {"--flag": ["v1", "v2"], "--switch": []}."""
    flags, current = {}, None
    for word in argv:
        if word.startswith("--"):
            current = flags.setdefault(word, [])
        elif current is not None:
            current.append(word)
    return flags


def _training_argv(stub, script: str) -> list[str]:
    proc = _run(script, stub())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    validator, command = stub.calls()
    assert validator[:2] == ["-m", "openrlhf_replay.cli.validate"]
    assert validator[validator.index("--") + 1:] == [str(stub.path), *command]  # it checked the very command
    return command


def _default_pool(stub) -> Path:
    """Where RLEP's script reads its offline pool by default (build_success_pool.sh writes it)."""
    return Path(stub()["RUNS_DIR"]) / "Qwen3-1.7B-Base/success_pool_seed42.npz"


def test_every_condition_shares_the_baseline_settings(stub):
    pool = _default_pool(stub)
    pool.parent.mkdir(parents=True)
    pool.touch()  # the script checks that it exists; the launcher (not run here) that it is a pool
    commands = {script: _training_argv(stub, script) for script in TRAINING}
    baseline = commands["train_grpo"]
    assert baseline[:2] == ["-m", "openrlhf.cli.train_ppo_ray"]
    flags = _flags(baseline)
    method = {
        "--algo.advantage.estimator": ["group_norm"], "--rollout.n_samples_per_prompt": ["8"],
        "--rollout.batch_size": ["128"], "--train.batch_size": ["256"], "--actor.eps_clip_low_high": ["0.2", "0.28"],
        "--actor.dual_clip": ["10"], "--actor.loss_agg_mode": ["token-mean"], "--actor.adam.lr": ["1e-6"],
        "--actor.adam.weight_decay": ["0.01"], "--actor.max_norm": ["1.0"], "--train.max_epochs": ["1"],
        "--algo.kl.init_coef": ["0"], "--actor.model_name_or_path": ["Qwen/Qwen3-1.7B-Base"],
        "--actor.num_gpus_per_node": ["8"], "--vllm.num_engines": ["8"], "--train.colocate_all": [],
    }
    for flag, values in method.items():
        assert flags[flag] == values, flag
    assert flags["--reward.remote_url"] == [str(ROOT / "evaluation/reward.py")]
    for script, argv in commands.items():
        if script == "train_grpo":
            continue
        assert argv[:2] == ["-m", "openrlhf_replay.cli.train_ppo_ray"]
        condition = script.removeprefix("train_")
        ours = {k: v for k, v in _flags(argv).items() if not k.startswith("--replay.")}
        theirs = {k: [w.replace("/grpo_seed42/", f"/{condition}_seed42/") for w in v] for k, v in flags.items()}
        assert ours == theirs, script  # only the replay flags and the output directory differ
    replay = _flags(commands["train_grpo_replay"])
    for flag, value in {"--replay.mode": "advantage", "--replay.max_age": "10", "--replay.ratio": "0.5",
                        "--replay.alpha": "0.5", "--replay.warmup": "20", "--replay.capacity": "30000"}.items():
        assert replay[flag] == [value], flag
    modes = {s: _flags(a)["--replay.mode"] for s, a in commands.items() if s != "train_grpo"}
    assert modes == {"train_grpo_replay": ["advantage"], "train_grpo_naive_replay": ["naive"],
                     "train_grpo_uniform_replay": ["uniform"], "train_grpo_freshness_replay": ["freshness"],
                     "train_grpo_success_replay": ["success"], "train_grpo_exgrpo_replay": ["exgrpo"]}
    assert _flags(commands["train_grpo_success_replay"])["--replay.success_pool"] == [str(pool)]


def test_rlep_replays_the_grpo_runs_pool_by_default_and_says_how_to_build_it(stub):
    proc = _run("train_grpo_success_replay", stub())
    assert proc.returncode != 0 and stub.calls() == []  # stopped before anything ran
    assert f"no success pool at {_default_pool(stub)}" in proc.stderr
    assert "run train_grpo.sh (to step 60 at least), then build_success_pool.sh" in proc.stderr
    assert "SUCCESS_POOL=in-run" in proc.stderr
    in_run = _run("train_grpo_success_replay", stub(SUCCESS_POOL="in-run"))
    assert in_run.returncode == 0, in_run.stderr
    assert "--replay.success_pool" not in stub.calls()[1]  # the in-run pool, named explicitly


def test_the_pool_script_decodes_the_grpo_checkpoint_after_one_epoch(stub):
    # 7,424 prompts / 128 = 58 steps an epoch; a checkpoint every 20 steps: the first after it is 60
    checkpoint = Path(stub()["RUNS_DIR"]) / "Qwen3-1.7B-Base/grpo_seed42/ckpt/global_step60_hf"
    missing = _run("build_success_pool", stub())
    assert missing.returncode != 0 and f"no seed checkpoint at {checkpoint}" in missing.stderr
    checkpoint.mkdir(parents=True)
    proc = _run("build_success_pool", stub())
    assert proc.returncode == 0, proc.stderr
    [argv] = stub.calls()
    flags = _flags(argv)
    assert argv[:2] == ["-m", "openrlhf_replay.cli.build_success_pool"]
    assert flags["--model"] == [str(checkpoint)] and flags["--out"] == [str(_default_pool(stub))]
    train = _flags(_training_argv(stub, "train_grpo"))  # decoded as GRPO trains: prompts, template, lengths
    assert flags["--prompts"] == train["--data.prompt_dataset"] and flags["--samples-per-prompt"] == ["8"]
    assert flags["--input-template"] == train["--data.input_template"]
    assert flags["--max-samples"] == train["--data.max_samples"]
    assert flags["--max-new-tokens"] == train["--rollout.max_new_tokens"] and flags["--max-len"] == train["--data.max_len"]
    assert _run("build_success_pool", stub(POOL_STEP=40)).returncode != 0  # no checkpoint 40 here


def test_a_dry_run_names_the_checkpoint_an_earlier_script_makes_and_goes_on(stub):
    checkpoint = Path(stub()["RUNS_DIR"]) / "Qwen3-1.7B-Base/grpo_seed42/ckpt/global_step60_hf"
    proc = _run("build_success_pool", stub(DRY_RUN=1))  # a fresh clone: no GRPO run yet
    assert proc.returncode == 0, proc.stderr
    assert f"note: no seed checkpoint at {checkpoint} yet (train_grpo.sh saves it)" in proc.stdout
    assert "build_success_pool: command: " in proc.stdout and not Path(stub()["RUNS_DIR"]).exists()


# (script, environment, shape): shape is nodes, GPUs per node, vLLM engines, and the train and
# rollout micro-batches (by model scale, capped at each GPU's share of the 256-row train batch and
# of the 1,024 rollouts).
SHAPES = [
    ("train_grpo", {"NUM_GPUS": 4}, (1, 4, 4, 4, 8)),
    ("train_grpo_replay", {"NUM_GPUS": 4}, (1, 4, 4, 4, 8)),
    ("train_grpo_replay", {"NUM_NODES": 2, "NUM_GPUS": 8}, (2, 8, 16, 4, 8)),
    ("train_grpo_replay", {"MODEL": "Qwen/Qwen3-0.6B-Base", "NUM_GPUS": 2}, (1, 2, 2, 8, 16)),
    ("train_grpo_replay", {"MODEL": "Qwen/Qwen3-4B-Base"}, (1, 8, 8, 2, 4)),
    ("train_grpo_replay", {"MODEL": "Qwen/Qwen3-0.6B-Base", "NUM_NODES": 4, "NUM_GPUS": 8}, (4, 8, 32, 8, 16)),
]


@pytest.mark.parametrize("script, env, shape", SHAPES, ids=[_case_id((s, e)) for s, e, _ in SHAPES])
def test_gpu_count_and_model_scale_shape_the_command(stub, script, env, shape):
    proc = _run(script, stub(DRY_RUN=1, **env))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [validator] = stub.calls()
    flags = _flags(validator[validator.index("--") + 1:])
    names = ("--actor.num_nodes", "--actor.num_gpus_per_node", "--vllm.num_engines",
             "--train.micro_batch_size", "--rollout.micro_batch_size")
    assert tuple(int(flags[name][0]) for name in names) == shape
    assert f"MICRO_TRAIN_BATCH={shape[3]}\n" in proc.stdout  # the settings the launch prints


def test_training_prompt_renders_as_the_evaluation_plain_template(stub):
    from evaluation.prompting import PLAIN_TEMPLATE, PLACEHOLDER

    template = _flags(_training_argv(stub, "train_grpo"))["--data.input_template"][0]
    problem = r"Find $\frac{1}{2} + x$ if {x} = 3."
    assert template.format(problem) == PLAIN_TEMPLATE.replace(PLACEHOLDER, problem)  # what OpenRLHF does


def test_a_run_records_itself_marks_done_and_is_never_overwritten(stub):
    out = Path(stub()["RUNS_DIR"]) / "Qwen3-1.7B-Base/grpo_replay_seed42"
    proc = _run("train_grpo_replay", stub(), "--logger.wandb.project", "x y")
    assert proc.returncode == 0, proc.stderr
    command = stub.calls()[1]
    assert {p.name for p in out.iterdir()} >= {"command.sh", "settings.env", "resolved_args.json", "train.log", "DONE"}
    assert "stub: -m openrlhf_replay.cli.train_ppo_ray" in (out / "train.log").read_text()
    settings = dict(line.split("=", 1) for line in (out / "settings.env").read_text().splitlines())
    assert settings["NUM_GPUS"] == "8" and settings["MICRO_TRAIN_BATCH"] == "4" and "GIT_COMMIT" in settings
    # command.sh reruns exactly the same argv (the template's newlines and quotes included)
    assert subprocess.run(["bash", str(out / "command.sh")], env=stub(), capture_output=True).returncode == 0
    assert stub.calls() == [command]
    again = _run("train_grpo_replay", stub(), "--logger.wandb.project", "x y")
    assert again.returncode != 0 and "holds a finished run" in again.stderr
    assert stub.calls() == []  # refused before anything ran
    dry = _run("train_grpo_replay", stub(DRY_RUN=1))
    assert dry.returncode != 0 and "holds a finished run" in dry.stderr


def test_a_failed_run_is_not_done_and_resumes_only_with_its_own_command(stub):
    out = Path(stub()["RUNS_DIR"]) / "Qwen3-1.7B-Base/grpo_seed42"
    failed = _run("train_grpo", stub(STUB_FAIL=1))
    assert failed.returncode != 0 and not (out / "DONE").exists() and (out / "command.sh").exists()
    other = _run("train_grpo", stub(), "--actor.adam.lr", "2e-6")
    assert other.returncode != 0 and "unfinished run of another command" in other.stderr
    stub.calls()
    resumed = _run("train_grpo", stub())
    assert resumed.returncode == 0 and (out / "DONE").exists()
    assert "--ckpt.load_enable" in stub.calls()[1]  # a rerun resumes from the last checkpoint


def test_eval_names_its_output_after_the_run_and_marks_done(stub, tmp_path):
    run_dir = tmp_path / "runs/Qwen3-1.7B-Base/grpo_seed42"
    proc = _run("eval", stub(CHECKPOINT=run_dir / "model"))
    assert proc.returncode == 0, proc.stderr
    argv = stub.calls()[0]
    assert argv[:3] == ["-m", "evaluation", "run"]
    flags = _flags(argv[3:])
    out = Path(flags["--output-dir"][0])
    assert out == tmp_path / "runs/Qwen3-1.7B-Base/eval/grpo_seed42"  # the row label in compare's table
    assert flags["--prompt-template"] == ["plain"] and flags["--max-new-tokens"] == ["3072"]
    assert (out / "DONE").exists() and (out / "eval_command.sh").exists()
    assert _run("eval", stub(CHECKPOINT=run_dir / "model")).returncode != 0


def test_a_sweep_of_a_run_still_training_is_not_done(stub, tmp_path):
    proc = _run("eval", stub(CONDITION="grpo_replay", SWEEP=1))
    assert proc.returncode == 0, proc.stderr
    argv = stub.calls()[0]
    assert argv[:3] == ["-m", "evaluation", "sweep"]
    assert _flags(argv[3:])["--checkpoints"] == [str(tmp_path / "runs/Qwen3-1.7B-Base/grpo_replay_seed42/ckpt")]
    assert not (tmp_path / "runs/Qwen3-1.7B-Base/sweep/grpo_replay_seed42/DONE").exists()


def test_compare_takes_the_finished_evaluations_grpo_first(stub, tmp_path):
    eval_root = tmp_path / "runs/Qwen3-1.7B-Base/eval"
    assert _run("compare", stub()).returncode != 0  # nothing evaluated: nothing to compare
    for name in ("grpo_seed42", "Qwen3-1.7B-Base", "grpo_replay_seed42", "grpo_naive_replay_seed42"):
        (eval_root / name).mkdir(parents=True)
        (eval_root / name / "summary.json").write_text("{}")
    proc = _run("compare", stub())
    assert proc.returncode == 0, proc.stderr
    calls = stub.calls()
    flags = _flags(calls[0][3:])
    assert flags["--baseline"] == [str(eval_root / "grpo_seed42")]
    assert flags["--runs"] == [str(eval_root / n) for n in ("Qwen3-1.7B-Base", "grpo_replay_seed42",
                                                             "grpo_naive_replay_seed42")]
    assert "left out" in proc.stderr and "grpo_uniform_replay_seed42" in proc.stderr
    # Then each row's optimizer steps per rollout step, from the rehearsal reports the scripts write.
    assert calls[1][:4] == ["-m", "openrlhf_replay.rehearsal.report", "beside", "--compare"], calls
    assert _flags(calls[1][3:]) == {"--compare": [flags["--output"][0]],
                                    "--rehearsals": [str(tmp_path / "runs/Qwen3-1.7B-Base/rehearsal")]}
    out = Path(flags["--output"][0])
    assert "rehearsal.report beside" in (out / "compare_command.sh").read_text()


def test_a_rehearsal_takes_the_solve_rate_and_keeps_its_report_where_compare_reads_it(stub, tmp_path):
    proc = _run("train_grpo_success_replay", stub(REHEARSE=1, REHEARSE_SOLVE_RATE="0.25"))
    assert proc.returncode == 0, proc.stderr
    (argv,) = stub.calls()
    assert argv[:2] == ["-m", "openrlhf_replay.rehearsal"]
    options = _flags(argv[2:argv.index("--")])
    report = tmp_path / "runs/Qwen3-1.7B-Base/rehearsal/grpo_success_replay_seed42.json"
    assert options == {"--solve-rate": ["0.25"], "--report": [str(report)]}
    assert argv[argv.index("--") + 1:][:3] == [str(stub.path), "-m", "openrlhf_replay.cli.train_ppo_ray"]
    assert _run("train_grpo", stub(REHEARSE=1, SEED=3)).returncode == 0
    (argv,) = stub.calls()  # unset: the rehearsal's own default, and the run's own name
    assert _flags(argv[2:argv.index("--")]) == {
        "--report": [str(tmp_path / "runs/Qwen3-1.7B-Base/rehearsal/grpo_seed3.json")]}


def test_the_image_entry_point_runs_a_script_or_a_command(tmp_path):
    entry = ROOT / "dockerfile/entrypoint.sh"
    listing = subprocess.run(["bash", str(entry)], capture_output=True, text=True)
    names = {p.stem for p in SCRIPTS.glob("*.sh")} - {"common"}
    assert listing.returncode == 0 and names <= set(listing.stdout.split())
    proc = subprocess.run(["bash", str(entry), "compare.sh"], env=_env(tmp_path, DRY_RUN=1), cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "validate: OK" in proc.stdout, proc.stderr
    assert subprocess.run(["bash", str(entry), "echo", "hi"], capture_output=True, text=True).stdout == "hi\n"
