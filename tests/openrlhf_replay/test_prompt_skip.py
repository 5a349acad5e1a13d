"""Pre-rollout skipping's seam (openrlhf_replay/trainer/ppo_utils/prompt_skip.py) on upstream's real
`SamplesGenerator`: its own `generate_samples`, `_generate_vllm`, `_dispatch_prompts_to_vllm` and
`_process_response_into_experience` run; the vLLM engines, and the Ray calls that reach them, are
the stand-ins (vLLM cannot run in a unit test). The whole pipeline runs it in
tests/pipeline/test_cpu_pipeline.py (the `filter` run)."""
from types import SimpleNamespace

import pytest
from openrlhf.trainer.ppo_utils import samples_generator as upstream_module
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from openrlhf.utils import get_strategy

from openrlhf_replay.cli.train_ppo_ray import replay_arg_errors
from openrlhf_replay.trainer.ppo_utils.prompt_skip import (SKIP_CKPT_KEY, install_skip, load_skip_state, pop_skip_info,
                                                            prompt_text_uid, save_skip_state)
from openrlhf_replay.trainer.ppo_utils.samples_generator import ReplaySamplesGenerator
from replay import ReplayCheckpointError, ReplayConfig
from replay.skip import EASY, HARD, SkipRule

N_PROMPTS, N = 16, 4


def _rewards(prompt: str) -> list[float]:
    """p0, p4, ...: always right; p1, p5, ...: always wrong; the rest: mixed."""
    kind = int(prompt[1:]) % 4
    return [1.0] * N if kind == 0 else [0.0] * N if kind == 1 else [1.0, 0.0, 0.0, 1.0]


class FakeEngine:
    """A vLLM engine's two calls, answered at once; records the prompts it was sent."""

    def __init__(self):
        self.sent: list[str] = []
        self.get_num_unfinished_requests = SimpleNamespace(remote=lambda: 0)
        self.generate_responses = SimpleNamespace(remote=self._generate)

    def _generate(self, prompt, label, num_samples, **kwargs):
        self.sent.append(prompt)
        return [{"observation_tokens": [5, 6, 7, 8], "action_ranges": [(2, 4)], "reward": r, "scores": r,
                 "prompt": prompt, "label": label, "rollout_log_probs": None, "truncated": False, "extra_logs": {}}
                for r in _rewards(prompt)[:num_samples]]


@pytest.fixture
def generator(make_args, monkeypatch):
    """Upstream's generator over a loader of 16 prompts (batches of one, as the trainer builds it)."""
    monkeypatch.setattr(upstream_module, "ray", SimpleNamespace(
        get=lambda refs: refs, wait=lambda refs, num_returns, timeout: (refs[:num_returns], refs[num_returns:])))

    def build(*flags, cls=SamplesGenerator):
        args = make_args("--rollout.batch_size", 4, "--rollout.n_samples_per_prompt", N, "--replay.skip", *flags)
        loader = [(["d"], [f"p{i}"], ["1"], [None]) for i in range(N_PROMPTS)]
        gen = cls(get_strategy(args), loader, loader, None, [FakeEngine()])
        install_skip(gen, SkipRule.from_config(ReplayConfig.from_namespace(args), len(loader), 4))
        return gen

    return build


def _run_passes(gen, passes: int):
    """generate_samples until the loader has run dry `passes` times; each call's prompts sent,
    samples and figures."""
    calls, done = [], 0
    while done < passes:
        before = len(gen.vllm_engines[0].sent)
        samples, _, consumed, exhausted = gen.generate_samples(n_samples_per_prompt=N, max_len=64)
        figures, state = pop_skip_info(samples)
        calls.append({"sent": gen.vllm_engines[0].sent[before:], "consumed": consumed, "samples": samples,
                      "figures": figures, "state": state})
        done += exhausted
    return calls


def test_skipped_prompts_are_not_generated_and_every_step_still_sends_a_full_batch(generator):
    gen = generator()
    calls = _run_passes(gen, 4)
    sent = [p for c in calls for p in c["sent"]]
    first_pass = sent[:N_PROMPTS]
    assert sorted(first_pass) == sorted(f"p{i}" for i in range(N_PROMPTS))  # no history yet: nothing skipped
    figures = [c["figures"] for c in calls if c["figures"]]
    skipped, deferred, drawn = (sum(f[f"replay/skip_{k}_prompts"] for f in figures)
                                for k in ("skipped", "deferred", "drawn"))
    rule = gen.skip_rule
    # the loader's 4 passes, counted (a call that found only a deferred tail sent nothing: its
    # figures wait for the next call)
    assert skipped > 0 and drawn + rule.tally.drawn == 4 * N_PROMPTS == len(sent) + skipped + deferred + \
        rule.tally.skipped + rule.tally.deferred
    for c in calls:  # a full batch every time: a pass's tail too short for one is deferred
        assert len(c["sent"]) in (0, 4) and c["consumed"] == len(c["sent"])
        assert len(c["samples"]) == N * len(c["sent"])
    mixed = {f"p{i}" for i in range(N_PROMPTS) if i % 4 > 1}
    assert all(sent.count(p) >= 3 for p in mixed)  # mixed prompts are never skipped (but in a deferred tail)
    assert rule.runs[prompt_text_uid("p0")][0] == EASY and rule.runs[prompt_text_uid("p1")][0] == HARD


def test_the_figures_and_state_ride_on_the_first_sample_and_eval_is_neither_skipped_nor_observed(generator):
    gen = generator()
    samples, *_ = gen.generate_samples(n_samples_per_prompt=N, max_len=64)
    assert "replay/skip_metrics" in samples[0].info and all("replay/skip_metrics" not in s.info for s in samples[1:])
    figures, state = pop_skip_info(samples)
    assert figures["replay/skip_drawn_prompts"] == 4 and state["prompts_drawn"] == 4
    assert all("replay/skip_state" not in s.info for s in samples)  # popped before upstream reads the info
    runs = dict(gen.skip_rule.runs)
    gen.generate_eval_samples(n_samples_per_prompt=N, max_len=64)
    assert gen.skip_rule.runs == runs and gen.skip_rule.prompts_drawn == 4


@pytest.mark.parametrize("refill", [False, True])
def test_dynamic_filtering_groups_are_observed_and_its_replacements_are_skip_checked(generator, refill):
    flags = ["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", 0.01, 0.99]
    flags += ["--replay.mode", "advantage", "--replay.refill"] if refill else []
    gen = generator(*flags, cls=ReplaySamplesGenerator)
    calls = _run_passes(gen, 3)
    rule, sent_prompts = gen.skip_rule, [p for c in calls for p in c["sent"]]
    for prompt, kind in (("p0", EASY), ("p1", HARD)):  # every group the filter dropped is in the history
        assert rule.runs[prompt_text_uid(prompt)] == (kind, sent_prompts.count(prompt))
    figures = [c["figures"] for c in calls if c["figures"]]
    drawn = sum(f["replay/skip_drawn_prompts"] for f in figures)
    skipped = sum(f["replay/skip_skipped_prompts"] for f in figures)
    deferred = sum(f["replay/skip_deferred_prompts"] for f in figures)
    sent = len(sent_prompts)
    assert skipped > 0 and drawn == sent + skipped + deferred == 3 * N_PROMPTS - rule.tally.drawn
    kept = [e.prompts[0] for c in calls for e in c["samples"]]
    assert all(int(p[1:]) % 4 > 1 for p in kept)  # the filter kept only the mixed groups


def test_the_state_file_round_trips_and_a_missing_one_is_an_error_naming_the_fix(tmp_path, generator):
    gen = generator()
    _run_passes(gen, 2)
    state = gen.skip_rule.state_dict()
    names = [save_skip_state(state, str(tmp_path), step, keep=2) for step in (2, 4, 6)]
    assert sorted(p.name for p in tmp_path.iterdir()) == names[1:]  # as many as upstream keeps
    loaded = load_skip_state({SKIP_CKPT_KEY: names[-1], "global_step": 6}, str(tmp_path), allow_empty=False)
    fresh = generator().skip_rule
    fresh.load_state_dict(loaded)
    assert fresh.runs == gen.skip_rule.runs and fresh.explore == gen.skip_rule.explore
    with pytest.raises(ReplayCheckpointError, match="--replay.allow_empty_resume"):
        load_skip_state({"global_step": 6}, str(tmp_path), allow_empty=False)
    assert load_skip_state({"global_step": 6}, str(tmp_path), allow_empty=True) is None


def test_a_sample_without_a_reward_is_an_error_naming_the_fix(generator):
    gen = generator()
    engine = gen.vllm_engines[0]
    plain = engine.generate_responses.remote
    engine.generate_responses = SimpleNamespace(remote=lambda **kw: [dict(r, reward=None, scores=None)
                                                                     for r in plain(**kw)])
    with pytest.raises(RuntimeError, match="reward function"):
        gen.generate_samples(n_samples_per_prompt=N, max_len=64)


def test_the_launch_checks_want_a_reward_function_and_take_skipping_alone(make_args):
    assert any("--reward.remote_url" in e for e in replay_arg_errors(make_args("--replay.skip")))
    assert replay_arg_errors(make_args("--replay.skip", "--reward.remote_url", "r.py")) == []
    assert ReplayConfig.from_namespace(make_args("--replay.skip")).active
    assert not ReplayConfig.from_namespace(make_args()).active
    with pytest.raises(ValueError, match="skip_explore"):
        replay_arg_errors(make_args("--replay.skip", "--replay.skip_explore", 2))
