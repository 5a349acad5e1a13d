"""The actor's LR schedule with replay: it follows rollout steps, not optimizer steps.

Upstream sizes the schedule (a transformers `LambdaLR`: a warm-up, then e.g. a cosine decay) in
optimizer steps on fresh rollouts (`PPOTrainer.get_max_steps`), and DeepSpeed steps it after every
optimizer step. Replay adds optimizer steps that size does not count: a fixed number a step in the
ratio modes, any number in RLEP's. Stepped once per optimizer step, the schedule would end its
warm-up in fewer rollout steps than GRPO's and run past its end (where a cosine rises again).

The rule, in every mode: a rollout step moves the schedule by its fresh optimizer steps, as in
GRPO, spread evenly over the optimizer steps it actually takes. A rank that trains on F fresh and
R replayed rows (RLEP's inert rows among them) moves it by F / (F + R) of a step after each
optimizer step. So after every rollout step the schedule stands where GRPO's stands, whatever was
replayed (the warm-up spans the same rollout steps), and the run's last optimizer step ends on
the schedule's end, `max_steps`, having run at max_steps - F / (F + R): within one step of it, as
GRPO's last runs at max_steps - 1. Between two whole steps the LR is interpolated linearly between
the schedule's values at them, so it never leaves the range of upstream's own schedule (evaluated
at a fraction, transformers' `cosine_warmup_with_min_lr` would overshoot its peak in the last
warm-up step). The position is saved and restored with the scheduler's state (DeepSpeed's
checkpoint).
"""
from __future__ import annotations

import math

from torch.optim.lr_scheduler import LambdaLR


class RolloutPacedLR(LambdaLR):
    """A `LambdaLR` whose position (`position`, in upstream's steps) moves by shares of rollout
    steps (see the module docstring); `last_epoch` still counts optimizer steps. Made from the
    actor's scheduler by `pace_by_rollout_steps`, told each rollout step's rows by `pace`."""

    position: float

    def pace(self, fresh_rows: int, rows: int) -> None:
        """Before a rollout step's training: it trains on `rows` rows, `fresh_rows` of them fresh
        (only the share matters; the actor passes sums over the ranks, the same on every rank).
        `fresh_rows` counts the rows a step paces for (`experience.py:paced_rows`), which exceed
        `rows` when it also paces a refill step that kept no group and so never ran: each of its
        optimizer steps then moves the schedule by more than one step."""
        if not (0 < fresh_rows and 0 < rows):
            raise ValueError(f"a rollout step trains on {fresh_rows} fresh of {rows} rows: need both > 0")
        self.rollout_step_start = self.position
        self.rollout_step_rows = [fresh_rows, rows]
        self.optimizer_steps_in_rollout_step = 0

    def step(self, epoch=None) -> None:
        if epoch is not None:  # neither DeepSpeed nor upstream passes one
            raise ValueError("a schedule paced by rollout steps takes no explicit position")
        self.optimizer_steps_in_rollout_step += 1
        fresh, rows = self.rollout_step_rows
        # Multiplied before dividing: the rollout step's last optimizer step lands exactly on the
        # whole number of fresh optimizer steps GRPO would have taken.
        self.position = self.rollout_step_start + self.optimizer_steps_in_rollout_step * fresh / rows
        super().step()  # counts the optimizer step, sets the LRs from `get_lr`

    def get_lr(self) -> list[float]:
        below = math.floor(self.position)
        share = self.position - below  # 0 at a whole step: exactly upstream's value there
        return [base_lr * ((1 - share) * f(below) + share * f(below + 1) if share else f(below))
                for f, base_lr in zip(self.lr_lambdas, self.base_lrs)]


def pace_by_rollout_steps(scheduler):
    """The actor's scheduler, made to follow rollout steps, in place (DeepSpeed's engine and the
    trainer hold the same object). Upstream's actor loads a checkpoint's scheduler state before
    this runs: a position saved with it is kept; without one (a fresh run, or a checkpoint of
    upstream's scheduler) the position is the optimizer steps taken, and until the first `pace` one
    optimizer step is one step, as upstream's. Metric-driven schedulers (`reduce_lr_on_plateau`,
    `greedy`) are not sized in steps and are returned as they are."""
    if type(scheduler) is LambdaLR:
        scheduler.__class__ = RolloutPacedLR
        if not hasattr(scheduler, "position"):
            scheduler.position = float(scheduler.last_epoch)
            scheduler.pace(1, 1)
    return scheduler
