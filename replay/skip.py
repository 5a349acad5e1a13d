"""Pre-rollout skipping: GRESO's rule (arXiv 2506.02177; reference code `Infini-AI-Lab/GRESO`,
`DataProfiler.*_probabilistic_skip` and the `all_probabilistic` branch of its trainer).

Pure numpy. Every prompt keeps the kind of its latest generated group (easy: all rewards equal
and above the success threshold; hard: all equal and at or below it; mixed: a reward differs)
and how many of its latest groups in a row were of that kind, `run`. Before generation a prompt
whose latest run is easy or hard is kept (explored) with probability

    max(p_kind ** run, KEEP_FLOOR)

and skipped otherwise: the longer a prompt has been zero-variance, the rarer it is generated,
yet it always may return. After each generation call, each p moves by `explore_step` (within
[explore_min, explore_max]) toward its target share of the call's generated groups (easy: a
third of the target, hard: two thirds, GRESO's split): a share at or above its target lowers p
(skip more), a lower share raises it. Like GRESO, p adapts only once the loader's first pass is
over (before that no prompt has a history, so nothing can be skipped). docs/METHOD.md, "Pre-
rollout skipping", lists the departures.

Whole batches: a skip is allowed only while the step's batch can still be filled from the rest of
the pass, and a pass's tail too short to fill a batch is deferred (not generated, as the launch
policy drops a partial last batch), so every step generates `batch_size` prompts and every rank
trains the same rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIXED, EASY, HARD = 0, 1, 2
KINDS = {EASY: "easy", HARD: "hard"}
KEEP_FLOOR = 0.01  # GRESO's least probability of generating a prompt, however long its run
ZERO_VARIANCE_TOL = 1e-6  # rewards this close are equal (group_norm's advantages are then 0)
EASY_SHARE = 1.0 / 3.0  # GRESO: a third of the target for easy groups, the rest for hard ones


@dataclass
class StepTally:
    """One generation call: prompts drawn from the loader, of which skipped; groups generated, of
    which easy and hard."""

    drawn: int = 0
    skipped: int = 0
    deferred: int = 0  # the pass's tail that could not fill a batch
    groups: int = 0
    easy: int = 0
    hard: int = 0


def group_kind(rewards, success_threshold: float) -> int:
    """EASY or HARD for a zero-variance group (by its common reward), else MIXED."""
    values = np.asarray(rewards, np.float64)
    if values.size == 0 or not np.isfinite(values).all():
        raise ValueError(f"replay.skip: a group needs finite rewards to be classified, got {values.tolist()}")
    if values.max() - values.min() > ZERO_VARIANCE_TOL:
        return MIXED
    return EASY if values[0] > success_threshold else HARD


class SkipRule:
    """Each prompt's history, the two exploration probabilities and the seeded generator that draws
    the skips. `n_prompts`: the prompts of one loader pass."""

    def __init__(self, *, target: float, explore: float, explore_step: float, explore_min: float,
                 explore_max: float, success_threshold: float, n_prompts: int, batch_size: int, seed: int):
        if n_prompts < batch_size or batch_size < 1:
            raise ValueError(f"replay.skip: the prompt loader holds {n_prompts} prompts, fewer than a batch of "
                             f"{batch_size}; pass more prompts or a smaller --rollout.batch_size")
        self.batch_size = batch_size
        self.targets = {EASY: target * EASY_SHARE, HARD: target * (1.0 - EASY_SHARE)}
        self.explore = {EASY: float(explore), HARD: float(explore)}
        self.step_size, self.low, self.high = explore_step, explore_min, explore_max
        self.success_threshold, self.n_prompts = success_threshold, n_prompts
        self.rng = np.random.default_rng(seed)
        self.runs: dict[int, tuple[int, int]] = {}  # prompt uid -> (kind of its latest run, run length)
        self.prompts_drawn = 0  # over the whole run: the loader's passes are prompts_drawn / n_prompts
        self.kept_in_pass = 0
        self.tally = StepTally()

    @classmethod
    def from_config(cls, config, n_prompts: int, batch_size: int) -> SkipRule:
        return cls(target=config.skip_target, explore=config.skip_explore, explore_step=config.skip_explore_step,
                   explore_min=config.skip_explore_min, explore_max=config.skip_explore_max,
                   success_threshold=config.success_threshold, n_prompts=n_prompts, batch_size=batch_size,
                   seed=config.seed)

    def keep_probability(self, uid: int) -> float:
        kind, run = self.runs.get(uid, (MIXED, 0))
        return 1.0 if kind == MIXED else max(self.explore[kind] ** run, KEEP_FLOOR)

    def skip(self, uid: int) -> bool:
        """Whether to pass over the loader's next prompt, `uid`: deferred at a pass's short tail,
        else skipped by the rule (a draw from its generator) where the batch can spare it."""
        position = self.prompts_drawn % self.n_prompts  # its place in the pass: every pass draws every prompt
        self.kept_in_pass = 0 if position == 0 else self.kept_in_pass
        remaining = self.n_prompts - position - 1  # after this one
        filled = self.kept_in_pass % self.batch_size
        self.prompts_drawn += 1
        self.tally.drawn += 1
        if filled == 0 and remaining + 1 < self.batch_size:
            self.tally.deferred += 1
            return True
        keep = self.keep_probability(uid)
        spare = filled == 0 or filled + remaining >= self.batch_size  # a started batch must still fill
        if keep < 1.0 and spare and self.rng.random() >= keep:
            self.tally.skipped += 1
            return True
        self.kept_in_pass += 1
        return False

    def observe(self, uid: int, rewards) -> None:
        """A generated group of this prompt: extend or restart its run."""
        kind = group_kind(rewards, self.success_threshold)
        last, run = self.runs.get(uid, (MIXED, 0))
        self.runs[uid] = (kind, run + 1 if kind == last and kind != MIXED else int(kind != MIXED))
        self.tally.groups += 1
        self.tally.easy += int(kind == EASY)
        self.tally.hard += int(kind == HARD)

    def end_call(self) -> dict[str, float]:
        """Close a generation call: adapt the probabilities and return the call's `replay/skip_*`
        figures (then start a new tally)."""
        t = self.tally
        if t.groups and self.prompts_drawn > self.n_prompts:  # GRESO adapts from the second epoch on
            for kind, count in ((EASY, t.easy), (HARD, t.hard)):
                lower = count / t.groups >= self.targets[kind]
                p = self.explore[kind] + (-self.step_size if lower else self.step_size)
                self.explore[kind] = min(max(p, self.low), self.high)
        self.tally = StepTally()
        return {"replay/skip_skipped_prompts": float(t.skipped), "replay/skip_drawn_prompts": float(t.drawn),
                "replay/skip_deferred_prompts": float(t.deferred),
                "replay/skip_rate": t.skipped / max(t.drawn, 1),
                "replay/skip_zero_variance_share": (t.easy + t.hard) / max(t.groups, 1),
                "replay/skip_easy_share": t.easy / max(t.groups, 1),
                "replay/skip_hard_share": t.hard / max(t.groups, 1),
                "replay/skip_explore_easy": self.explore[EASY], "replay/skip_explore_hard": self.explore[HARD],
                "replay/skip_loader_passes": self.prompts_drawn / self.n_prompts}

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict:
        uids = np.fromiter(self.runs, np.int64, len(self.runs))
        runs = np.array(list(self.runs.values()), np.int64).reshape(-1, 2)
        return {"uids": uids, "kinds": runs[:, 0].astype(np.int8), "runs": runs[:, 1],
                "explore": [self.explore[EASY], self.explore[HARD]], "prompts_drawn": self.prompts_drawn,
                "kept_in_pass": self.kept_in_pass, "n_prompts": self.n_prompts, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        if int(state["n_prompts"]) != self.n_prompts:
            raise ValueError(f"replay.skip: the saved skip state is of a loader of {state['n_prompts']} prompts, "
                             f"this run's has {self.n_prompts}: resume with the same prompt data")
        self.runs = {int(u): (int(k), int(r)) for u, k, r in zip(state["uids"], state["kinds"], state["runs"])}
        self.explore = {EASY: float(state["explore"][0]), HARD: float(state["explore"][1])}
        self.prompts_drawn, self.kept_in_pass = int(state["prompts_drawn"]), int(state["kept_in_pass"])
        self.rng.bit_generator.state = state["rng"]
        self.tally = StepTally()
