"""`python -m openrlhf_replay.cli.train_ppo_ray`: upstream's GRPO/PPO launcher plus `--replay.*`.

Upstream keeps its parser and argument checks inline under `if __name__ == "__main__"` of
`openrlhf/cli/train_ppo_ray.py` (0.11.2 has no `get_parser()`). Rather than copy ~600 lines, this
runs that very module with three seams:

1. when its parser parses, the replay flags are added to it first (every upstream flag is
   untouched, and `--help` lists both);
2. when it nests the parsed flags (`openrlhf.utils.config.hierarchize`), the replay settings are
   checked against the rest, so a configuration replay cannot run fails before Ray starts;
3. with replay on, the controller and policy actor classes it looks up resolve to the replay
   subclasses. With `--replay.mode none` (the default) the run is upstream's but for one thing:
   its controller resumes from a checkpoint taken on an episode's last step in the next episode,
   where upstream's walks that episode again (`openrlhf_replay/trainer/resume.py`).

On a machine without CUDA (or with `OPENRLHF_REPLAY_DEVICE=cpu`) the CPU platform
(`openrlhf_replay.cpu`) is switched on first, and the arguments are also checked against it.
A failure inside a Ray worker ends the run with a one-line summary after Ray's traceback.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import runpy
import signal
import sys
import traceback

from openrlhf_replay.cli.prompts import partial_batch_errors, prompt_file_problems
from openrlhf_replay.cpu import CpuPlatformError
from openrlhf_replay.cpu import launcher as cpu_launcher
from openrlhf_replay.utils import check_openrlhf_version, data_parallel_ranks
from replay import ReplayConfig, replay_target
from replay.pool import SuccessPoolError, load_pool

# Upstream's modules, this project's trainer classes (which import them) and Ray are imported
# where they are used: after `_start` has activated the CPU platform, whose hooks adapt upstream
# modules as they are first imported.

UPSTREAM_CLI = "openrlhf.cli.train_ppo_ray"
# Input files that a step not run yet will make (a sweep's dry run: RLEP's pool, decoded from the
# GRPO run's checkpoint): `validate --pending` names them, and a missing one is not an error there.
PENDING_FILES: frozenset[str] = frozenset()


ENVIRONMENT_HELP = """environment (read by this launcher, not by upstream's):
  OPENRLHF_REPLAY_DEVICE=auto|cpu|cuda   cpu runs the CPU platform (openrlhf_replay/cpu); auto (the
                                         default) uses it where no CUDA device is found
  OPENRLHF_REPLAY_CPU_DTYPE=auto|bf16|fp32
                                         compute dtype of every CPU process: auto (the default) is bf16
                                         where the CPU has avx512_bf16 / amx_bf16, fp32 elsewhere
                                         (emulated bf16 is ~100x slower); printed at start-up"""


def add_replay_cli(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The replay flags, and the launcher's environment variables in `--help`."""
    ReplayConfig.add_cli_args(parser)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ENVIRONMENT_HELP
    return parser


class _ParserCaptured(Exception):
    def __init__(self, parser):
        super().__init__("parser captured")
        self.parser = parser


@contextlib.contextmanager
def _patched(owner, name, value):
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield original
    finally:
        setattr(owner, name, original)


def build_parser(with_replay: bool = True) -> argparse.ArgumentParser:
    """Upstream's real `train_ppo_ray` parser, optionally with the replay flags; nothing is trained."""
    def capture(parser, args=None, namespace=None):
        if with_replay:
            add_replay_cli(parser)
        raise _ParserCaptured(parser)

    with _patched(argparse.ArgumentParser, "parse_args", capture):
        try:
            runpy.run_module(UPSTREAM_CLI, run_name="__main__")
        except _ParserCaptured as captured:
            return captured.parser
    raise RuntimeError(f"{UPSTREAM_CLI} finished without parsing arguments: the seam moved")


def replay_arg_errors(args) -> list[str]:
    """What in the (nested) upstream arguments keeps replay from running, each with its fix."""
    config = ReplayConfig.from_namespace(args)
    if not config.enabled:
        return skip_errors(args, config)
    errors = skip_errors(args, config) + _training_errors(args, config) + _batch_errors(args)
    errors += partial_batch_errors(args)
    errors += prompt_file_problems(args)[0]
    errors += success_pool_errors(config)
    return errors + _nothing_replayed(args, config)


def _training_errors(args, config: ReplayConfig) -> list[str]:
    """Upstream training features replay cannot run with (the mode's own refusals, its entry's
    `launch_errors`: e.g. KL in the reward or another estimator under RLEP; critic ranks that would
    not get equal shares, refill in async training, refresh without upstream's clipped IS
    correction), and refill without dynamic filtering. Any LR schedule
    runs (the actor and critic pace it by rollout steps, `openrlhf_replay/trainer/lr_schedule.py`), and
    so do dynamic batching (`openrlhf_replay/trainer/ray/dynamic_batch.py`), dynamic filtering (a short
    fresh batch is completed by inert rows, `experience_maker.py:share_for_ranks`), a critic (`gae`:
    replayed rows' advantages are recomputed against the current critic,
    `openrlhf_replay/trainer/ppo_utils/critic.py`) and async training (the buffer in its training
    actor, `openrlhf_replay/trainer/ppo_trainer_async.py`)."""
    errors = config.entry.launch_errors(config, args)  # the mode's own: e.g. an estimator it cannot run with
    if config.group_size is not None and config.group_size != args.rollout.n_samples_per_prompt:
        errors.append(f"--replay.group_size {config.group_size} is K, the run's rollouts per prompt, which are "
                      f"--rollout.n_samples_per_prompt {args.rollout.n_samples_per_prompt}: drop --replay.group_size "
                      "(the trainer fills it)")
    errors += _critic_rank_errors(args)
    if config.refill and not args.algo.dynamic_filtering_enable:
        errors.append("--replay.refill fills the prompt groups dynamic filtering drops with replayed rollouts, and "
                      "dynamic filtering is off: add --algo.dynamic_filtering_enable (and its "
                      "--algo.dynamic_filtering_range), or drop --replay.refill")
    if config.refill and args.train.async_enable:
        errors.append("--replay.refill with --train.async_enable: async filters in its generator actor, which runs "
                      "upstream's replacement of dropped groups and hands the trainer full batches, so there is "
                      "nothing to refill; drop --replay.refill (or --train.async_enable)")
    kl_on = args.algo.kl.init_coef > 0  # KL in the reward or as a loss: docs/METHOD.md section 2, "KL"
    if kl_on and args.algo.kl.use_loss and config.success_pool:
        errors.append("--replay.success_pool: an offline pool holds no reference log-probs for KL as a loss; "
                      "leave it unset (the in-run pool) or pass --algo.kl.init_coef 0")
    errors += off_policy_errors(args, config)
    return errors


def skip_errors(args, config: ReplayConfig) -> list[str]:
    """Pre-rollout skipping reads each group's rewards in the samples generator: they must come
    from a reward function there, not from a reward model scored later."""
    if config.skip and not args.reward.remote_url:
        return ["--replay.skip keeps each prompt's history from the rewards the generator receives, and this run "
                "scores with a reward model after generation: pass a reward function (--reward.remote_url "
                "<file>.py) or drop --replay.skip"]
    return []


def describe_skip(config: ReplayConfig) -> str:
    return (f"replay.skip: a prompt whose last r groups were zero-variance of one kind is generated with "
            f"probability max(p ** r, 0.01), p from {config.skip_explore} within [{config.skip_explore_min}, "
            f"{config.skip_explore_max}], steered toward {config.skip_target:g} zero-variance groups")


def _critic_rank_errors(args) -> list[str]:
    """With a critic, upstream hands its group the policy actors' list in contiguous chunks too: each
    critic rank must get whole policy-rank chunks (same fresh and replayed share, same optimizer
    steps), so its data-parallel ranks must divide the policy's."""
    if args.algo.advantage.estimator != "gae":
        return []
    per_group = args.ds.ring_attn_size * args.ds.tensor_parallel_size
    actor, critic = data_parallel_ranks(args), args.critic.num_nodes * args.critic.num_gpus_per_node // per_group
    if critic >= 1 and actor % critic == 0:
        return []
    return [f"the critic's {critic} data-parallel ranks (--critic.num_nodes x --critic.num_gpus_per_node, upstream's "
            f"default 1 x 8) do not divide the policy actor's {actor}, so its ranks would get unequal shares of the "
            f"fresh and replayed rows; pass --critic.num_nodes {args.actor.num_nodes} --critic.num_gpus_per_node "
            f"{args.actor.num_gpus_per_node}"]


def off_policy_errors(args, config: ReplayConfig) -> list[str]:
    """An off-policy rule that weighs replayed tokens by pi_old / pi_behaviour (its registry entry's
    `corrections`) without upstream's IS correction that computes that weight."""
    rule, correction = config.off_policy_rule, args.algo.advantage
    have = (correction.is_correction_level, correction.is_correction_mode, correction.is_correction_gating)
    if not rule.corrections or have in rule.corrections:
        return []
    wanted = " or ".join(f"--algo.advantage.is_correction_level {level} --algo.advantage.is_correction_mode {mode} "
                         f"--algo.advantage.is_correction_gating {gating}" for level, mode, gating in rule.corrections)
    return [f"--replay.off_policy {rule.name} weighs each replayed token by an importance weight pi_old / pi_behaviour "
            f"(docs/METHOD.md); upstream does that with {wanted} (got {' / '.join(have)})"
            + (": mask drops tokens instead of truncating their weight" if have[1] == "mask" else "")
            + (f"; {rule.corrections_hint}" if rule.corrections_hint else "")]


def _batch_errors(args) -> list[str]:
    """Fresh rollouts that do not split evenly over the ranks or into training batches."""
    errors = []
    ranks = data_parallel_ranks(args)
    fresh = args.rollout.batch_size * args.rollout.n_samples_per_prompt
    if fresh % (args.rollout.micro_batch_size * ranks):
        errors.append(f"{fresh} fresh rollouts per step (rollout.batch_size x n_samples_per_prompt) do not split into "
                      f"micro-batches of --rollout.micro_batch_size {args.rollout.micro_batch_size} evenly over "
                      f"{ranks} data-parallel ranks; make it a multiple of {args.rollout.micro_batch_size * ranks}")
    if fresh % args.train.batch_size:
        errors.append(f"{fresh} fresh rollouts per step are not a whole number of --train.batch_size "
                      f"{args.train.batch_size} batches; make rollout.batch_size x n_samples_per_prompt a multiple of it")
    return errors


def replay_per_step(config: ReplayConfig, args) -> int:
    """Rows each step adds for replay once the buffer holds enough: `replay_target` for a batch of
    `rollout.batch_size` prompt groups, completed to whole training batches (RLEP's inert rows), so
    every data-parallel rank runs the same number of optimizer steps."""
    fresh = args.rollout.batch_size * args.rollout.n_samples_per_prompt
    target = replay_target(config, fresh, args.rollout.batch_size, args.train.batch_size)
    return -(-target // args.train.batch_size) * args.train.batch_size


def _nothing_replayed(args, config: ReplayConfig) -> list[str]:
    """Replay that rounds to 0 whole training batches a step."""
    if replay_per_step(config, args) > 0:
        return []
    fresh = args.rollout.batch_size * args.rollout.n_samples_per_prompt
    wanted = config.entry.count_text(config, args.rollout.batch_size, fresh)
    return [f"{wanted} rounds to 0 whole training batches of --train.batch_size {args.train.batch_size} "
            "(halves round up): replay more per step, or use a smaller --train.batch_size"]


def success_pool_errors(config: ReplayConfig) -> list[str]:
    """An offline RLEP pool that cannot be loaded or held, before Ray starts. Whether it belongs to
    the run's tokenizer and prompts is checked where those are loaded (the trainer's start)."""
    if not config.success_pool:
        return []
    if not os.path.exists(config.success_pool) and os.path.realpath(config.success_pool) in PENDING_FILES:
        return []
    try:
        pool = load_pool(config.success_pool)
    except SuccessPoolError as e:
        return [f"--replay.success_pool: {e}"]
    if len(pool.rollouts) > config.capacity:
        return [f"--replay.success_pool {config.success_pool} holds {len(pool.rollouts)} successes, more than "
                f"--replay.capacity {config.capacity}: pass --replay.capacity {len(pool.rollouts)}"]
    return []


def describe_replay(args) -> str:
    config = ReplayConfig.from_namespace(args)
    fresh = args.rollout.batch_size * args.rollout.n_samples_per_prompt
    k = replay_per_step(config, args)
    wanted = replay_target(config, fresh, args.rollout.batch_size)
    note = "" if k == wanted else (
        f" ({wanted} rounded to whole --train.batch_size {args.train.batch_size} batches, halves up, so every rank "
        "runs the same optimizer steps)")
    refill = (" (with dynamic filtering, of the fresh rollouts kept); with --replay.refill, replayed rollouts "
              "also take the rows of the groups it drops (inert rows where the buffer has none)") \
        if config.refill else (" (with dynamic filtering, of the fresh rollouts kept)"
                               if args.algo.dynamic_filtering_enable else "")
    common = (f"replay: mode {config.mode}, {k} replayed + {fresh} fresh rollouts per step after step "
              f"{config.warmup}{note}{refill}")
    return config.entry.describe(config, args, k, common)  # the common line, unless the mode has its own


def _install_replay_classes(stack: contextlib.ExitStack) -> None:
    import openrlhf.trainer.ppo_trainer as upstream_trainer
    import openrlhf.trainer.ppo_trainer_async as upstream_async
    import openrlhf.trainer.ray.ppo_actor as upstream_actor
    import openrlhf.trainer.ray.ppo_critic as upstream_critic

    from openrlhf_replay.trainer.ppo_trainer import ReplayPPOTrainer
    from openrlhf_replay.trainer.ppo_trainer_async import ReplayPPOTrainerAsync
    from openrlhf_replay.trainer.ray.ppo_actor import ReplayPolicyModelActor
    from openrlhf_replay.trainer.ray.ppo_critic import ReplayCriticModelActor

    # `train()` imports PPOTrainer (or, with --train.async_enable, PPOTrainerAsync) from its module
    # at call time; the upstream CLI module binds PolicyModelActor and CriticModelActor when it is
    # executed, which happens after this.
    stack.enter_context(_patched(upstream_trainer, "PPOTrainer", ReplayPPOTrainer))
    stack.enter_context(_patched(upstream_async, "PPOTrainerAsync", ReplayPPOTrainerAsync))
    stack.enter_context(_patched(upstream_actor, "PolicyModelActor", ReplayPolicyModelActor))
    stack.enter_context(_patched(upstream_critic, "CriticModelActor", ReplayCriticModelActor))


def _install_resume_classes(stack: contextlib.ExitStack) -> None:
    """Replay off: upstream's controllers, with the resume of `resume.py` (their one departure)."""
    import openrlhf.trainer.ppo_trainer as upstream_trainer
    import openrlhf.trainer.ppo_trainer_async as upstream_async

    from openrlhf_replay.trainer.resume import ResumePPOTrainer, ResumePPOTrainerAsync

    stack.enter_context(_patched(upstream_trainer, "PPOTrainer", ResumePPOTrainer))
    stack.enter_context(_patched(upstream_async, "PPOTrainerAsync", ResumePPOTrainerAsync))


def main(argv: list[str] | None = None) -> None:
    argv, cpu_on, replay_on = _start(sys.argv[1:] if argv is None else list(argv))

    import openrlhf.utils.config as upstream_config

    original_parse = argparse.ArgumentParser.parse_args

    def parse_with_replay(parser, args=None, namespace=None):
        argparse.ArgumentParser.parse_args = original_parse  # one parse only: later parsers are not ours
        add_replay_cli(parser)
        return original_parse(parser, argv, namespace)

    with contextlib.ExitStack() as stack:
        (_install_replay_classes if replay_on else _install_resume_classes)(stack)
        stack.enter_context(_patched(argparse.ArgumentParser, "parse_args", parse_with_replay))
        stack.enter_context(_patched(upstream_config, "hierarchize",
                                     _checked(upstream_config.hierarchize, cpu_on, replay_on)))
        try:
            runpy.run_module(UPSTREAM_CLI, run_name="__main__")
        except CpuPlatformError as e:
            sys.exit(f"train_ppo_ray: {e}")
        except Exception as e:
            summary = _ray_failure_summary(e)
            if summary is None:
                raise
            traceback.print_exc()
            sys.exit(summary)
        finally:
            _shutdown_ray()


def _start(argv: list[str]) -> tuple[list[str], bool, bool]:
    """Checks and settings that precede any upstream import: the pinned OpenRLHF version, SIGTERM
    as an exit (so the Ray instance the driver started is stopped), the CPU platform (it adapts
    modules as they are imported), and whether replay is on (the class swap precedes the upstream
    module's own imports). Returns (argv, CPU platform on, replay on)."""
    try:
        check_openrlhf_version()
    except RuntimeError as e:
        sys.exit(f"train_ppo_ray: {e}")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        cpu_on = cpu_launcher.activate()
    except CpuPlatformError as e:
        sys.exit(f"train_ppo_ray: {e}")
    if cpu_on:
        print(cpu_launcher.describe(), flush=True)
    early, _ = ReplayConfig.add_cli_args(argparse.ArgumentParser(add_help=False)).parse_known_args(argv)
    try:
        replay_on = ReplayConfig.from_namespace(early).active  # replay, or skipping alone: the replay controller
    except ValueError as e:
        sys.exit(f"train_ppo_ray: {e}")
    return argv, cpu_on, replay_on


def _checked(hierarchize, cpu_on: bool, replay_on: bool):
    """Upstream's `hierarchize`, followed by the launch checks: a refused run exits with every
    reason and its fix; an accepted replay run prints what it will replay and the prompt notes."""
    def checked_hierarchize(flat):
        nested = hierarchize(flat)
        try:
            errors = replay_arg_errors(nested)
        except ValueError as e:  # a replay flag with a bad value
            errors = [str(e)]
        cpu_errors = cpu_launcher.arg_errors(nested) if cpu_on else []
        report = [f"train_ppo_ray: cannot run {what} with these arguments:\n  - " + "\n  - ".join(found)
                  for what, found in (("replay", errors), ("on the CPU platform", cpu_errors)) if found]
        if report:
            sys.exit("\n".join(report))
        config = ReplayConfig.from_namespace(nested) if replay_on else None
        if config is not None and config.skip:
            print(describe_skip(config), flush=True)
        if config is not None and config.enabled:
            print(describe_replay(nested), flush=True)
            for note in prompt_file_problems(nested)[1]:
                print(f"train_ppo_ray: note: {note}", flush=True)
        return nested

    return checked_hierarchize


def _ray_failure_summary(error: BaseException) -> str | None:
    """One paragraph naming the worker step that failed and its cause; None if not a Ray failure."""
    import ray

    if not isinstance(error, ray.exceptions.RayError):
        return None
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    cause = next((line for line in reversed(lines) if not line.startswith(("File ", "^", "~"))), type(error).__name__)
    died = re.search(r"class_name: (\S+)\s+actor_id: \S+\s+pid: (\d+)", text)
    if died:  # Ray's own line blames the OOM killer or `ray stop`; name the process instead
        cause = f"the Ray actor {died[1]} (pid {died[2]}) died: it was killed (a signal, the OOM killer) or crashed"
    hint = "rerun the same command with --ckpt.load_enable to resume from the last complete checkpoint"
    if "No space left on device" in text:
        hint = "the disk is full: free space on it, then " + hint
    where = getattr(error, "function_name", None) or type(error).__name__
    logs = "/tmp/ray/session_latest/logs"
    node = getattr(ray._private.worker, "_global_node", None)  # Ray-internal: the session of this driver
    if node is not None:
        logs = os.path.join(node.get_session_dir_path(), "logs")
    return (f"train_ppo_ray: a step failed inside a Ray worker ({where}): {cause}\n"
            f"  Fix: {hint}. The full traceback is above; each worker's log is under {logs}.")


def _shutdown_ray() -> None:
    """Stop the Ray instance this process started (its workers, vLLM engines among them)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


if __name__ == "__main__":
    main()
