"""The buffer's state machine (Hypothesis), against a twin that is repeatedly saved and reloaded:
run by tests/replay/test_state_machine.py on every registered mode, and by a new mode's own test
on that mode (README, "Adding a sampler or a mode": subclass with `MODE_CHOICES = ("<name>",)`).

Invariants: size never above capacity; nothing older than the age limit; fresh rollouts never
displaced; replay only of earlier steps (but for the age-0 control, which replays the step's own);
the reloaded twin draws exactly like the original.
"""
import math
import tempfile

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from replay import MODE_REGISTRY, ReplayBuffer, ReplayConfig, RolloutBatch
from replay.testing import random_batch

SETTINGS = settings(max_examples=100, stateful_step_count=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class BufferMachine(RuleBasedStateMachine):
    """The buffer of one of `MODE_CHOICES` (every registered mode; a subclass narrows it to a new
    one, README "Adding a sampler or a mode")."""

    MODE_CHOICES = tuple(MODE_REGISTRY)

    @initialize(mode_index=st.integers(0, 2 ** 16),
                ratio=st.sampled_from([0.0, 0.5, 1.0, 2.0]), warmup=st.integers(0, 3),
                max_age=st.none() | st.integers(1, 3), capacity=st.integers(1, 60), replacement=st.booleans(),
                seed=st.integers(0, 1000))
    def setup(self, mode_index, ratio, warmup, max_age, capacity, replacement, seed):
        mode = self.MODE_CHOICES[mode_index % len(self.MODE_CHOICES)]
        self.cfg = ReplayConfig(mode=mode, ratio=ratio, warmup=warmup, max_age=max_age, capacity=capacity,
                                replacement=replacement, seed=seed, tau=2.0, beta_steps=8,
                                group_size=4)  # K, as the integration sets it (exgrpo's buckets)
        self.buf, self.twin = ReplayBuffer(self.cfg), ReplayBuffer(self.cfg)
        self.step = 0
        self.tmp = tempfile.TemporaryDirectory()

    def teardown(self):
        if hasattr(self, "tmp"):
            self.tmp.cleanup()

    @rule(n_groups=st.integers(0, 4), group_size=st.integers(1, 4), seed=st.integers(0, 2 ** 16),
          advance=st.integers(1, 3))
    def train_step(self, n_groups, group_size, seed, advance):
        self.step += advance
        fresh = random_batch(np.random.default_rng(seed), n_groups, group_size, self.step, n_prompts=4,
                             group_id_base=self.step * 10)
        limit = self.cfg.max_age_steps
        before = self.buf.store.view()
        available = int(np.sum(before.versions >= self.step - limit)) if limit is not None else len(before)
        comp = self.buf.step(fresh, self.step)
        twin = self.twin.step(fresh, self.step)
        # The reloaded twin continues exactly like the original.
        assert np.array_equal(comp.indices, twin.indices)
        for f in RolloutBatch.__dataclass_fields__:
            assert np.array_equal(getattr(comp.batch, f), getattr(twin.batch, f)), f
        layout = ("replay/nbytes", "replay/bytes_per_token")  # a reload compacts storage
        drop = lambda m: {k: v for k, v in m.items() if k not in layout}  # noqa: E731
        assert drop(self.buf.metrics()) == drop(self.twin.metrics())
        # Fresh never displaced: every fresh rollout is in the batch, in order.
        batch = comp.batch
        fresh_rows = batch.select(np.flatnonzero(~comp.is_replay))
        assert np.array_equal(fresh_rows.response_ids, fresh.response_ids)
        assert np.array_equal(fresh_rows.response_offsets, fresh.response_offsets)
        rep = comp.replayed
        target = 0 if self.step < self.cfg.warmup else math.floor(self.cfg.ratio * len(fresh) + 0.5)
        if self.cfg.mode == "age0":  # the control replays the step's own rows of A != 0, never the store's
            assert np.all(rep.versions == self.step) and len(comp.indices) == 0
            assert len(rep) == (target if np.any(fresh.advantages != 0) else 0)
            assert set(rep.advantages.tolist()) <= set(fresh.advantages[fresh.advantages != 0].tolist())
            return
        assert np.all(rep.versions < self.step)
        if limit is not None:
            assert np.all(self.step - rep.versions <= limit)
        k = min(target, available)
        if self.cfg.mode in ("uniform", "advantage", "freshness"):
            assert len(rep) == (k if self.cfg.replacement else min(k, available))
            if not self.cfg.replacement and self.cfg.mode != "freshness":  # FreshPER always replaces
                assert len(set(comp.indices.tolist())) == len(comp.indices)
        elif self.cfg.mode == "success":
            assert np.all(rep.rewards > self.cfg.success_threshold)
            assert set(rep.prompt_uids.tolist()) <= set(fresh.prompt_uids.tolist())
        elif k == 0:
            assert len(rep) == 0

    @rule(through_file=st.booleans())
    def save_and_reload_twin(self, through_file):
        if through_file:
            path = f"{self.tmp.name}/replay.npz"
            self.twin.save(path)
            self.twin = ReplayBuffer.load(path, self.cfg)
        else:
            state = self.twin.state_dict()
            self.twin = ReplayBuffer(self.cfg)
            self.twin.load_state_dict(state)

    @invariant()
    def bounded_and_twinned(self):
        if not hasattr(self, "buf"):
            return
        assert len(self.buf) <= self.cfg.capacity
        view, twin = self.buf.store.view(), self.twin.store.view()
        for name in ("serials", "priorities", "newest"):
            assert np.array_equal(getattr(view, name), getattr(twin, name)), name
        assert view.max_priority == twin.max_priority
        assert self.buf.store.counters == self.twin.store.counters
