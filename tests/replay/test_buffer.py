"""ReplayBuffer: the per-step order, metrics, and checkpoints (atomic, checked, resumable)."""
import os

import numpy as np
import pytest

from replay import REFUSAL_REASONS, ReplayBuffer, ReplayCheckpointError, ReplayConfig
from replay.testing import random_batch

CFG = ReplayConfig(mode="advantage", warmup=2, max_age=3, capacity=500, seed=11)


def _run(buf, steps, seed=0, start=0):
    rng = np.random.default_rng(seed)
    comps = []
    for step in range(start, start + steps):
        comps.append(buf.step(random_batch(rng, 4, 4, step, n_prompts=10, group_id_base=100 * step), step))
    return comps


def _same(a, b):
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)


def test_step_order_never_replays_own_step_and_counts_reuse():
    buf = ReplayBuffer(CFG)
    comps = _run(buf, 8)
    for step, comp in enumerate(comps):
        if step < CFG.warmup:
            assert len(comp.replayed) == 0
            continue
        assert len(comp.replayed) == 8  # round(0.5 * 16)
        ages = step - comp.replayed.versions
        assert ages.min() >= 1 and ages.max() <= 3  # drawn after age eviction, before insertion
    assert buf.store.view().versions.min() >= 7 - 3
    m = buf.metrics()
    assert m["replay/size"] == len(buf) and m["replay/replayed"] == 8
    assert m["replay/replayed_fraction"] == pytest.approx(8 / 24)
    assert m["replay/reuse_max"] >= 1 and m["replay/unique_replayed"] == 8
    assert sum(v for k, v in m.items() if k.startswith("replay/age_hist/")) == pytest.approx(1.0)
    assert m["replay/age_hist/0"] == 0.0
    live = buf.store.view()
    assert live.reuse_counts.sum() > 0


def test_metrics_are_flat_replay_keys_with_counters():
    buf = ReplayBuffer(CFG)
    rng = np.random.default_rng(1)
    fresh = random_batch(rng, 4, 4, 0)
    fresh = fresh.replace(rewards=np.where(np.arange(16) == 0, np.nan, fresh.rewards).astype(np.float32))
    buf.step(fresh, 0)
    m = buf.metrics()
    assert all(k.startswith("replay/") and isinstance(v, float) for k, v in m.items())
    for reason in REFUSAL_REASONS:
        assert f"replay/refused/{reason}" in m
    assert m["replay/refused/non_finite_reward"] == 1
    assert m["replay/inserted"] + m["replay/skipped_zero_adv"] == 15
    for key in ("evicted_age", "evicted_capacity", "age_mean", "age_max", "reuse_mean", "ess", "bytes_per_token",
                "zero_variance_group_fraction"):
        assert f"replay/{key}" in m


def test_freshness_metrics_include_importance_weights():
    buf = ReplayBuffer(ReplayConfig(mode="freshness", warmup=0, seed=3, beta_end=1.0, beta_steps=20))
    _run(buf, 3)
    m = buf.metrics()
    assert 0 < m["replay/is_weight_mean"] <= m["replay/is_weight_max"] <= 1.0
    assert m["replay/is_beta"] == pytest.approx(0.4 + 0.6 * 2 / 20)  # linear in the step, 1.0 at step 20


def test_freshness_beta_is_fixed_at_its_references_value_by_default():
    """FreshPER's reference computes its weights with a fixed beta of 0.4: the weight of a replayed
    rollout does not fall over the run (annealed to 1, a success's fell ~160-fold, docs/METHOD.md)."""
    buf = ReplayBuffer(ReplayConfig(mode="freshness", warmup=0, seed=3))  # no run length needed
    betas = []
    for comp in _run(buf, 6):
        assert len(comp.replayed) or not betas  # every step after the first replays
        betas.append(buf.metrics()["replay/is_beta"])
    assert betas[1:] == [pytest.approx(0.4)] * 5


def test_freshness_anneals_over_the_run_it_is_given():
    with pytest.raises(ValueError, match="replay.beta_steps is unset"):
        ReplayBuffer(ReplayConfig(mode="freshness", beta_end=1.0))
    config = ReplayConfig(mode="freshness")
    assert config.for_run(236).beta_steps == 236
    assert ReplayConfig(mode="freshness", beta_steps=50).for_run(236).beta_steps == 50  # the user's value stays
    assert ReplayConfig(mode="advantage").for_run(236).beta_steps is None  # unused there: left alone


def test_mode_none_is_plain_grpo():
    buf = ReplayBuffer(ReplayConfig())
    rng = np.random.default_rng(2)
    fresh = random_batch(rng, 3, 4)
    comp = buf.step(fresh, 0)
    assert comp.batch is fresh and len(buf) == 0
    assert buf.metrics()["replay/replayed"] == 0


def test_steps_must_increase():
    buf = ReplayBuffer(CFG)
    _run(buf, 2)
    with pytest.raises(ValueError, match="steps must increase"):
        buf.step(random_batch(np.random.default_rng(0), 1, 2), 1)


def test_save_load_continues_exactly(tmp_path):
    a = ReplayBuffer(CFG)
    _run(a, 5)
    path = tmp_path / "replay.npz"
    a.save(path)
    b = ReplayBuffer.load(path, CFG)
    assert b.last_step == a.last_step and b.store.counters == a.store.counters
    for ca, cb in zip(_run(a, 4, seed=9, start=5), _run(b, 4, seed=9, start=5)):
        assert np.array_equal(ca.indices, cb.indices) and _same(ca.batch, cb.batch)
    assert a.metrics() == b.metrics()


def test_save_is_atomic(tmp_path, monkeypatch):
    a = ReplayBuffer(CFG)
    _run(a, 3)
    path = tmp_path / "replay.npz"
    a.save(path)
    good = path.read_bytes()
    _run(a, 2, start=3)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(np, "savez", lambda f, **members: (f.write(b"PK\x03\x04 partial"), crash()))
    with pytest.raises(KeyboardInterrupt):
        a.save(path)
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["replay.npz"]
    monkeypatch.undo()
    assert ReplayBuffer.load(path, CFG).last_step == 2


def test_corrupt_or_incompatible_checkpoints_name_the_file(tmp_path):
    a = ReplayBuffer(CFG)
    _run(a, 3)
    path = tmp_path / "replay.npz"
    a.save(path)
    data = bytearray(path.read_bytes())

    flipped = tmp_path / "flipped.npz"
    pos = data.index(b"__meta__")  # corrupt the stored payload near the metadata, not only a header
    flipped.write_bytes(bytes(data[:pos - 40]) + bytes([data[pos - 40] ^ 0xFF]) + bytes(data[pos - 39:]))
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(bytes(data[: len(data) // 2]))
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a checkpoint at all")
    for bad in (flipped, truncated, garbage):
        with pytest.raises(ReplayCheckpointError, match=bad.name):
            ReplayBuffer.load(bad, CFG)

    with pytest.raises(ReplayCheckpointError, match="replay.mode='advantage'.*'uniform'"):
        ReplayBuffer.load(path, ReplayConfig(mode="uniform", warmup=2, max_age=3))
    missing = tmp_path / "missing.npz"
    for config in (CFG, ReplayConfig(mode="advantage", allow_empty_resume=True)):  # the trainer decides
        with pytest.raises(ReplayCheckpointError, match="missing.npz: no such replay checkpoint"):
            ReplayBuffer.load(missing, config)


def test_corrupt_array_bytes_fail_the_checksum(tmp_path):
    from replay import load_state, save_state
    path = tmp_path / "state.npz"
    save_state(path, {"a": np.arange(1000, dtype=np.int32), "n": 3, "nested": {"b": np.ones(3)}})
    state = load_state(path)
    assert state["n"] == 3 and np.array_equal(state["a"], np.arange(1000)) and state["nested"]["b"].sum() == 3
    # Rewrite one array member with different bytes but a valid zip: only the checksum can tell.
    import zipfile
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    name = next(n for n in members if n.startswith("a."))
    raw = bytearray(members[name])
    raw[-1] ^= 0x01
    members[name] = bytes(raw)
    with zipfile.ZipFile(path, "w") as z:
        for n, payload in members.items():
            z.writestr(n, payload)
    with pytest.raises(ReplayCheckpointError, match="state.npz: checksum mismatch"):
        load_state(path)


def test_async_rows_keep_their_generation_version_and_age_from_it():
    """`recorded_versions` (async training): a fresh row is stored with the version that generated
    it, which may lag the step; eviction by age and the replayed ages count from that version."""
    buf = ReplayBuffer(CFG)  # max_age 3
    rng = np.random.default_rng(3)
    steps = 7
    for step in range(steps):
        fresh = random_batch(rng, 4, 4, step, n_prompts=10, group_id_base=100 * step)
        # half the batch generated a version behind, half by the step's own weights (over-sampling),
        # listed newest first
        versions = np.where(np.arange(16) < 8, step, max(step - 1, 0))
        comp = buf.step(fresh.replace(versions=versions), step, recorded_versions=True)
        if step >= CFG.warmup:
            ages = step - comp.replayed.versions
            assert len(comp.replayed) and ages.min() >= 1 and ages.max() <= 3
    live = buf.store.view().versions
    assert np.all(np.diff(live) >= 0)  # stored oldest first, whatever the batch's row order
    assert live.min() == steps - 1 - 3 and live.max() == steps - 1  # evicted by age from generation
    assert set(live) == set(range(steps - 4, steps))
    with pytest.raises(ValueError, match="later policy"):
        buf.step(random_batch(rng, 4, 4, 99), steps, recorded_versions=True)
