"""`python -m openrlhf_replay.cli.validate -- <command>`: check a launch command without running it.

`<command>` is the exact command line a launch script would run, interpreter included, e.g.
`python -m openrlhf_replay.cli.train_ppo_ray --actor.model_name_or_path ...`. Three commands are
known:

- `-m openrlhf.cli.train_ppo_ray` (upstream GRPO) and `-m openrlhf_replay.cli.train_ppo_ray`
  (ours): the real launcher module runs, with its real parser, `hierarchize`, its inline argument
  checks and rewrites (and, for ours, the replay checks of `replay_arg_errors`), and is stopped at
  the first line of upstream's `train()`, before Ray starts or any model is loaded. Then the
  checks that upstream, DeepSpeed or vLLM make only after Ray has started (`launch_errors`).
- `-m evaluation run|sweep|compare`: parsed with the evaluation CLI's own parser; `run` and
  `sweep` options go through `RunOptions`' checks.

Prints `validate: OK ...` (exit 0) or `validate: INVALID ...` with every error found (exit 1).
`--resolved-json PATH` writes the settings the command would run with (for training: upstream's
nested arguments after its own rewrites).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import importlib.util
import json
import os
import runpy
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from evaluation.cli import build_parser
from evaluation.prompting import TEMPLATE_CHOICES
from evaluation.runner import RunOptions
from infra.errors import UserError
from openrlhf_replay.cli import train_ppo_ray
from openrlhf_replay.cli.prompts import partial_batch_errors, prompt_file_problems
from openrlhf_replay.cli.train_ppo_ray import UPSTREAM_CLI, _patched
from openrlhf_replay.cpu import DEVICE_ENV
from openrlhf_replay.trainer.ppo_utils.success_pool import dry_run_pool_errors
from openrlhf_replay.utils import data_parallel_ranks, world_size

# Deferred: Ray, upstream's modules and transformers load only inside a check that needs them,
# after the CPU platform (when on) has installed the hooks that adapt them as they are imported.

REPLAY_CLI = "openrlhf_replay.cli.train_ppo_ray"
EVALUATION_CLI = "evaluation"
DATA_FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".arrow", ".py")


class Invalid(Exception):
    """The command cannot run; `errors` says why, each with its fix where there is one."""
    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass
class Report:
    """What a valid command resolves to."""
    summary: str
    """One line for the user: what would run."""
    settings: dict
    """The resolved settings (JSON-serialisable)."""
    notes: list[str] = field(default_factory=list)
    """Things worth knowing that do not stop the run (e.g. values upstream rewrote)."""


# -------------------------------------------------------------------- the command line


def split_command(command: list[str]) -> tuple[str, list[str]]:
    """(module, its arguments) of `[python] -m <module> args...`."""
    try:
        at = command.index("-m")
    except ValueError:
        raise Invalid([f"not a `python -m <module> ...` command: {' '.join(command[:3])} ..."]) from None
    if at + 1 >= len(command):
        raise Invalid(["`-m` without a module name"])
    return command[at + 1], command[at + 2:]


# -------------------------------------------------------------------- training


class _ReachedTrain(BaseException):
    """Raised at the first line of upstream's `train(args)`: every check before it has passed.
    A BaseException, so that no `except Exception` on the way up can take it for a failure."""
    def __init__(self, nested_args):
        super().__init__("reached train()")
        self.nested_args = nested_args


@contextlib.contextmanager
def _stop_at_train():
    """Stop upstream's `__main__` where `train(args)` begins; refuse to ever start Ray."""
    import ray

    upstream_file = os.path.realpath(importlib.util.find_spec(UPSTREAM_CLI).origin)
    original = ray.is_initialized

    def is_initialized():
        caller = sys._getframe(1)
        if caller.f_code.co_name == "train" and os.path.realpath(caller.f_code.co_filename) == upstream_file:
            raise _ReachedTrain(caller.f_locals["args"])
        return original()

    def no_ray(*args, **kwargs):
        raise RuntimeError("validate: upstream's train() no longer starts with ray.is_initialized(), so the dry "
                           "run could not stop before Ray; update openrlhf_replay/cli/validate.py")

    with _patched(ray, "is_initialized", is_initialized), _patched(ray, "init", no_ray):
        yield


@contextlib.contextmanager
def _env_default(name: str, value: str):
    """`os.environ[name]` = value unless set, for the duration of the block."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


@contextlib.contextmanager
def pending_files(paths):
    """For the duration of the block, the checks that read one of `paths` (input files an earlier
    step makes, e.g. RLEP's pool) skip it while it does not exist; yields the missing ones."""
    missing = frozenset(os.path.realpath(path) for path in paths if not os.path.exists(path))
    with _patched(train_ppo_ray, "PENDING_FILES", missing):
        yield missing


def _parser_error(parser, message):
    raise Invalid([f"{parser.prog}: {message}"])


def resolve_training(module: str, argv: list[str]):
    """Run the launcher `module` on `argv` up to upstream's `train()`: (the nested arguments it
    would train with, the same before upstream's inline rewrites). `Invalid` if it refuses them."""
    import openrlhf.utils.config as upstream_config

    raw = {}
    original_hierarchize = upstream_config.hierarchize

    def recording_hierarchize(flat):
        nested = original_hierarchize(flat)
        raw["args"] = copy.deepcopy(nested)  # before upstream's inline checks rewrite it
        return nested

    try:
        # The launch scripts target GPU nodes: check them as the CUDA platform also on a machine
        # without a GPU (where our launcher would otherwise switch to its CPU platform and its
        # checks), unless the caller chose a platform.
        with _env_default(DEVICE_ENV, "cuda"), _patched(sys, "argv", [module, *argv]), \
                _patched(argparse.ArgumentParser, "error", _parser_error), \
                _patched(upstream_config, "hierarchize", recording_hierarchize), _stop_at_train():
            if module == UPSTREAM_CLI:
                runpy.run_module(UPSTREAM_CLI, run_name="__main__")
            else:
                train_ppo_ray.main(argv)
    except _ReachedTrain as reached:
        return reached.nested_args, raw.get("args")
    except SystemExit as e:  # ours refuses replay settings with sys.exit(message)
        raise Invalid([str(e.code)]) from None
    except AssertionError as e:  # upstream's inline checks
        raise Invalid([f"upstream check: {e}"]) from None
    raise Invalid([f"{module} finished without reaching train(): nothing would be trained"])


def check_training(module: str, argv: list[str]) -> Report:
    """Run the launcher `module` on `argv` up to upstream's `train()`, then the launch checks."""
    args, raw = resolve_training(module, argv)
    errors = launch_errors(args)
    if errors:
        raise Invalid(errors)
    before, after = flatten_args(raw), flatten_args(args)
    notes = [f"upstream set {k}: {before.get(k)!r} -> {after[k]!r}" for k in sorted(after)
             if _plain(before.get(k)) != _plain(after[k])]
    notes += prompt_file_problems(args)[1]
    return Report(_describe_batches(args), _to_dict(args), notes)


def launch_errors(args) -> list[str]:
    """What would fail only after Ray has started (upstream's `train()`, DeepSpeed, vLLM, the
    data and reward loaders), checked from the nested arguments upstream's CLI hands to `train()`."""
    errors = []
    world = world_size(args)
    # Upstream checks these with `assert`, which `python -O` removes: checked here explicitly.
    n, estimator = args.rollout.n_samples_per_prompt, args.algo.advantage.estimator
    if estimator in ("rloo", "reinforce_baseline", "group_norm", "dr_grpo") and n <= 1:
        errors.append(f"--algo.advantage.estimator {estimator} compares samples of one prompt: "
                      f"--rollout.n_samples_per_prompt must be > 1, got {n}")
    ranks = data_parallel_ranks(args)
    if n * args.rollout.batch_size // args.rollout.micro_batch_size < ranks:
        errors.append(f"{n * args.rollout.batch_size} rollouts per step in micro-batches of --rollout.micro_batch_size "
                      f"{args.rollout.micro_batch_size} leave some of the {ranks} ranks without one; use a smaller "
                      "micro-batch or fewer GPUs")
    engines, vllm_tp = args.vllm.num_engines or 0, args.vllm.tensor_parallel_size
    if engines < 1:
        errors.append("--vllm.num_engines must be >= 1: OpenRLHF 0.11.2 generates rollouts only with vLLM")
    elif args.train.colocate_all and not args.train.async_enable and world != engines * vllm_tp:
        errors.append(f"--train.colocate_all puts one vLLM GPU on each actor GPU: actor.num_nodes x "
                      f"num_gpus_per_node = {world} must equal vllm.num_engines x tensor_parallel_size = "
                      f"{engines} x {vllm_tp}")
    # DeepSpeed: train_batch_size = micro x gradient accumulation x world size, exactly.
    ds_batch = args.train.batch_size * args.ds.ring_attn_size * args.ds.tensor_parallel_size
    per_micro_step = args.train.micro_batch_size * world
    if ds_batch % per_micro_step:
        errors.append(f"--train.batch_size {args.train.batch_size} is not a whole number of micro-batches over the "
                      f"ranks: DeepSpeed needs it to be a multiple of train.micro_batch_size x GPUs = "
                      f"{args.train.micro_batch_size} x {world} = {per_micro_step}")
    if args.ds.zero_stage not in (0, 1, 2, 3):
        errors.append(f"--ds.zero_stage {args.ds.zero_stage}: DeepSpeed ZeRO stages are 0, 1, 2, 3")
    from transformers import SchedulerType

    valid = [s.value for s in SchedulerType]
    if args.actor.lr_scheduler not in valid:
        errors.append(f"--actor.lr_scheduler {args.actor.lr_scheduler!r} is not a transformers scheduler; "
                      f"valid: {', '.join(valid)}")
    for url in args.reward.remote_url or []:
        if url.endswith(".py") and not os.path.isfile(url):
            errors.append(f"--reward.remote_url {url}: no such reward file")
    for dataset in (args.data.prompt_dataset or "").split(","):
        path = dataset.split("@")[0].strip()
        if path.endswith(DATA_FILE_SUFFIXES) and not os.path.exists(path):
            errors.append(f"--data.prompt_dataset {path}: no such file (every node reads the same path)")
    errors += partial_batch_errors(args)
    errors += prompt_file_problems(args)[0]
    if getattr(getattr(args, "replay", None), "success_pool", None):

        errors += dry_run_pool_errors(args)
    if not args.data.prompt_dataset:
        errors.append("--data.prompt_dataset is required: the prompts to generate rollouts from")
    if not args.actor.model_name_or_path:
        errors.append("--actor.model_name_or_path is required")
    return errors


def _describe_batches(args) -> str:
    world = world_size(args)
    prompts, n = args.rollout.batch_size, args.rollout.n_samples_per_prompt
    fresh = prompts * n
    accumulation = args.train.batch_size // (args.train.micro_batch_size * world)
    return (f"{prompts} prompts x {n} = {fresh} fresh rollouts per step; train batch {args.train.batch_size} = "
            f"micro {args.train.micro_batch_size} x {world} GPUs x {accumulation} accumulation, "
            f"{fresh // args.train.batch_size} optimizer steps per step on fresh rollouts; "
            f"{args.vllm.num_engines} vLLM engine(s) x TP {args.vllm.tensor_parallel_size}"
            f"{', colocated' if args.train.colocate_all else ''}")


def flatten_args(ns, prefix: str = "") -> dict:
    if ns is None:
        return {}
    out = {}
    for k, v in vars(ns).items():
        if isinstance(v, SimpleNamespace):
            out.update(flatten_args(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _to_dict(ns) -> dict:
    return {k: _to_dict(v) if isinstance(v, SimpleNamespace) else v for k, v in vars(ns).items()}


# -------------------------------------------------------------------- evaluation


def check_evaluation(argv: list[str]) -> Report:
    """Parse with the evaluation CLI's parser; `run` / `sweep` options through `RunOptions`."""
    with _patched(argparse.ArgumentParser, "error", _parser_error):
        args = build_parser().parse_args(argv)
    notes = []
    if args.command == "compare":
        missing = [d for d in [args.baseline, *args.runs] if not (Path(d) / "summary.json").is_file()]
        notes += [f"{d} holds no summary.json yet (not a finished `run`)" for d in missing]
        return Report(f"compare {len(args.runs)} run(s) against {args.baseline} -> {args.output}", vars(args), notes)
    names = [f.name for f in dataclasses.fields(RunOptions)]
    values = {n: getattr(args, n) for n in names if hasattr(args, n)}
    if args.command == "sweep":
        values["model"] = "<sweep>"
    errors = []
    try:
        opts = RunOptions(**values)
        benchmarks = opts.benchmark_names
    except UserError as e:
        raise Invalid([str(e)]) from None
    if opts.prompt_template not in TEMPLATE_CHOICES and not Path(opts.prompt_template).is_file():
        errors.append(f"--prompt-template {opts.prompt_template}: not one of {', '.join(TEMPLATE_CHOICES)} "
                      "and not an existing file")
    if opts.data_dir and not Path(opts.data_dir).is_dir():
        errors.append(f"--data-dir {opts.data_dir}: no such directory")
    if errors:
        raise Invalid(errors)
    source = args.checkpoints if args.command == "sweep" else opts.model
    if not Path(source).exists():
        notes.append(f"{source} does not exist yet (a hub id, or a run still to come)")
    decoding = ("greedy" if opts.temperature == 0 else f"temperature {opts.temperature}, top-p {opts.top_p}")
    settings = {**dataclasses.asdict(opts), "command": args.command}
    if args.command == "sweep":
        settings["checkpoints"] = args.checkpoints
    return Report(f"{args.command} {source} on {', '.join(benchmarks)}: {opts.n_samples} sample(s) per problem, "
                  f"{decoding}, up to {opts.max_new_tokens} new tokens -> {opts.output_dir}", settings, notes)


# -------------------------------------------------------------------- entry point


def validate(command: list[str]) -> Report:
    """Check one command line; raises `Invalid` with every error found."""
    module, argv = split_command(command)
    if module in (UPSTREAM_CLI, REPLAY_CLI):
        return check_training(module, argv)
    if module == EVALUATION_CLI:
        return check_evaluation(argv)
    raise Invalid([f"unknown module {module}: this checks {UPSTREAM_CLI}, {REPLAY_CLI} and {EVALUATION_CLI}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openrlhf_replay.cli.validate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resolved-json", metavar="PATH", help="write the resolved settings here as JSON")
    parser.add_argument("--pending", action="append", default=[], metavar="PATH",
                        help="an input file of the command that an earlier step makes (e.g. RLEP's pool): when "
                        "missing, the checks that read it wait for it and the rest are made")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command, e.g. -- python -m ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: pass -- python -m <module> <arguments>")
    shown = " ".join(command[:3])
    try:
        with pending_files(args.pending) as pending:
            report = validate(command)
    except Invalid as e:
        print(f"validate: INVALID {shown}:\n  - " + "\n  - ".join(e.errors), file=sys.stderr, flush=True)
        return 1
    for note in report.notes + [f"{path} does not exist yet: not checked" for path in sorted(pending)]:
        print(f"validate: note: {note}", flush=True)
    print(f"validate: OK {shown}: {report.summary}", flush=True)
    if args.resolved_json:
        path = Path(args.resolved_json)
        path.write_text(json.dumps(report.settings, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
