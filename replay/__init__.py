"""The pure replay core: rollout storage, eviction, sampling and batch composition for GRPO.

Depends on numpy only; no torch, Ray,
DeepSpeed or vLLM. See docs/METHOD.md sections 2-4.
"""
from replay.buffer import FORMAT_VERSION, ReplayBuffer
from replay.checkpoint import ReplayCheckpointError, load_state, save_state
from replay.composer import (Composition, compose, compose_rlep, group_normalise, nominal_replay_count, replay_count,
                             replay_target)
from replay.config import ReplayConfig, field_help
from replay.keep import KeepRule
from replay.modes import MODES, OFF_POLICY  # registers the built-in modes and off-policy rules
from replay.registry import (MODE_REGISTRY, OFF_POLICY_REGISTRY, CheckpointRules, ModeHooks, OffPolicyRule, ReplayMode,
                             get_mode, get_off_policy, mode_names, off_policy_names, register_mode,
                             register_off_policy)
from replay.metrics import age_histogram, composition_metrics, store_metrics, zero_variance_group_fraction
from replay.record import REFUSAL_REASONS, RolloutBatch, refusals
from replay.samplers import (
    Draw,
    Sampler,
    advantage_priorities,
    beta_schedule,
    effective_sample_size,
    freshness_priorities,
    importance_weights,
    replayed_priorities,
    reward_fresh_priorities,
    sampler_from_config,
    stratified_draw,
    uniform_draw,
    weighted_draw,
)
from replay.store import InsertResult, RolloutStore, StoreView

__all__ = [
    "FORMAT_VERSION", "MODES", "MODE_REGISTRY", "OFF_POLICY", "OFF_POLICY_REGISTRY",
    "REFUSAL_REASONS", "CheckpointRules", "KeepRule", "ModeHooks", "OffPolicyRule", "ReplayMode", "get_mode",
    "get_off_policy",
    "mode_names", "off_policy_names", "register_mode", "register_off_policy",
    "Composition", "Draw", "InsertResult", "ReplayBuffer", "ReplayCheckpointError", "ReplayConfig",
    "RolloutBatch", "RolloutStore", "Sampler", "StoreView",
    "advantage_priorities", "age_histogram", "beta_schedule", "compose", "compose_rlep",
    "composition_metrics", "effective_sample_size", "field_help", "freshness_priorities",
    "group_normalise", "importance_weights", "load_state", "nominal_replay_count", "refusals",
    "replay_count", "replay_target", "replayed_priorities", "reward_fresh_priorities",
    "sampler_from_config", "save_state", "store_metrics", "stratified_draw", "uniform_draw",
    "weighted_draw", "zero_variance_group_fraction",
]

# Last, with every name above defined: the modes of replay/plugins/, one module each, register themselves.
import replay.plugins  # noqa: E402,F401
