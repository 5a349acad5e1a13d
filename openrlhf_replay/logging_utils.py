"""Upstream's TensorBoard logger, also drawing the step's histograms.

Upstream's `TensorboardLogger.log_train` (OpenRLHF 0.11.2) writes each value of the step's status
dict as a scalar. That dict also goes to wandb and is printed on the console by `fit`, so an array
put there would land in all three. The controller therefore hands its per-step arrays to the
logger on their own (`stage`), and `log_train` draws them as histograms in the same event file, at
the same step and under the same `train/` prefix as the scalars, on the steps upstream logs
(`--logger.logging_steps`).

Seam: upstream's `BasePPOTrainer.__init__` builds the controller's `tensorboard_logger`; the
controller switches that instance to this class (`ppo_trainer.py:ReplayControllerMixin`), which
only adds behaviour.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from openrlhf.utils.logging_utils import TensorboardLogger


class HistogramTensorboardLogger(TensorboardLogger):
    """`TensorboardLogger` that also draws the arrays staged for the step as histograms."""

    staged: Mapping[str, np.ndarray] = {}  # replaced, never changed in place

    def stage(self, histograms: Mapping[str, Any]) -> None:
        """Arrays for the next `log_train` to draw, keyed as the status dict's scalars (e.g.
        `replay/replayed_age`, one value per replayed rollout). Each call replaces the last: a step
        upstream does not log draws nothing, as its scalars."""
        staged = {}
        for key, values in histograms.items():
            array = np.asarray(values)
            if array.ndim != 1 or not np.issubdtype(array.dtype, np.number):
                raise ValueError(f"histogram {key!r}: expected a 1-D array of numbers, one per item counted, got "
                                 f"{array.dtype} of shape {array.shape}; pass scalars in the status dict instead")
            staged[key] = array
        self.staged = staged

    def log_train(self, global_step: int, logs_dict: dict[str, Any]) -> None:
        super().log_train(global_step, logs_dict)
        for key, values in self.staged.items():
            # A step with nothing to count (the warm-up replays no row) draws nothing: TensorBoard
            # has no empty histogram, and a histogram of one placeholder value would be a false one.
            if len(values):
                self.writer.add_histogram(f"train/{key}", values.astype(np.float64), global_step)
        self.staged = {}
