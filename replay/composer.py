"""Composers: turn one step's fresh rollouts plus a draw from the store into the training batch.

Fresh-anchored (`compose`): all fresh rollouts, then k = round(ratio * n_fresh) replayed ones.
RLEP (`compose_rlep`): up to M stored successes of its prompt join each fresh group, and the
advantages of each enlarged group are recomputed over its G + M members. In both, fresh rollouts
are never displaced. Fresh-anchored replay counts in multiples of `multiple_of` (the integration's
training batch) by one rounding rule, `nominal_replay_count`; RLEP replays its exact count and
names the inert rows that complete the last batch.
Composers read the store but never change it (the buffer counts reuse and inserts).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

import numpy as np

from replay.config import ReplayConfig
from replay.record import RolloutBatch
from replay.samplers import Draw, Sampler
from replay.store import RolloutStore


@dataclass(frozen=True, eq=False)
class Composition:
    """One step's training data. `batch` = fresh then replayed (RLEP: reordered by group)."""

    fresh: RolloutBatch  # all of the step's fresh rollouts (RLEP: advantages of enlarged groups recomputed)
    replayed: RolloutBatch  # (m rollouts) drawn from the store, possibly empty
    weights: np.ndarray  # (m,) float32 importance weights of the replayed rollouts
    indices: np.ndarray  # (m,) int64 store-view indices they were drawn at
    info: dict[str, float] = field(default_factory=dict)
    order: np.ndarray | None = None  # RLEP: permutation of fresh + replayed that groups by prompt
    # Rows without loss the integration adds: RLEP's, to complete its replayed rows to whole training
    # batches; with refill (`extra`), the filtered rows the store could not supply.
    inert: int = 0
    refilled: int = 0  # of the replayed rollouts, how many stand for filtered rows (`extra`), not the usual share
    # The composer gave `fresh` advantages of its own (RLEP's enlarged groups): the integration writes
    # them back to the fresh rows it trains.
    rewrite_fresh: bool = False

    @functools.cached_property
    def batch(self) -> RolloutBatch:
        both = RolloutBatch.concat([self.fresh, self.replayed])
        return both if self.order is None else both.select(self.order)

    @property
    def is_replay(self) -> np.ndarray:
        """(len(batch),) bool: which rows of `batch` are replayed (to split statistics)."""
        flags = np.r_[np.zeros(len(self.fresh), np.bool_), np.ones(len(self.replayed), np.bool_)]
        return flags if self.order is None else flags[self.order]



def nominal_replay_count(n: int, ratio: float, multiple_of: int = 1) -> int:
    """round(ratio * n) to the nearest multiple of `multiple_of`, halves up: the one rounding rule
    of the replayed count (the buffer's draws, the launcher's message, the rehearsal all use it).

    With `multiple_of` m > 1 (the integration passes its training batch size, so that every
    data-parallel rank runs whole optimizer steps), e.g. 0.625 x 1024 = 640 = 2.5 batches of 256
    rounds to 768, and 0.125 x 1024 = 0.5 batches to 256.
    """
    if isinstance(multiple_of, bool) or not isinstance(multiple_of, int) or multiple_of < 1:
        raise ValueError(f"multiple_of must be an integer >= 1, got {multiple_of!r}")
    return math.floor(ratio * n / multiple_of + 0.5) * multiple_of


def replay_target(config: ReplayConfig, n_fresh: int, n_groups: int, multiple_of: int = 1) -> int:
    """Rollouts one step replays once the store holds enough: the one rule per mode (its registry
    entry's `target`), used by the composers, the launcher's checks and its start-up line.

    success (RLEP): `per_prompt` for each of the step's `n_groups` fresh groups, exact (the
    integration adds inert rows to complete its last training batch). A prompt that comes twice in
    a batch is served twice, as RLEP's loader samples replay for each question of its batch on its
    own. Fresh-anchored modes: ratio x `n_fresh` in whole multiples of `multiple_of`
    (`nominal_replay_count`).
    """
    return config.entry.target(config, n_fresh, n_groups, multiple_of)


def replay_count(target: int, step: int, warmup: int, available: int, multiple_of: int = 1) -> int:
    """`target` (see `replay_target`), 0 before `warmup`, cut down to the largest multiple of
    `multiple_of` that `available` allows."""
    if step < warmup:
        return 0
    return max(0, min(target, available // multiple_of * multiple_of))


def group_normalise(rewards: np.ndarray, group_index: np.ndarray, divide_by_std: bool = True) -> np.ndarray:
    """GRPO advantages as OpenRLHF's `group_norm`: (r - mean) / (std + 1e-9) within each group,
    std with Bessel's correction (torch's default); `divide_by_std=False` is `dr_grpo`.

    rewards (N,), group_index (N,) ints in [0, G); returns (N,) float32. A group of one has no
    spread: its advantage is 0 (torch would give NaN).
    """
    r = rewards.astype(np.float64)
    counts = np.bincount(group_index)
    mean = np.bincount(group_index, weights=r) / np.maximum(counts, 1)
    dev = r - mean[group_index]
    if not divide_by_std:
        return dev.astype(np.float32)
    var = np.bincount(group_index, weights=dev * dev) / np.maximum(counts - 1, 1)
    adv = dev / (np.sqrt(var)[group_index] + 1e-9)
    return np.where(counts[group_index] > 1, adv, 0.0).astype(np.float32)


def compose(fresh: RolloutBatch, store: RolloutStore, sampler: Sampler, config: ReplayConfig, step: int,
            rng: np.random.Generator, multiple_of: int = 1, extra: int = 0) -> Composition:
    """Fresh-anchored batch: every fresh rollout, plus up to round(ratio * n) replayed ones (a
    multiple of `multiple_of`, see `replay_count`), n = the fresh rollouts plus `extra`.

    `extra` (refill, `ReplayConfig.refill`): rows of the step's batch whose groups dynamic
    filtering dropped; after the warm-up, up to that many more are drawn in the same draw from what
    the store holds beyond the usual share (`refilled`), and the rest are named `inert`, so the
    batch keeps the size it was generated at."""
    target = replay_target(config, len(fresh) + extra, len(np.unique(fresh.group_ids)), multiple_of)
    k = replay_count(target, step, config.effective_warmup, len(store), multiple_of)
    refill = 0 if step < config.effective_warmup else min(extra, len(store) - k)
    if k + refill == 0:
        return fresh_only(fresh, inert=extra)
    draw = sampler(store.view(), k + refill, step, rng, fresh_prompt_uids=fresh.prompt_uids)
    # Only whole-group draws (naive) miss their count: drop the tail, cutting the last group short,
    # to a whole multiple (no refill) or to at most the count asked for (the refill's inert rows complete it).
    cut = len(draw.indices) // multiple_of * multiple_of if not extra else min(len(draw.indices), k + refill)
    if cut != len(draw.indices):
        draw = Draw(draw.indices[:cut], draw.weights[:cut], dict(draw.info))
    refilled = max(0, min(refill, cut - k))
    return Composition(fresh, store.gather(draw.indices), draw.weights, draw.indices, dict(draw.info),
                       inert=extra - refilled, refilled=refilled)


def compose_rlep(fresh: RolloutBatch, store: RolloutStore, sampler: Sampler, config: ReplayConfig, step: int,
                 rng: np.random.Generator, multiple_of: int = 1, *, divide_by_std: bool = True,
                 extra: int = 0) -> Composition:
    """RLEP: each fresh group gets min(`per_prompt`, its prompt's stored successes), without
    replacement within the group (the sampler's rule), which join that group (they take its group
    id); the advantages of each enlarged group are recomputed over all its members
    (`divide_by_std=False`: dr_grpo). Groups that got no replay keep their advantages; either way
    the composition says so (`rewrite_fresh`), and the integration writes them back. The count is
    not rounded: `inert` says how many rows the integration must add, with no loss, to make the
    replayed rows a multiple of `multiple_of` (its training batch)."""
    comp = _compose_rlep(fresh, store, sampler, config, step, rng, multiple_of, divide_by_std, extra)
    return dataclasses.replace(comp, rewrite_fresh=True)


def _compose_rlep(fresh: RolloutBatch, store: RolloutStore, sampler: Sampler, config: ReplayConfig, step: int,
                  rng: np.random.Generator, multiple_of: int, divide_by_std: bool, extra: int) -> Composition:
    if extra:
        raise ValueError("RLEP cannot take the rows of filtered groups (replay.refill): a filtered group has no "
                         "fresh rows for its replayed successes to join")
    group_rows = np.sort(np.unique(fresh.group_ids, return_index=True)[1])  # each fresh group's first row
    if step < config.effective_warmup or not len(store) or not len(group_rows):
        return fresh_only(fresh)
    draw, host_row = _draw_per_group(fresh, group_rows, store, sampler, config, step, rng)
    if not len(draw.indices):
        return fresh_only(fresh, dict(draw.info))
    replayed = store.gather(draw.indices)
    replayed = replayed.replace(group_ids=fresh.group_ids[host_row].copy())  # each joins its host group
    # Dense group index over fresh + replayed; a group's rank = its first fresh row.
    _, first, group = np.unique(fresh.group_ids, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))  # group -> order of first appearance
    group_all = np.r_[group.reshape(-1), group[host_row].reshape(-1)]
    enlarged = np.zeros(len(first), np.bool_)
    enlarged[group[host_row]] = True
    rewards = np.r_[fresh.rewards, replayed.rewards]
    new_adv = group_normalise(rewards, group_all, divide_by_std)
    adv = np.where(enlarged[group_all], new_adv, np.r_[fresh.advantages, replayed.advantages]).astype(np.float32)
    n = len(fresh)
    order = np.lexsort((np.arange(len(group_all)), rank[group_all]))  # by group, fresh before replayed
    inert = -len(replayed) % multiple_of
    info = dict(draw.info) | {"enlarged_group_fraction": float(enlarged.mean()), "inert_rows": float(inert)}
    return Composition(fresh.replace(advantages=adv[:n]), replayed.replace(advantages=adv[n:]), draw.weights,
                       draw.indices, info, order=order, inert=inert)


def _draw_per_group(fresh: RolloutBatch, group_rows: np.ndarray, store: RolloutStore, sampler: Sampler,
                    config: ReplayConfig, step: int, rng: np.random.Generator) -> tuple[Draw, np.ndarray]:
    """RLEP's draw: up to `per_prompt` successes for each fresh group (`replay_target`), and the
    fresh row of the group each one joins.

    The sampler serves distinct prompts, so a prompt that comes in several groups is drawn for
    once per group, in rounds: round j serves every prompt's (j+1)-th group. Rounds are
    independent, so two groups of one prompt may get the same success, as two questions of
    RLEP's batch may. The info is the first round's (its candidates are every prompt's)."""
    uids = fresh.prompt_uids[group_rows]
    occurrence = _occurrence(uids)
    draws, hosts = [], []
    for j in range(int(occurrence.max()) + 1):
        rows = group_rows[occurrence == j]
        target = replay_target(config, len(fresh), len(rows))
        draw = sampler(store.view(), target, step, rng, fresh_prompt_uids=fresh.prompt_uids[rows])
        row_of = dict(zip(fresh.prompt_uids[rows].tolist(), rows.tolist()))
        draws.append(draw)
        hosts.append(np.array([row_of[u] for u in store.view().prompt_uids[draw.indices].tolist()], np.int64))
    merged = Draw(np.concatenate([d.indices for d in draws]), np.concatenate([d.weights for d in draws]),
                  dict(draws[0].info))
    return merged, np.concatenate(hosts)


def _occurrence(values: np.ndarray) -> np.ndarray:
    """(n,) for each value, how many times it came before: [7, 8, 7, 7] -> [0, 0, 1, 2]."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    rank = np.arange(len(values)) - np.repeat(starts, np.diff(np.r_[starts, len(values)]))
    out = np.empty(len(values), np.int64)
    out[order] = rank
    return out


def fresh_only(fresh: RolloutBatch, info: dict[str, float] | None = None, inert: int = 0) -> Composition:
    """The step's batch with nothing replayed (the warm-up, an empty store or draw)."""
    return Composition(fresh, RolloutBatch.empty(), np.zeros(0, np.float32), np.zeros(0, np.int64), info or {},
                       inert=inert)
