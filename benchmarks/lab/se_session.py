"""Several short training runs in one Ray instance: the lab's way around start-up.

A lab run trains 50 steps in about 90 s here, but a launch of `openrlhf_replay.cli.train_ppo_ray`
spends as long again starting: five processes (driver, controller, policy actor, vLLM's Ray
actor and its engine core) each import torch and vLLM on 2 cores. This runs a list of launcher
commands one after another with one driver, one vLLM engine, one DeepSpeed policy actor and one
controller process, kept from run to run:

- each command is resolved by the launcher itself, up to upstream's `train()` (every check a
  launch makes, replay's and the CPU platform's included), before Ray starts;
- per run, as upstream's `train()` does: a fresh strategy, the controller class the launcher would
  use (upstream's `PPOTrainer`, or `ReplayPPOTrainer` with replay on) built inside the one
  controller process, the policy actor re-initialised from the run's model with
  `init_model_from_pretrained` (weights, optimizer, LR schedule, seed, and a new weight-sync group
  to vLLM), then `fit()` and the final model save;
- the vLLM engine is the first run's; each run starts by broadcasting its freshly loaded weights
  to it, so the first step samples from the run's own initial model, not the last run's.

What differs from separate launches: the policy actor's class is `ReplayPolicyModelActor` for every
run (with replay off it trains as upstream's and only adds its rank statistics), and the vLLM
engine's random state runs on from one run to the next (it is seeded once, with the first run's
`--train.seed`; vLLM's sampling is not reproducible from run to run here in any case). Settings
the engine is built from must be the same in every command (`ENGINE_FLAGS`).

    python benchmarks/lab/se_session.py JOBS.json

JOBS.json is a list of {"name", "command" (a `python -m openrlhf_replay.cli.train_ppo_ray ...`
argv), "out" (a folder), optionally "timeout_s" (the run's training is stopped after it) and
"max_prompts" (the run ends once its generation drew that many prompts: a skipping run's loader
holds more passes than it needs) and "prepare" ({"command": an argv run in the repository just
before the run, its output in `<out>/prepare.log`; "makes": the files it writes, which the run
reads: the lab's RLEP pool, decoded by an earlier run's final model. Every command is checked
before Ray starts, the checks that read such a file when the run loads it)}. For
each run, in order, `<out>/steps.json` gets upstream's status dict of every step (the dict its
`Global step N` line prints), the run's wall time, `session` (this session's start, UTC: runs
with the same one were timed side by side), `cpu` and, for the first run, `session_startup_s`:
from this process's start to that run's start (resolving every command, Ray, the engine's and
actors' creation; the engine's own start-up is waited for inside the first run). A run that fails
stops the session with exit status 1 and its error in `<out>/error.txt`; the runs before it keep
their results.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

STARTED = time.perf_counter()  # `session_startup_s` counts from here (the heavy imports are lazy, below)
SESSION = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

LAUNCHER = "openrlhf_replay.cli.train_ppo_ray"
# What the vLLM engine and the actors' placement are built from: one value for the whole session.
ENGINE_FLAGS = ("actor.model_name_or_path", "actor.num_nodes", "actor.num_gpus_per_node", "data.max_len",
                "vllm.num_engines", "vllm.tensor_parallel_size", "vllm.enable_prefix_caching",
                "vllm.enforce_eager", "vllm.gpu_memory_utilization", "vllm.sync_backend",
                "algo.advantage.is_correction_level", "train.agent_func_path", "reward.remote_url",
                "train.full_determinism_enable", "train.colocate_all", "algo.kl.init_coef")


def resolve(command: list[str], pending=()):
    """The nested arguments upstream's `train()` would get from this launcher command; `pending`:
    its input files that a step before it makes (not read here when missing)."""
    from openrlhf_replay.cli.validate import Invalid, pending_files, resolve_training, split_command

    module, argv = split_command(command)
    if module != LAUNCHER:
        raise SystemExit(f"se_session: a run's command must be `python -m {LAUNCHER} ...`, not `-m {module}`")
    try:
        with pending_files(pending):
            args, _ = resolve_training(module, argv)
    except Invalid as e:
        raise SystemExit("se_session: the launcher refuses a run's command:\n  " + "\n  ".join(e.errors)) from None
    return args


def engine_mismatches(first, args) -> list[str]:
    from openrlhf_replay.cli.validate import flatten_args

    mine, theirs = flatten_args(first), flatten_args(args)
    return [f"--{flag}: {mine[flag]!r} in the first run, {theirs[flag]!r} here" for flag in ENGINE_FLAGS
            if mine[flag] != theirs[flag]]


class GenerationTally:
    """What a run's generation made since the last logged step, counted as upstream's generator
    returns it: `lab/prompts_consumed`, the prompts drawn (skipped ones are never drawn; upstream's
    loop logs no step for a call whose groups dynamic filtering all dropped, so the next step's
    count holds them, and the last step's those of calls after it, which its final model paid
    for); and, as each response becomes a sample, before any filtering, `lab/generated_tokens`
    (response tokens), `lab/groups` (complete groups) and `lab/zero_variance_groups` (of them, those
    whose rewards are all equal). With `max_prompts`, the generator reports itself exhausted once
    that many prompts were drawn: the run ends there, whatever its loader still holds."""

    def __init__(self, max_prompts: int | None = None):
        self.max_prompts, self.drawn = max_prompts, 0
        self.counts = dict.fromkeys(("prompts_consumed", "generated_tokens", "groups", "zero_variance_groups"), 0)
        self.pending: dict[str, list[float]] = {}  # prompt -> rewards of its group so far

    def install(self, generator) -> None:
        generate, process = generator.generate_samples, generator._process_response_into_experience
        group_size = generator.args.rollout.n_samples_per_prompt

        def counted(**kwargs):
            if self.max_prompts is not None and self.drawn >= self.max_prompts:
                return [], None, 0, True  # upstream's loop ends each remaining pass on this
            out = generate(**kwargs)
            self.counts["prompts_consumed"] += out[2]  # (samples, pass rate, prompts consumed, exhausted)
            self.drawn += out[2]
            return out

        def observed(response, **kwargs):
            experience = process(response, **kwargs)
            self.counts["generated_tokens"] += int(experience.response_length.sum())
            rewards = self.pending.setdefault(experience.prompts[0], [])
            rewards.append(float(response.get("reward", 0.0)))
            if len(rewards) == group_size:
                del self.pending[experience.prompts[0]]
                self.counts["groups"] += 1
                self.counts["zero_variance_groups"] += max(rewards) - min(rewards) < 1e-6
            return experience

        generator.generate_samples, generator._process_response_into_experience = counted, observed

    def take(self) -> dict[str, int]:
        """The counts since the last call, as `lab/<name>`, and zero them."""
        out = {f"lab/{k}": int(v) for k, v in self.counts.items()}
        self.counts = dict.fromkeys(self.counts, 0)
        return out


def _controller_class():
    import ray

    @ray.remote
    class Controller:
        """One process for every run's controller (upstream's is a Ray actor of its own per launch)."""

        def prepare(self, replay_on: bool, pretrain, strategy, actor_group, vllm_engines, generate_kwargs):
            from openrlhf.trainer.ppo_trainer import PPOTrainer

            from openrlhf_replay.trainer.ppo_trainer import ReplayPPOTrainer
            from openrlhf_replay.utils import undecorated

            cls = undecorated(ReplayPPOTrainer if replay_on else PPOTrainer)
            self.trainer = cls(pretrain, strategy, actor_group, None, None, None, vllm_engines, **generate_kwargs)
            return self.trainer.get_max_steps()

        def fit(self, max_prompts: int | None = None) -> list[dict]:
            """Broadcast the run's initial weights to vLLM, train until the loader or `max_prompts`
            ends, and return every step's status with what the lab counts (`GenerationTally`)."""
            trainer, statuses, tally = self.trainer, [], GenerationTally(max_prompts)
            save = trainer.save_logs_and_checkpoints
            tally.install(trainer.samples_generator)

            def record(global_step, logs_dict=None, client_states=None):
                statuses.append({"step": global_step, **tally.take(),
                                 **{k: v for k, v in (logs_dict or {}).items() if k != "generated_samples"}})
                return save(global_step, logs_dict, client_states)

            trainer.save_logs_and_checkpoints = record
            trainer.broadcast_to_vllm()
            trainer.fit()
            if statuses:  # calls after the last step (all their groups dropped): the final model paid for them
                for key, value in tally.take().items():
                    statuses[-1][key] += value
            del self.trainer
            return statuses

    return Controller


class Session:
    """The processes kept from run to run; built from the first run's arguments."""

    def __init__(self, args):
        import ray
        from openrlhf.trainer.ray import create_vllm_engines
        from openrlhf.trainer.ray.launcher import RayActorGroup
        from ray.util.placement_group import placement_group

        from openrlhf_replay.trainer.ray.ppo_actor import ReplayPolicyModelActor
        from openrlhf_replay.utils import world_size

        if args.algo.kl.init_coef > 0 or not args.train.colocate_all or args.critic.model_name_or_path:
            raise SystemExit("se_session: runs colocated policy and vLLM only (--train.colocate_all), without a "
                             "reference model (--algo.kl.init_coef 0) or a critic")
        self.first = args
        ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN",
                                           "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}})
        pg = placement_group([{"GPU": 1, "CPU": 1}] * world_size(args), strategy="PACK")
        ray.get(pg.ready())
        # upstream train()'s own call, with the first run's settings
        self.engines = create_vllm_engines(
            args.vllm.num_engines, args.vllm.tensor_parallel_size, args.actor.model_name_or_path,
            args.train.seed, args.train.full_determinism_enable, args.vllm.enable_prefix_caching,
            args.vllm.enforce_eager, args.data.max_len, pg, args.vllm.gpu_memory_utilization,
            args.vllm.enable_sleep,
            "processed_logprobs" if args.algo.advantage.is_correction_level != "off" else None,
            agent_func_path=args.train.agent_func_path, remote_rm_url=args.reward.remote_url,
            max_images_per_prompt=getattr(args.data, "max_images_per_prompt", 0))
        self.actors = RayActorGroup(args.actor.num_nodes, args.actor.num_gpus_per_node, ReplayPolicyModelActor,
                                    pg=pg, num_gpus_per_actor=0.2,
                                    duplicate_actors=args.ds.ring_attn_size * args.ds.tensor_parallel_size)
        self.controller = _controller_class().remote()

    def run(self, args, timeout_s: float | None = None, max_prompts: int | None = None) -> list[dict]:
        import ray
        from openrlhf.utils import get_strategy

        from replay import ReplayConfig

        mismatches = engine_mismatches(self.first, args)
        if mismatches:
            raise ValueError("settings the session's vLLM engine was built from differ: " + "; ".join(mismatches))
        strategy = get_strategy(args)
        generate_kwargs = {"do_sample": True, "max_len": args.data.max_len,
                           "max_new_tokens": args.rollout.max_new_tokens,
                           "temperature": args.rollout.temperature, "top_p": args.rollout.top_p}
        pretrain = args.actor.model_name_or_path
        schedule_steps = ray.get(self.controller.prepare.remote(ReplayConfig.from_namespace(args).active, pretrain,
                                                                strategy, self.actors, self.engines, generate_kwargs))
        ray.get(self.actors.async_init_model_from_pretrained(strategy, pretrain, schedule_steps, self.engines))
        statuses = ray.get(self.controller.fit.remote(max_prompts), timeout=timeout_s)
        ray.get(self.actors.async_save_model())
        return statuses


def prepare(job: dict) -> None:
    """Run the job's "prepare" command; raise if it fails or leaves a file it makes missing."""
    step, out = job["prepare"], Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(out / "prepare.log", "w") as log:
        done = subprocess.run(step["command"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    missing = [path for path in step["makes"] if not os.path.exists(path)]
    if done.returncode != 0 or missing:
        raise RuntimeError(f"{job['name']}: its prepare command ended with {done.returncode}"
                           f"{', without ' + ', '.join(missing) if missing else ''}; see {out / 'prepare.log'}")
    print(f"se_session: {job['name']} prepared in {time.perf_counter() - start:.0f} s: "
          f"{' '.join(step['command'][:3])} ...", flush=True)


def main(argv: list[str] | None = None) -> int:
    from infra.hardware import cpu_description
    from openrlhf_replay.cpu import launcher as cpu_launcher

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    jobs = json.loads(Path(argv[0]).read_text())
    os.environ.setdefault("OPENRLHF_REPLAY_DEVICE", "cpu")
    if not cpu_launcher.activate():
        raise SystemExit("se_session: runs on the CPU platform only (OPENRLHF_REPLAY_DEVICE=cpu)")
    # every refusal before Ray starts (each prints the platform)
    resolved = [resolve(job["command"], job.get("prepare", {}).get("makes", ())) for job in jobs]
    session = Session(resolved[0])
    print(f"se_session: {len(jobs)} run(s); Ray, vLLM and the actors started", flush=True)
    try:
        for n, (job, args) in enumerate(zip(jobs, resolved)):
            out = Path(job["out"])
            out.mkdir(parents=True, exist_ok=True)
            try:
                if job.get("prepare"):
                    prepare(job)
                start, load = time.perf_counter(), os.getloadavg()[0]
                print(f"se_session: run {n + 1}/{len(jobs)} {job['name']} starts", flush=True)
                statuses = session.run(args, job.get("timeout_s"), job.get("max_prompts"))
            except Exception:
                (out / "error.txt").write_text(traceback.format_exc())
                print(f"se_session: run {job['name']} failed; see {out / 'error.txt'}", flush=True)
                return 1
            record = {"wall_s": time.perf_counter() - start, "load_avg_1min_start_end": [load, os.getloadavg()[0]],
                      "session": SESSION, "cpu": cpu_description(),
                      "session_startup_s": start - STARTED if n == 0 else 0.0, "steps": statuses}
            tmp = out / "steps.json.tmp"
            tmp.write_text(json.dumps(record))
            tmp.replace(out / "steps.json")
            print(f"se_session: run {job['name']} done in {record['wall_s']:.0f} s", flush=True)
    finally:
        import ray

        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
