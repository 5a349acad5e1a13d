"""The launcher: every upstream flag unchanged, replay flags added, bad combinations refused early."""
import argparse
import os
import subprocess
import sys
import time

import pytest

from openrlhf_replay.cli.train_ppo_ray import replay_arg_errors
from replay import MODE_REGISTRY, OFF_POLICY_REGISTRY

ACTION_ATTRS = ("option_strings", "dest", "default", "type", "nargs", "const", "choices", "required")


def _actions(parser):
    return {a.dest: a for a in parser._actions if not isinstance(a, argparse._HelpAction)}


def test_every_upstream_flag_is_accepted_with_the_same_meaning(upstream_parser, replay_parser):
    upstream, ours = _actions(upstream_parser), _actions(replay_parser)
    assert len(upstream) > 150  # the real upstream parser, not an empty stand-in
    for dest, action in upstream.items():
        assert dest in ours, f"upstream flag {action.option_strings} missing"
        for attr in ACTION_ATTRS:
            assert getattr(ours[dest], attr) == getattr(action, attr), (dest, attr)
    added = set(ours) - set(upstream)
    assert added and all(d.startswith("replay.") for d in added)
    assert {"replay.mode", "replay.ratio", "replay.max_age", "replay.warmup"} <= added


def test_upstream_command_lines_parse_identically(upstream_parser, replay_parser):
    argv = ["--actor.model_name_or_path", "Qwen/Qwen3-1.7B-Base", "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "8", "--actor.eps_clip_low_high", "0.2", "0.28",
            "--actor.dual_clip", "10", "--train.colocate_all", "--vllm.num_engines", "2"]
    theirs, ours = vars(upstream_parser.parse_args(argv)), vars(replay_parser.parse_args(argv))
    assert {k: v for k, v in ours.items() if not k.startswith("replay.")} == theirs
    assert ours["replay.mode"] == "none"


@pytest.mark.parametrize("extra, fragment", [
    # a critic whose ranks (upstream's default 8) do not divide the policy's (1)
    (["--algo.advantage.estimator", "gae"], "do not divide the policy actor's 1"),
    (["--replay.mode", "success", "--algo.advantage.estimator", "gae", "--critic.num_gpus_per_node", "1"],
     "recomputes group advantages"),
    (["--replay.mode", "success", "--algo.kl.init_coef", "0.01"], "drop the KL penalty"),
    (["--replay.mode", "success", "--replay.success_pool", "/nonexistent/pool.npz", "--algo.kl.init_coef", "0.001",
      "--algo.kl.use_loss"], "holds no reference log-probs"),
    (["--replay.off_policy", "refresh"], "is_correction_level"),
    # upstream's default IS mode masks tokens; docs/METHOD.md's refresh truncates the weight
    (["--replay.off_policy", "refresh", "--algo.advantage.is_correction_level", "token"], "mask drops tokens"),
    (["--replay.off_policy", "m2po"], "M2PO=1 in examples/scripts sets them"),
    (["--replay.off_policy", "m2po", "--algo.advantage.is_correction_level", "seq"], "is_correction_mode mask"),
    (["--replay.ratio", "0.12"], "rounds to 0 whole training batches"),  # 0.12 x 32 = 3.84 < half of 8
    (["--replay.mode", "success", "--replay.success_pool", "/nonexistent/pool.npz"], "no such replay checkpoint"),
    (["--rollout.batch_size", "3"], "multiple of"),
    (["--replay.mode", "success", "--algo.advantage.estimator", "rloo"], "recomputes group advantages"),
    (["--replay.refill"], "add --algo.dynamic_filtering_enable"),  # nothing to refill
    # async filters in its generator actor, which replaces dropped groups: nothing is short
    (["--replay.refill", "--algo.dynamic_filtering_enable", "--train.async_enable"], "nothing to refill"),
    # ExGRPO: an all-correct group must have A = 0 (its retirement marker); K is the run's group size
    (["--replay.mode", "exgrpo", "--algo.advantage.estimator", "reinforce_baseline"], "retirement marker"),
    (["--replay.mode", "exgrpo", "--algo.kl.init_coef", "0.01"], "drop the KL penalty"),
    (["--replay.mode", "exgrpo", "--replay.group_size", "8"], "drop --replay.group_size"),
])
def test_combinations_replay_cannot_run_are_refused(make_args, extra, fragment):
    args = make_args("--replay.mode", "advantage", *extra)
    errors = replay_arg_errors(args)
    assert any(fragment in e for e in errors), errors


@pytest.mark.parametrize("mode", ["advantage", "success", "freshness"])
def test_async_training_runs_with_replay(make_args, mode):
    """Async training (with partial rollouts) is no longer refused: the buffer lives in upstream's
    training actor (docs/METHOD.md section 10)."""
    args = make_args("--replay.mode", mode, "--train.async_enable", "--train.partial_rollout_enable")
    assert replay_arg_errors(args) == []


def test_a_valid_replay_configuration_passes(make_args):
    assert replay_arg_errors(make_args("--replay.mode", "advantage")) == []
    for estimator in ("group_norm", "dr_grpo", "rloo"):  # ExGRPO: an all-correct group has A = 0
        assert replay_arg_errors(make_args("--replay.mode", "exgrpo", "--algo.advantage.estimator", estimator,
                                           "--replay.group_size", "4")) == []
    assert replay_arg_errors(make_args("--replay.mode", "advantage", "--replay.off_policy", "exgrpo")) == []
    assert replay_arg_errors(make_args("--replay.mode", "freshness", "--replay.off_policy", "refresh",
                                       "--algo.advantage.is_correction_level", "token",
                                       "--algo.advantage.is_correction_mode", "clip")) == []
    for mode in ("token", "clip"), ("token", "mask"):  # m2po, with any sampler: either token-level correction
        for replay_mode in ("advantage", "success"):
            assert replay_arg_errors(make_args("--replay.mode", replay_mode, "--replay.off_policy", "m2po",
                                               "--algo.advantage.is_correction_level", mode[0],
                                               "--algo.advantage.is_correction_mode", mode[1],
                                               "--algo.kl.init_coef", "0")) == []
    # ratio 0.125 x 32 fresh = 4 = half a training batch of 8: rounds up to one batch, not refused
    assert replay_arg_errors(make_args("--replay.mode", "advantage", "--replay.ratio", "0.125")) == []
    # a decaying LR schedule: the actor paces it by rollout steps (openrlhf_replay/trainer/lr_schedule.py)
    for mode in ("advantage", "success"):
        assert replay_arg_errors(make_args("--replay.mode", mode, "--actor.lr_scheduler", "cosine_with_min_lr")) == []
    # KL in the reward (upstream's default) and KL as a loss (docs/METHOD.md section 2, "KL")
    assert replay_arg_errors(make_args("--replay.mode", "advantage", "--algo.kl.init_coef", "0.01")) == []
    assert replay_arg_errors(make_args("--replay.mode", "success", "--algo.kl.init_coef", "0.001",
                                       "--algo.kl.use_loss", "--algo.kl.estimator", "k3")) == []
    # dynamic batching: the actor packs replayed rows with the fresh (trainer/ray/dynamic_batch.py)
    assert replay_arg_errors(make_args("--replay.mode", "advantage", "--train.dynamic_batch_enable")) == []
    # a critic (gae): replayed rows' advantages are recomputed against it; groups of one, as PPO's
    for n in ("4", "1"):
        assert replay_arg_errors(make_args("--replay.mode", "advantage", "--algo.advantage.estimator", "gae",
                                           "--critic.num_gpus_per_node", "1", "--rollout.n_samples_per_prompt", n,
                                           "--algo.kl.init_coef", "0.01")) == []
    # dynamic filtering, with and without refill (docs/METHOD.md section 2, "Dynamic filtering")
    for mode in ("advantage", "success"):
        assert replay_arg_errors(make_args("--replay.mode", mode, "--algo.dynamic_filtering_enable")) == []
    assert replay_arg_errors(make_args("--replay.mode", "uniform", "--algo.dynamic_filtering_enable",
                                       "--replay.refill")) == []
    # RLEP cannot refill (its replayed rows join a fresh group of their prompt); replay off has nothing to refill
    for mode, fragment in (("success", "a filtered group has no rows left to join"), ("none", "pick a replay mode")):
        with pytest.raises(ValueError, match=fragment):
            replay_arg_errors(make_args("--replay.mode", mode, "--algo.dynamic_filtering_enable", "--replay.refill"))
    # replay off: nothing is checked, upstream's own rules apply
    assert replay_arg_errors(make_args("--algo.advantage.estimator", "gae")) == []


def _run_cli(*argv):
    env = dict(os.environ, RAY_ADDRESS="")  # a refusal must come before any attempt to reach Ray
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "openrlhf_replay.cli.train_ppo_ray", *argv],
                          capture_output=True, text=True, timeout=300, env=env)
    return proc, time.time() - t0


def test_cli_refuses_before_ray_starts():
    proc, _ = _run_cli("--actor.model_name_or_path", "/nonexistent", "--replay.mode", "advantage",
                       "--algo.advantage.estimator", "gae", "--actor.num_gpus_per_node", "1")
    assert proc.returncode != 0
    assert "cannot run replay with these arguments" in proc.stderr
    assert "the critic's 8 data-parallel ranks" in proc.stderr
    assert "ray.init" not in proc.stderr and "Started a local Ray instance" not in proc.stderr


def test_cli_help_lists_upstream_and_replay_flags():
    proc, _ = _run_cli("--help")
    assert proc.returncode == 0
    for flag in ("--rollout.n_samples_per_prompt", "--algo.advantage.estimator", "--replay.mode",
                 "--replay.max_age", "--replay.off_policy", "--replay.m2_threshold"):
        assert flag in proc.stdout
    # argparse wraps the help, also after a hyphen ("log-prob" may become "log- prob")
    flat = lambda text: " ".join(text.split()).replace("- ", "-")  # noqa: E731
    text = flat(proc.stdout)
    for table in (MODE_REGISTRY, OFF_POLICY_REGISTRY):  # every mode and rule, its choice and its help
        for entry in table.values():
            assert flat(f"{entry.name}: {entry.help}") in text, entry.name
    assert "{" + ",".join(("none", *MODE_REGISTRY)) + "}" in text


def test_launcher_states_the_replay_count_it_will_run(make_args):
    from openrlhf_replay.cli.train_ppo_ray import describe_replay, replay_per_step
    from replay import ReplayConfig

    # 8 prompts x 4 = 32 fresh, training batches of 8: ratio 0.625 -> 20 = 2.5 batches -> 3 (halves up)
    args = make_args("--replay.mode", "advantage", "--replay.ratio", "0.625")
    assert replay_per_step(ReplayConfig.from_namespace(args), args) == 24
    assert "24 replayed + 32 fresh rollouts per step after step 20 (20 rounded to whole" in describe_replay(args)
    success = make_args("--replay.mode", "success", "--replay.per_prompt", "2")
    assert replay_per_step(ReplayConfig.from_namespace(success), success) == 16
    assert ("up to 2 successes of each of the 8 prompts (min of that and its stored successes) join its group of 4 "
            "after step 20, from the in-run pool") in describe_replay(success)
    assert "(at most 16 rows); pi_old of replayed rows: recompute" in describe_replay(success)
    offline = make_args("--replay.mode", "success", "--replay.success_pool", "pool.npz")
    assert "join its group of 4 from the first step, from the offline pool pool.npz (no warm-up" in describe_replay(offline)
    # RLEP's count is never cut to whole batches: one success per prompt still replays
    odd = make_args("--replay.mode", "success", "--replay.per_prompt", "1", "--train.batch_size", "32")
    assert replay_arg_errors(odd) == [] and replay_per_step(ReplayConfig.from_namespace(odd), odd) == 32


def test_cli_rejects_a_bad_replay_value_with_its_name():
    proc, _ = _run_cli("--actor.model_name_or_path", "x", "--replay.mode", "advantage", "--replay.ratio", "-1")
    assert proc.returncode != 0 and "ratio" in proc.stderr and "-1" in proc.stderr
