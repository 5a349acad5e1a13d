"""The LR schedule with replay follows rollout steps (`openrlhf_replay/trainer/lr_schedule.py`):
real transformers schedulers, built as upstream's strategy builds them, stepped as DeepSpeed steps
them (once per optimizer step), beside the same schedule stepped as GRPO steps it."""
import io
import json
import math
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_scheduler

from openrlhf_replay.trainer.lr_schedule import RolloutPacedLR, pace_by_rollout_steps

BATCH = 256  # train.batch_size: rows per optimizer step (all ranks)
FRESH = 1024  # fresh rows per rollout step: 4 optimizer steps, upstream's unit
STEPS = 40  # rollout steps of the run
WARMUP_RATIO = 0.1  # 16 of the 160 fresh optimizer steps: the first 4 rollout steps
SCHEDULES = ["linear", "cosine", "cosine_with_restarts", "polynomial", "constant_with_warmup", "inverse_sqrt",
             "cosine_with_min_lr", "cosine_warmup_with_min_lr"]


MAX_STEPS = STEPS * FRESH // BATCH  # upstream's `get_max_steps`: fresh optimizer steps of the run


def upstream_scheduler(name: str, max_steps: int = MAX_STEPS, lr: float = 1e-6) -> LambdaLR:
    """The actor's scheduler as `DeepspeedStrategy.prepare` builds it, over a one-parameter optimizer."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    kwargs = {"min_lr_rate": 0.1} if name in ("cosine_with_min_lr", "cosine_warmup_with_min_lr") else {}
    return get_scheduler(name, optimizer, num_warmup_steps=math.ceil(max_steps * WARMUP_RATIO),
                         num_training_steps=max_steps, scheduler_specific_kwargs=kwargs)


def lr_at(name: str, step: int) -> float:
    """Upstream's schedule after `step` optimizer steps."""
    scheduler = upstream_scheduler(name)
    for _ in range(step):
        scheduler.optimizer.step()
        scheduler.step()
    return scheduler.get_last_lr()[0]


def replayed_rows(mode: str, seed: int = 0) -> list[int]:
    """Rows each rollout step adds for replay: none during a warm-up of 3 steps (inside the LR's),
    then half the fresh (two whole batches) for the ratio modes, or RLEP's count, anything from 0 to
    256 successes completed by inert rows to a whole batch."""
    rng = np.random.default_rng(seed)
    if mode == "ratio":
        return [0] * 3 + [FRESH // 2] * (STEPS - 3)
    return [0] * 3 + [-(-int(r) // BATCH) * BATCH for r in rng.integers(0, 257, STEPS - 3)]


def train(scheduler, replayed: list[int], paced: bool = True):
    """Step `scheduler` as DeepSpeed would over the run (one rank: rows = rows of all ranks); the
    LR each optimizer step ran at, and the LR after each rollout step (what `actor_lr` logs)."""
    ran_at, after = [], []
    for extra in replayed:
        if paced:
            scheduler.pace(FRESH, FRESH + extra)
        for _ in range((FRESH + extra) // BATCH):
            ran_at.append(scheduler.get_last_lr()[0])
            scheduler.optimizer.step()  # DeepSpeed's order: the optimizer, then the schedule
            scheduler.step()
        after.append(scheduler.get_last_lr()[0])
    return ran_at, after


@pytest.mark.parametrize("mode", ["ratio", "rlep"])
@pytest.mark.parametrize("name", SCHEDULES)
def test_every_rollout_step_ends_where_grpos_schedule_stands(name, mode):
    grpo = upstream_scheduler(name)
    grpo_ran_at, grpo_after = train(grpo, [0] * STEPS, paced=False)
    ours = pace_by_rollout_steps(upstream_scheduler(name))
    ran_at, after = train(ours, replayed_rows(mode))
    assert len(ran_at) > MAX_STEPS  # replay did add optimizer steps
    assert after == grpo_after  # exactly: warm-up over the same rollout steps, the same LR after each
    assert max(ran_at) <= max(grpo_ran_at)  # between whole steps too, never above the schedule's peak
    assert ours.position == grpo.last_epoch == MAX_STEPS  # the run ends at the schedule's end
    assert ours.last_epoch == len(ran_at)  # torch's count of optimizer steps is left as it is
    # The last optimizer step ran within one step of the end: between GRPO's last step and the end.
    low, high = sorted((lr_at(name, MAX_STEPS - 1), lr_at(name, MAX_STEPS)))
    assert low <= ran_at[-1] <= high, (ran_at[-1], low, high)


def test_stepped_once_per_optimizer_step_the_schedule_would_run_past_its_end():
    """What replay did to a decaying schedule before: 37 x 2 extra optimizer steps past a cosine's
    end, where it rises again (the launcher refused such schedules)."""
    grpo = upstream_scheduler("cosine")
    train(grpo, [0] * STEPS, paced=False)
    plain = upstream_scheduler("cosine")
    ran_at, _ = train(plain, replayed_rows("ratio"), paced=False)
    assert plain.last_epoch == grpo.last_epoch + 37 * 2 and ran_at[-1] > 10 * grpo.get_last_lr()[0]


def test_without_replay_every_step_is_upstreams():
    upstream, ours = upstream_scheduler("cosine_with_min_lr"), pace_by_rollout_steps(upstream_scheduler("cosine_with_min_lr"))
    assert train(ours, [0] * STEPS) == train(upstream, [0] * STEPS, paced=False)
    assert ours.position == ours.last_epoch == upstream.last_epoch


def test_a_resume_mid_rollout_step_continues_the_same_schedule():
    """DeepSpeed saves `state_dict()` with torch.save; upstream's actor loads it into the scheduler
    it builds before the replay actor paces that one: the fractional position, and the rollout
    step's pace, come back exactly."""
    replayed = replayed_rows("rlep", seed=1)
    first = pace_by_rollout_steps(upstream_scheduler("cosine_with_min_lr"))
    train(first, replayed[:10])
    first.pace(FRESH, FRESH + BATCH)  # a step of 5 optimizer steps, saved after 2 of them
    first.step(), first.step()
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)
    assert first.position % 1 != 0  # a position between two upstream steps
    resumed = upstream_scheduler("cosine_with_min_lr")
    resumed.load_state_dict(torch.load(io.BytesIO(saved.getvalue()), weights_only=True))
    pace_by_rollout_steps(resumed)
    assert resumed.position == first.position and resumed.get_last_lr() == first.get_last_lr()
    resumed.step(), resumed.step(), resumed.step()
    assert resumed.position == 11 * FRESH // BATCH  # the rollout step ends on its whole position
    paused = pace_by_rollout_steps(upstream_scheduler("cosine_with_min_lr"))
    train(paused, replayed[:10] + [BATCH])
    assert resumed.state_dict() == paused.state_dict()


def test_a_checkpoint_of_upstreams_schedule_resumes_at_its_optimizer_steps():
    grpo = upstream_scheduler("linear")
    train(grpo, [0] * 5, paced=False)
    resumed = upstream_scheduler("linear")
    resumed.load_state_dict(grpo.state_dict())
    assert pace_by_rollout_steps(resumed).position == 5 * FRESH // BATCH


def test_deepspeed_steps_the_paced_schedule_and_restores_it_from_its_checkpoint(tmp_path):
    """A real DeepSpeed engine (ZeRO-2, gloo, this CPU): `engine.step()` moves the position at each
    accumulation boundary, and `save_checkpoint` / `load_checkpoint` bring a fractional one back,
    loaded before the scheduler is paced, as in the actor."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = DEEPSPEED_RUN.format(port=port, folder=str(tmp_path))
    env = dict(os.environ, OPENRLHF_REPLAY_DEVICE="cpu")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved, restored, end = (json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
                            if line.startswith(("saved ", "restored ", "end ")))
    assert saved["optimizer_steps"] == 4 and saved["position"] == 2 + 2 * 2 / 3  # step 2: 2 of its 3 steps
    assert restored == saved  # the new engine's position, LR and step count, exactly
    # Step 2's last optimizer step ends it at 4, the end of the warm-up, as GRPO's second step does.
    assert end == {"position": 4.0, "lr": 1e-3, "optimizer_steps": 5}


DEEPSPEED_RUN = """
import json, math, os
from functools import partial
import deepspeed, torch
from transformers import get_scheduler
from openrlhf_replay.trainer.lr_schedule import pace_by_rollout_steps

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
deepspeed.init_distributed(dist_backend="gloo")

def engine():  # as DeepspeedStrategy.prepare builds the actor's: 8 steps, a warm-up of 4, cosine to 10 %
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    config = {{"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
              "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3, "torch_adam": True}}}},
              "zero_optimization": {{"stage": 2}}}}
    schedule = partial(get_scheduler, "cosine_with_min_lr", num_warmup_steps=4, num_training_steps=8,
                       scheduler_specific_kwargs={{"min_lr_rate": 0.1}})
    return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config,
                                lr_scheduler=schedule)[::3]

def train(engine, micro_batches):
    for _ in range(micro_batches):
        engine.backward(engine(torch.ones(1, 4)).sum())
        engine.step()

def show(what, engine, scheduler):
    print(what, json.dumps({{"position": scheduler.position, "lr": scheduler.get_last_lr()[0],
                            "optimizer_steps": engine.global_steps}}), flush=True)

first, scheduler = engine()
pace_by_rollout_steps(scheduler)
scheduler.pace(4, 4)  # rollout step 1: 2 fresh optimizer steps (rows of 2 micro-batches each)
train(first, 4)
scheduler.pace(4, 6)  # step 2: 2 fresh + 1 replayed optimizer steps, saved after 2 of them
train(first, 4)
show("saved", first, scheduler)
first.save_checkpoint("{folder}", tag="mid")
second, scheduler = engine()
second.load_checkpoint("{folder}", tag="mid")
pace_by_rollout_steps(scheduler)
show("restored", second, scheduler)
train(second, 2)
show("end", second, scheduler)
"""


def test_a_metric_driven_scheduler_is_left_as_it_is():
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    plateau = get_scheduler("reduce_lr_on_plateau", optimizer)
    assert pace_by_rollout_steps(plateau) is plateau and not isinstance(plateau, RolloutPacedLR)


def test_a_step_without_fresh_rows_is_refused():
    with pytest.raises(ValueError, match="fresh"):
        pace_by_rollout_steps(upstream_scheduler("linear")).pace(0, 256)
