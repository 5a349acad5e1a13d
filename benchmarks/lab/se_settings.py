"""The lab's settings: its conditions and what each changes, the task defaults, and `Args` (every
field a `--flag` of `sample_efficiency.py`, its docstring the flag's help)."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import se_analysis
from replay import field_help
from se_task import TaskConfig, WarmStartConfig

REPO = Path(__file__).resolve().parents[2]

CONDITIONS = ("none", "none_half_prompts", "none_half_lr", "none_2epochs", "none_matched", "age0", "uniform",
              "advantage", "advantage_alpha1", "advantage_alpha2", "advantage_tau2", "advantage_tau40", "naive",
              "freshness", "success", "exgrpo", "none_df", "uniform_df", "refill", "skip", "skip_uniform",
              "skip_refill")
FIFTH_EDITION = ("none", "uniform", "skip", "skip_uniform", "skip_refill")
"""The fifth edition's conditions, in the order pre-registered in
benchmarks/results/sample_efficiency_e5/plan.md (the default --conditions of --edition 5)."""
FIFTH_KEY = ("none", "skip_refill")
"""The fifth edition's primary pair: its conditions get `--seeds` seeds, the others `--ablation-seeds`."""
EDITION = ("none", "uniform", "none_matched", "age0", "none_2epochs", "advantage_alpha1", "advantage_alpha2",
           "exgrpo", "none_df", "uniform_df", "refill")
"""The fourth edition's conditions, in the order pre-registered in
benchmarks/results/sample_efficiency/plan.md (the default --conditions)."""
KEY = ("none", "uniform", "none_matched", "age0", "none_2epochs", "none_half_prompts", "none_half_lr", "advantage")
"""Conditions that get `--seeds` seeds (the key pairs rest on them); the others get
`--ablation-seeds`."""
FIRST_EDITION = ("none", "naive", "uniform", "advantage", "freshness", "none_2epochs")
# The more-updates controls. GRPO training each fresh batch twice: 4 optimizer steps a step where
# the replay conditions take 3 (2 fresh + 1 replayed) and GRPO 2.
EPOCHS = {"none_2epochs": 2}
# GRPO with replay's optimizer steps on its own fresh rollouts: training batches of 42, so 3 a step
# (upstream's loader drops the 2 rows left over, 2 others each step as it shuffles), against
# uniform's 3 after its warm-up (2 before it): 150 optimizer steps a run against 146.
TRAIN_BATCH = {"none_matched": 42}
# The other is the replay mode `age0` (replay/modes.py): uniform's draw, from the step's own A != 0
# rollouts, so the same rows and optimizer steps with no old data.
# Dynamic filtering (upstream's: a group of all-equal rewards is dropped). none_df and uniform_df
# replace a dropped group by a new prompt, as upstream does, and so reach the end of the pool in
# fewer steps; refill does not, and replay takes the dropped rows (--replay.refill). Every one of
# them generates the whole pool's rollouts, as GRPO does, so their final scores compare at the
# same generated rollouts, the dropped ones counted.
DYNAMIC_FILTERING = ("none_df", "uniform_df", "refill", "skip_refill")
# GRESO's pre-rollout skipping (--replay.skip): a skipped prompt is not generated, and the loader's
# next prompt takes its place, so a step still generates 16 groups and a pass is shorter. A
# skipping run's loader therefore holds more passes (se_command.SKIP_PASSES), and the session ends
# every run once it has drawn `--steps` steps' prompts: all conditions generate the same rollouts.
SKIPPING = ("skip", "skip_uniform", "skip_refill")
# The positive control (se_analysis.POSITIVE_CONTROL): GRPO on half the prompts per step (8 x 8
# rollouts, one update a step, a pool of half the size so that it too is passed once), whose
# difference from GRPO at the same step is known in sign, so the sweep shows whether the lab can
# see an effect. Resolved in the third edition (+1.6 points, 8 of 8 seeds); runs when named.
PROMPTS_SCALE = {"none_half_prompts": 0.5}
# The first positive control, GRPO at half its learning rate, was not resolved in the sweep of
# 2026-12-03 (+0.2 points [-0.6, +1.2] at 8 seeds: half the LR learns as fast here, so the LR is not
# what limits GRPO). It runs only when named in --conditions, so that sweep can be re-analysed.
LR_SCALE = {"none_half_lr": 0.5}
ROLLOUT_TEMPERATURE = 1.0
"""Rollouts are sampled at this temperature; the primary held-out metric samples at it too."""
# Settings that depend on the task: the first edition's values for add2, so that it reruns as
# published (48 steps, no prompt returns, 200 held-out, warm start to 0.3 checked every 10 steps).
TASK_DEFAULTS = {
    # chosen in the pilot before the sweep: benchmarks/results/sample_efficiency/pilot.md
    "mixed": {"steps": 50, "pool_steps": 50, "eval_every": 10, "heldout_size": 500, "target_accuracy": 0.25,
              "warm_eval_every": 50, "conditions": ",".join(EDITION), "seeds": 16,
              "ablation_seeds": 12},
    "add2": {"steps": 48, "pool_steps": 48, "eval_every": 4, "heldout_size": 200, "target_accuracy": 0.3,
             "warm_eval_every": 10, "conditions": ",".join(FIRST_EDITION), "seeds": 3, "ablation_seeds": 3},
}
# The smoke test checks the lab's mechanics, not a result: its warm start stops at 0.05 held-out
# accuracy (450 supervised steps here) where the sweep's goes on to 0.4 (1350 steps, 228 s idle).
# The fifth edition (chosen in its pilot: benchmarks/results/sample_efficiency_e5/plan.md): prompts
# return (a pool of 20 x 16 = 320 prompts passed 3 times in 60 steps) so that skipping has histories
# to read, and a checkpoint every 6 steps (rollouts-to-match in steps of 0.1).
EDITIONS = {4: {}, 5: {"steps": 60, "pool_steps": 20, "eval_every": 6, "conditions": ",".join(FIFTH_EDITION),
                       "seeds": 16, "ablation_seeds": 8}}
QUICK = {"steps": 10, "pool_steps": 5, "eval_every": 5, "seeds": 1, "ablation_seeds": 1,
         "conditions": "none,uniform,none_df", "target_accuracy": 0.05}


@dataclass
class Args:
    """Settings of the sweep; every field is a `--flag` (underscores become dashes)."""

    out_dir: Path | None = None
    """Where the runs and the summary go (default runs/sample_efficiency, + _quick / _add2)."""
    edition: int = 5
    """The lab's edition whose settings are the defaults (task `mixed` only; add2 is analysed as
    the fourth): 5 (skip, refill and replay, prompts returning: plan in
    results/sample_efficiency_e5/) or 4 (the eleven conditions of results/sample_efficiency/plan.md,
    a pool passed once)."""
    task: str = "mixed"
    """`mixed` (five bands of spread difficulty) or `add2` (the first edition: two-digit addition,
    its conditions, seeds and settings, so its figures can be rerun)."""
    quick: bool = False
    """The smoke test: one seed of none, uniform, none_df, 10 steps, the pool passed twice, from a
    warm start stopped at 0.05 held-out accuracy (its own cached model)."""
    conditions: str | None = None
    """Comma-separated conditions (default: the edition's, `FIFTH_EDITION` or `EDITION`; add2: the
    first edition's six). `none` (GRPO) is the baseline and must be among them."""
    seeds: int | None = None
    """Seeds of the conditions of the key pairs: the fifth edition's primary pair, none and
    skip_refill; the fourth's none, uniform, none_matched, age0, none_2epochs (and, when named,
    none_half_prompts, none_half_lr, advantage) (default 16; add2: 3)."""
    ablation_seeds: int | None = None
    """Seeds of every other condition (default: fifth edition 8, fourth 12; add2: 3)."""
    steps: int | None = None
    """Training steps per run (= rollout batches), the same for every condition (default: fifth
    edition 60, fourth 50; add2: 48)."""
    pool_steps: int | None = None
    """Steps per pass over the prompt pool (pool = pool_steps x prompts per step, stratified by
    band; `--train.num_episodes` = steps / pool_steps): a prompt returns every pool_steps steps
    (default: fifth edition 20 of 60 steps, each prompt seen 3 times, so that skipping has
    histories; fourth edition 50 = steps, no prompt returns; add2: 48)."""
    prompts_per_step: int = 16
    """Prompts per step (`--rollout.batch_size`)."""
    group_size: int = 8
    """Responses per prompt (`--rollout.n_samples_per_prompt`)."""
    train_batch: int = 64
    """Rollouts per optimizer step (`--train.batch_size`); none_matched takes 42."""
    policy_layers: int = 2
    """Layers of the policy (a Qwen3 with heads of 32 dimensions, half as many KV heads)."""
    policy_width: int = 128
    """Its hidden size (the MLP's is 4 x); the default 2 x 128 has 0.53M parameters, the second
    regime's 4 x 192 2.3M (4.3 x)."""
    lr: float = 1e-4
    """Actor learning rate (constant after a 3% warm-up, as common.sh); none_half_lr takes half."""
    max_new_tokens: int = 16
    """Response limit: an answer is `\\boxed{NNNN}` and the end token, at most ~10 tokens."""
    eval_every: int | None = None
    """Held-out evaluation every N steps, plus step 0 (the warm start) (default: fifth edition 6,
    fourth 10; add2: 4)."""
    replay_ratio: float = 0.5
    """Replayed rollouts per fresh rollout once replay starts (docs/METHOD.md default)."""
    replay_warmup: int = 4
    """Steps before replay starts (docs/METHOD.md: 20 of ~230 steps; here 4 of 50)."""
    replay_max_age: int = 10
    """Age limit tau_max (steps) of uniform / advantage (docs/METHOD.md default); the ablations use 2, 40."""
    naive_capacity: int = 512
    """naive: FIFO size in rollouts (4 steps' worth of fresh rollouts)."""
    freshness_tau: float = 5.0
    """freshness: decay time in steps (FreshPER used ~500 of many thousands of steps; scaled)."""
    freshness_capacity: int = 1280
    """freshness: FIFO capacity in rollouts (10 steps' worth, as tau_max for the others)."""
    success_per_prompt: int = 2
    """success (RLEP): replayed successes per fresh prompt, 2 x 16 prompts rounded to one batch of
    64: as many replayed rollouts as ratio 0.5 gives the other modes."""
    eval_samples: int = 8
    """Answers sampled per held-out problem at the rollout temperature: the primary metric is their
    mean (avg@k). Seeded per problem, the same for every condition (se_task.evaluate_heldout)."""
    heldout_size: int | None = None
    """Held-out problems, an equal share per band, never trained on (default 500; add2: 200)."""
    target_accuracy: float | None = None
    """Warm start: supervised training stops at the first check at or above this held-out greedy
    accuracy (default 0.25; add2: 0.3). In the pilot (results/sample_efficiency/pilot.md), GRPO
    gained +4.3 points of avg@8 in 50 steps from 0.25, +3.8 from 0.4."""
    warm_eval_every: int | None = None
    """Warm start: supervised steps between checks (default 50; add2: 10)."""
    run_timeout_s: int = 900
    """A run that takes longer is killed and reported as failed."""
    archive: Path | None = None
    """A .json.gz of finished runs kept between sessions (se_archive.py): each call adds its
    finished runs to it, and a planned run found in it (same command, same warm-start weights)
    is restored instead of trained."""
    analyse_only: bool = False
    """Skip training: summarise and plot the finished runs in out_dir, or, with --archive, the
    archive's runs (a results folder's committed record: out_dir is then that folder, which holds
    its warm_start.json)."""
    finalize: str = ""
    """`<condition>_seed<N>`: grade and record that run's existing training (no retraining), then exit."""

    def __post_init__(self) -> None:
        if self.task not in TASK_DEFAULTS:
            raise SystemExit(f"--task {self.task}: use one of {', '.join(TASK_DEFAULTS)}")
        if self.edition not in EDITIONS:
            raise SystemExit(f"--edition {self.edition}: use one of {', '.join(map(str, EDITIONS))}")
        if self.task != "mixed":
            self.edition = 4  # add2 is the first edition's task, analysed with the fourth's pairs
        edition = EDITIONS[self.edition]
        for name, value in {**TASK_DEFAULTS[self.task], **edition, **(QUICK if self.quick else {})}.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.out_dir is None:
            suffix = ("_add2" if self.task == "add2" else f"_e{self.edition}" if self.edition != 4 else "")
            suffix += "_quick" if self.quick else ""
            if self.larger_policy:
                suffix += f"_L{self.policy_layers}W{self.policy_width}"
            self.out_dir = REPO / f"runs/sample_efficiency{suffix}"
        self.out_dir = Path(self.out_dir)
        names = self.condition_list
        unknown = [c for c in names if c not in CONDITIONS]
        if unknown or se_analysis.BASELINE not in names:
            raise SystemExit(f"--conditions {self.conditions}: use some of {', '.join(CONDITIONS)}, "
                             f"including {se_analysis.BASELINE} (the baseline)")
        if self.steps % self.eval_every or self.steps % self.pool_steps:
            raise SystemExit(f"--steps {self.steps} must be a multiple of --eval-every {self.eval_every} (so the "
                             f"last step is evaluated) and of --pool-steps {self.pool_steps} (whole passes)")
        if any(self.rollouts_of(c) % self.train_batch for c in names if c not in TRAIN_BATCH):
            raise SystemExit(f"fresh rollouts per step ({self.prompts_per_step} x {self.group_size}, half the prompts "
                             f"for none_half_prompts) must be a multiple of --train-batch {self.train_batch}")
        if self.policy_width % 64:
            raise SystemExit(f"--policy-width {self.policy_width}: use a multiple of 64 (heads of 32 dimensions, "
                             "half as many KV heads)")
        self.task_config  # checks the held-out size against the bands

    @property
    def condition_list(self) -> list[str]:
        return [c.strip() for c in self.conditions.split(",") if c.strip()]

    def rollouts_of(self, cond: str) -> int:
        """Fresh rollouts per step of a condition."""
        return self.prompts_of(cond) * self.group_size

    def generated_all(self, statuses: list[dict], cond: str) -> bool:
        """Whether a run's logged steps generated every planned rollout (`lab/prompts_consumed`).
        With dynamic filtering a run may log fewer steps than planned: upstream skips a step
        whose groups were all dropped, and the session counts its prompts with the next step's."""
        consumed = sum(s.get("lab/prompts_consumed", 0) for s in statuses)
        return consumed * self.group_size == self.steps * self.rollouts_of(cond)

    @property
    def pool_size(self) -> int:
        return self.pool_steps * self.prompts_per_step

    @property
    def task_config(self) -> TaskConfig:
        try:
            return TaskConfig(family=self.task, heldout_size=self.heldout_size)
        except ValueError as e:
            raise SystemExit(str(e)) from None

    @property
    def warm_start_config(self) -> WarmStartConfig:
        # add2 keeps the first edition's tokenizer (see WarmStartConfig.split_digits)
        return WarmStartConfig(target_accuracy=self.target_accuracy, eval_every=self.warm_eval_every,
                               split_digits=self.task != "add2", hidden_size=self.policy_width,
                               num_hidden_layers=self.policy_layers, intermediate_size=4 * self.policy_width)

    @property
    def larger_policy(self) -> bool:
        """The second regime's policy (plan.md question 4), not the default 2 x 128."""
        return (self.policy_layers, self.policy_width) != (2, 128)

    @property
    def holm_conditions(self) -> tuple[str, ...]:
        """The conditions whose pre-registered pairs are Holm's family (plan.md): the edition's, whichever
        --conditions this call runs, so a call that runs some of them adjusts as the plan does; the
        second regime's one pair on its own."""
        if self.edition == 5 and self.task == "mixed":
            return FIFTH_EDITION
        return ("none", "uniform") if self.larger_policy else EDITION

    def train_batch_of(self, cond: str) -> int:
        return TRAIN_BATCH.get(cond, self.train_batch)

    def prompts_of(self, cond: str) -> int:
        """Prompts per step of a condition (the positive control takes half)."""
        return int(self.prompts_per_step * PROMPTS_SCALE.get(cond, 1.0))

    def seeds_of(self, cond: str) -> int:
        key = FIFTH_KEY if self.edition == 5 and self.task == "mixed" else KEY
        return self.seeds if cond in key else self.ablation_seeds


def parse_args(argv=None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    docs = field_help(Args)
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        help_text = docs.get(f.name, "").replace("%", "%%")
        if str(f.type) == "bool":
            parser.add_argument(flag, action="store_true", help=help_text)
        else:
            kind = {"int": int, "float": float, "str": str, "Path": Path}[str(f.type).split(" | ")[0]]
            parser.add_argument(flag, type=kind, default=f.default, help=help_text)
    return Args(**vars(parser.parse_args(argv)))
