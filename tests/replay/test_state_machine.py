"""Hypothesis state machines over the store and the buffer, each against a plain-Python model
and a twin that is repeatedly saved and reloaded (it must keep drawing exactly like the original).

Invariants: size never above capacity; nothing older than the age limit after eviction; the
view equals the model (so draws index only live rollouts, and gathers return their data; the
per-rollout priorities, the newest insertion and the running maximum priority survive eviction,
compaction and reloads); no duplicates without replacement; fresh rollouts never displaced;
replay only of earlier steps.
"""
import math
import tempfile

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from buffer_machine import SETTINGS, BufferMachine  # tests/support: a new mode runs it too (README)
from replay import MODE_REGISTRY, REFUSAL_REASONS, RolloutBatch, RolloutStore, load_state, save_state
from replay import samplers
from replay.testing import random_batch


def _rows(batch):
    """Per-rollout dicts (the model's representation)."""
    rows = []
    for i in range(len(batch)):
        r = slice(batch.response_offsets[i], batch.response_offsets[i + 1])
        rows.append(dict(prompt=batch.prompt(i).tolist(), response=batch.response(i).tolist(),
                         mask=batch.action_mask[r].tolist(), logp=batch.behaviour_logprobs[r].tolist(),
                         reward=float(batch.rewards[i]), adv=float(batch.advantages[i]),
                         uid=int(batch.prompt_uids[i]), group=int(batch.group_ids[i]), version=int(batch.versions[i])))
    return rows


def _reason(row):
    if not row["response"]:
        return "empty_response"
    if not math.isfinite(row["reward"]):
        return "non_finite_reward"
    if not math.isfinite(row["adv"]):
        return "non_finite_advantage"
    if any(m and not math.isfinite(lp) for m, lp in zip(row["mask"], row["logp"])):
        return "non_finite_logprob"
    return None


# Every keep rule a registered mode holds, once each (the model below knows each by its name), and
# the thresholds they read.
KEEP_RULES = tuple({entry.keep.name: entry.keep for entry in MODE_REGISTRY.values()}.values())
THRESHOLDS = dict(min_abs_advantage=1e-6, success_threshold=0.5)


class StoreMachine(RuleBasedStateMachine):
    @initialize(capacity=st.integers(1, 40), max_age_steps=st.none() | st.integers(0, 4),
                keep=st.sampled_from(KEEP_RULES))
    def setup(self, capacity, max_age_steps, keep):
        settings = {k: v for k, v in THRESHOLDS.items() if k in keep.settings}
        self.kw = dict(capacity=capacity, max_age_steps=max_age_steps, keep=keep, **settings)
        self.store = RolloutStore(**self.kw)
        self.twin = RolloutStore(**self.kw)  # saved and reloaded along the way
        self.model: list[dict] = []  # live rollouts, oldest first
        self.counters = dict.fromkeys(self.store.counters, 0)
        self.step = 0
        self.serial = 0
        self.max_priority = 1.0
        self.tmp = tempfile.TemporaryDirectory()

    def teardown(self):
        if hasattr(self, "tmp"):
            self.tmp.cleanup()

    @rule(n_groups=st.integers(0, 4), group_size=st.integers(1, 4), seed=st.integers(0, 2 ** 16),
          faults=st.lists(st.tuples(st.sampled_from(["reward", "adv", "logp", "empty"]), st.integers(0, 15)),
                          max_size=3))
    def insert(self, n_groups, group_size, seed, faults):
        rng = np.random.default_rng(seed)
        rows = _rows(random_batch(rng, n_groups, group_size, self.step, prompt_len=(0, 3), response_len=(1, 4),
                                  n_prompts=5, partial_mask=bool(seed % 2), group_id_base=seed))
        for kind, i in faults:
            if not rows:
                break
            row = rows[i % len(rows)]
            if kind == "reward":
                row["reward"] = math.nan
            elif kind == "adv":
                row["adv"] = -math.inf
            elif kind == "logp" and row["logp"]:
                row["logp"][0] = math.nan  # refused only where the action mask is set
            else:
                row.update(response=[], mask=[], logp=[])
        batch = RolloutBatch.from_lists(*[[r[k] for r in rows] for k in
                                          ("prompt", "response", "mask", "logp", "reward", "adv", "uid", "group")],
                                        self.step)
        priorities = rng.random(len(batch)) + 0.01 if seed % 3 else None
        res = self.store.insert(batch, version=self.step, priorities=priorities)
        assert self.twin.insert(batch, version=self.step, priorities=priorities) == res
        for i, r in enumerate(rows):
            r["priority"] = 1.0 if priorities is None else float(priorities[i])
        # Model: refuse, then apply the keep rule, then trim to capacity from the oldest.
        reasons = [_reason(r) for r in rows]
        valid = [r for r, why in zip(rows, reasons) if why is None]
        informative_groups = {r["group"] for r in valid if abs(r["adv"]) >= 1e-6}
        # exgrpo: successes with |A| >= 1e-6, and the first success of each all-successful group (its marker)
        failed_groups = {r["group"] for r in valid if r["reward"] <= 0.5}
        marker = {}
        for r in valid:
            if r["reward"] > 0.5 and abs(r["adv"]) < 1e-6 and r["group"] not in failed_groups:
                marker.setdefault(r["group"], id(r))
        rule_of = {"all": lambda r: True, "success": lambda r: r["reward"] > 0.5,
                   "nonzero_advantage": lambda r: abs(r["adv"]) >= 1e-6,
                   "nonzero_group": lambda r: r["group"] in informative_groups,
                   "exgrpo": lambda r: r["reward"] > 0.5 and (abs(r["adv"]) >= 1e-6 or marker.get(r["group"]) == id(r)),
                   }[self.kw["keep"].name]
        kept = [r for r in valid if rule_of(r)]
        for why in REFUSAL_REASONS:
            assert res.refused[why] == reasons.count(why)
            self.counters[f"refused/{why}"] += reasons.count(why)
        assert res.inserted == len(kept) and res.filtered == len(valid) - len(kept)
        self.counters["inserted"] += len(kept)
        self.counters["skipped_unsuccessful" if self.kw["keep"].name in ("success", "exgrpo") else "skipped_zero_adv"] \
            += res.filtered
        for r in self.model:
            r["newest"] = False
        for r in kept:
            self.model.append(dict(r, serial=self.serial, reuse=0, newest=True))
            self.serial += 1
        over = max(0, len(self.model) - self.kw["capacity"])
        assert res.evicted_capacity == over
        self.counters["evicted_capacity"] += over
        del self.model[:over]

    @precondition(lambda self: len(self.model) > 0)
    @rule(seed=st.integers(0, 2 ** 16), n=st.integers(0, 6))
    def update_priorities(self, seed, n):
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, len(self.model), n)  # repeats allowed: the last value wins
        values = rng.random(n) * 3 + 1e-6
        self.store.update_priorities(idx, values)
        self.twin.update_priorities(idx, values)
        for i, v in zip(idx.tolist(), values.tolist()):
            self.model[i]["priority"] = v
        self.max_priority = max([self.max_priority] + values.tolist())

    @rule(by=st.integers(0, 3))
    def advance_step(self, by):
        self.step += by

    @rule()
    def evict(self):
        got = self.store.evict(self.step)
        assert self.twin.evict(self.step) == got
        limit = self.kw["max_age_steps"]
        survivors = [r for r in self.model if limit is None or self.step - r["version"] <= limit]
        assert got == (len(self.model) - len(survivors), 0)
        self.counters["evicted_age"] += got[0]
        self.model = survivors
        if limit is not None:
            assert np.all(self.step - self.store.view().versions <= limit)

    @precondition(lambda self: len(self.model) > 0)
    @rule(name=st.sampled_from(["uniform", "advantage", "freshness", "success", "group"]), k=st.integers(0, 12),
          replacement=st.booleans(), seed=st.integers(0, 2 ** 16), reuse=st.booleans())
    def sample(self, name, k, replacement, seed, reuse):
        priority = dict(alpha=0.5, eps=1e-6, replacement=replacement)
        knobs = {"uniform": dict(replacement=replacement), "advantage": priority,
                 "freshness": dict(alpha=0.6, tau=3.0, beta_start=0.4, beta_end=1.0, beta_steps=10),
                 "success": dict(threshold=0.5, per_prompt=2), "group": {}}[name]
        fresh_uids = np.array([0, 2, 4]) if name == "success" and seed % 2 else None
        sampler = getattr(samplers, name)
        draw = sampler(self.store.view(), k, self.step, np.random.default_rng(seed), fresh_prompt_uids=fresh_uids,
                       **knobs)
        twin = sampler(self.twin.view(), k, self.step, np.random.default_rng(seed), fresh_prompt_uids=fresh_uids,
                       **knobs)
        assert np.array_equal(draw.indices, twin.indices) and np.array_equal(draw.weights, twin.weights)
        idx = draw.indices
        assert idx.dtype == np.int64 and len(draw.weights) == len(idx)
        assert np.all((idx >= 0) & (idx < len(self.model)))
        if name in ("uniform", "advantage") and not replacement or name == "success":
            assert len(set(idx.tolist())) == len(idx)
        if name == "freshness":  # PER draws with replacement, exactly k
            assert len(idx) == max(k, 0) and np.all(draw.weights > 0) and np.all(draw.weights <= 1)
        if name != "group":
            assert len(idx) <= k
        if name == "success":
            assert all(self.model[i]["reward"] > 0.5 for i in idx)
        # Gathered data is exactly the model's rollouts at those indices.
        got = _rows(self.store.gather(idx))
        for g, i in zip(got, idx):
            want = self.model[i]
            assert all(g[key] == want[key] for key in ("prompt", "response", "mask", "reward", "adv", "uid",
                                                       "group", "version"))
            # A NaN log-prob under a False mask is stored as is.
            assert np.array_equal(g["logp"], want["logp"], equal_nan=True)
        if reuse:
            self.store.increment_reuse(idx)
            self.twin.increment_reuse(idx)
            for i in idx:
                self.model[i]["reuse"] += 1

    @rule(through_file=st.booleans())
    def save_and_reload_twin(self, through_file):
        state = self.twin.state_dict()
        if through_file:
            path = f"{self.tmp.name}/store.npz"
            save_state(path, state)
            state = load_state(path)
        self.twin = RolloutStore(**self.kw)
        self.twin.load_state_dict(state)

    @invariant()
    def matches_model(self):
        if not hasattr(self, "store"):
            return
        assert len(self.store) <= self.kw["capacity"] and len(self.store) == len(self.model)
        view, twin = self.store.view(), self.twin.view()
        assert view.serials.tolist() == [r["serial"] for r in self.model]
        assert view.versions.tolist() == [r["version"] for r in self.model]
        assert view.advantages.tolist() == [r["adv"] for r in self.model]
        assert view.rewards.tolist() == [r["reward"] for r in self.model]
        assert view.reuse_counts.tolist() == [r["reuse"] for r in self.model]
        assert view.priorities.tolist() == [r["priority"] for r in self.model]
        assert view.newest.tolist() == [r["newest"] for r in self.model]
        assert view.max_priority == twin.max_priority == self.max_priority
        assert np.all(np.diff(view.versions) >= 0)
        for name in ("serials", "versions", "advantages", "rewards", "reuse_counts", "group_ids", "prompt_uids",
                     "response_lengths", "priorities", "newest"):
            assert np.array_equal(getattr(view, name), getattr(twin, name)), name
        assert self.store.counters == self.twin.counters == self.counters

    @invariant()
    def evicted_rows_held_are_bounded(self):
        """Capacity counts live rollouts only; the evicted rows still held (the first chunk's,
        before its start) stay within its live rows or the rows of one later chunk."""
        for store in (getattr(self, "store", None), getattr(self, "twin", None)):
            chunks = list(store._chunks) if store is not None else []  # noqa: SLF001 - memory layout
            assert sum(ch.n_live for ch in chunks) == len(self.model)
            if chunks:
                assert chunks[0].start <= max([chunks[0].n_live] + [len(ch) for ch in chunks[1:]])


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = SETTINGS
TestBufferMachine = BufferMachine.TestCase
TestBufferMachine.settings = SETTINGS
