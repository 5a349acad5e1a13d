"""Following a CPU run's log: a line per training step and the phase it is in while it works
(`progress`, what the quickstart prints), and what stopped it (`diagnose`)."""
from __future__ import annotations

import ast
import os
import re
import select
import sys
import time
from pathlib import Path

_STEP = re.compile(r"Global step (\d+): (\{.*\})")
_PASS = re.compile(r"^(cpu:|replay: mode|train_ppo_ray:|INFO evaluation:|evaluation:)|replay: (saved|restored)|"
                   r"Traceback|Error|error:|Killed|out of memory")
_PHASES = [("Generate samples", "generating"), ("forward:", "scoring (actor forward)"),
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


# Known causes of a failed run, the fix for each (first match wins), then any error line.
_CAUSES = [
    (re.compile(r"Address already in use|EADDRINUSE|port \d+ is (already )?in use", re.I),
     "a network port the run needs is taken by another program: stop it (`ss -ltnp` lists who listens "
     "where), or stop a run still going (`ray stop --force`)"),
    (re.compile(r"OutOfMemoryError|MemoryError|[Oo]ut of memory|Cannot allocate memory|low on memory|\bKilled\b"),
     "a process ran out of memory: stop other programs, lower VLLM_CPU_KVCACHE_SPACE, or run MODEL=tiny"),
    (re.compile(r"safetensors|HeaderTooLarge|deserializ|incomplete metadata|not a valid .*(model|checkpoint)|"
                r"Unable to load weights|Can't load", re.I),
     "the model's files could not be read: check MODEL, or delete the converted copy (it is rebuilt) "
     "under ~/.cache/openrlhf_replay/models"),
]
_ERROR_LINE = re.compile(r"\b([A-Za-z_.]*(Error|Exception)|Killed|FAILED):? .{3,}")


def diagnose(log_path: Path) -> str:
    """What stopped a run, from its log: the first known cause with its fix, else the last error line."""
    try:
        lines = [_strip_prefix(line).strip() for line in log_path.read_text("utf-8", "replace").splitlines()]
    except OSError:
        return f"no log at {log_path}"
    errors = [line for line in lines if _ERROR_LINE.search(line) and not line.startswith(("File ", "raise "))]
    for pattern, fix in _CAUSES:
        hit = next((line for line in errors if pattern.search(line)), None)
        if hit:
            return f"{hit[:400]}\n  fix: {fix}"
    return errors[-1][:400] if errors else "no error message in the log; its last lines:\n" + "\n".join(lines[-5:])
