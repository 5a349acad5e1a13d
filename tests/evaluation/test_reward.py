"""The OpenRLHF reward file: loaded by path as upstream does, called from many threads."""
import asyncio
import importlib.util
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("math_verify")
torch = pytest.importorskip("torch")

from evaluation import grader, verify  # noqa: E402

REWARD_PY = Path(__file__).resolve().parents[2] / "evaluation" / "reward.py"
INSTRUCTION = r"Please reason step by step, and put your final answer within \boxed{}."


@pytest.fixture(scope="module")
def reward_module():
    # Exactly how OpenRLHF 0.11.2 loads --reward.remote_url (utils/agent.py).
    mp = pytest.MonkeyPatch()
    mp.setenv("OPENRLHF_REPLAY_REWARD_WORKERS", "2")
    mp.setenv("OPENRLHF_REPLAY_REWARD_TIMEOUT_S", "3")
    mp.setattr(grader, "SHARED_POOL_WORKERS", grader.SHARED_POOL_WORKERS)  # restored by undo()
    spec = importlib.util.spec_from_file_location("reward_func", REWARD_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    mp.undo()


def chat_prompt(problem: str) -> str:
    return f"<|im_start|>user\n{problem}\n{INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"


# (problem, response, label, expected reward)
CALLS = [
    ("What is 1/2 + 1/4?", r"Add: $\frac{3}{4}$. So \boxed{\frac{3}{4}}.<|im_end|>", "0.75", 1.0),
    ("What is 2 + 2?", r"It is \boxed{5}.<|im_end|>", "4", 0.0),
    ("Compute 10%.", "I don't know.<|im_end|>", "0.1", 0.0),
    ("How many eggs?", r"\boxed{1,234}<|im_end|>", "1234", 1.0),
    # The prompt itself holds the gold in a box: it must not earn the reward.
    (r"Check that \boxed{42} is the answer to 6 \cdot 7.", r"Hmm, \boxed{41}<|im_end|>", "42", 0.0),
    ("Solve x^2 = 4 for x > 0.", r"x = \boxed{2}<|im_end|>", "2", 1.0),
]


def test_reward_values_and_types(reward_module):
    for problem, response, label, expected in CALLS:
        prompt = chat_prompt(problem)
        out = reward_module.reward_func([prompt + response], [prompt], [label])
        assert set(out) == {"rewards", "scores", "extra_logs"}
        assert isinstance(out["rewards"], torch.Tensor) and out["rewards"].dtype == torch.float32
        assert out["rewards"].shape == (1,) and out["rewards"].tolist() == [expected], problem
        assert torch.equal(out["scores"], out["rewards"])
        for value in out["extra_logs"].values():
            assert isinstance(value, torch.Tensor) and value.shape == (1,)
    out = reward_module.reward_func([chat_prompt("q") + "no answer"], [chat_prompt("q")], ["3"])
    assert out["extra_logs"]["grade_unparseable"].tolist() == [1.0]


def test_reward_batch_of_several(reward_module):
    prompts = [chat_prompt(c[0]) for c in CALLS]
    out = reward_module.reward_func([p + c[1] for p, c in zip(prompts, CALLS)], prompts,
                                    [c[2] for c in CALLS])
    assert out["rewards"].tolist() == [c[3] for c in CALLS]


def test_reward_from_many_threads(reward_module):
    # OpenRLHF calls reward_func once per sample via asyncio.to_thread: many threads at once.
    jobs = [CALLS[i % len(CALLS)] for i in range(48)]
    results = [None] * len(jobs)

    def worker(first: int) -> None:
        for i in range(first, len(jobs), 8):
            problem, response, label, _ = jobs[i]
            prompt = chat_prompt(problem)
            results[i] = reward_module.reward_func([prompt + response], [prompt], [label])[
                "rewards"].item()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert results == [job[3] for job in jobs]


def test_reward_grades_in_the_shared_bounded_pool(reward_module):
    # The same pool as evaluation.grader.grade(), sized and limited by the environment.
    assert grader.SHARED_POOL_WORKERS == 2
    prompt = chat_prompt("q")
    start = time.monotonic()
    out = reward_module.reward_func([prompt + r"\boxed{9^{9^{9^{9}}}}"], [prompt], ["1"])
    seconds = time.monotonic() - start
    assert out["rewards"].tolist() == [0.0] and out["extra_logs"]["grade_timeout"].tolist() == [1.0]
    assert 3.0 <= seconds <= 3.0 + 2.0
    assert grader.shared_grader().n_timeouts >= 1


def test_reward_scores_cut_and_multi_box_answers_as_the_grader_does(reward_module):
    # (response, label, reward): a box cut off at the end of a truncated response is never
    # compared (math-verify alone extracted '{\frac{1}{2}' and rewarded it); an answer cut at
    # \mathrm{e} no longer equals 1; boxes joined by "and" are one answer, not their last box.
    cases = [(r"So the answer is \boxed{\frac{1}{2}", r"\frac{1}{2}", 0.0),
             (r"$1 + \frac{1}{\mathrm{e}}$", r"1 - \frac{1}{\mathrm{e}}", 0.0),
             (r"The roots are \boxed{1} and \boxed{2}.", "1, 2", 1.0),
             (r"The roots are \boxed{1} and \boxed{2}.", "2", 0.0)]
    prompt = chat_prompt("q")
    out = reward_module.reward_func([prompt + r for r, _, _ in cases], [prompt] * len(cases),
                                    [label for _, label, _ in cases])
    assert out["rewards"].tolist() == [reward for _, _, reward in cases]
    verdicts = [verify.grade_detailed(r, label).verdict for r, label, _ in cases]
    assert out["rewards"].tolist() == [float(v is verify.Verdict.CORRECT) for v in verdicts]
    assert out["extra_logs"]["grade_unparseable"].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_bad_label_gives_zero_not_an_exception(reward_module):
    prompt = chat_prompt("q")
    out = reward_module.reward_func([prompt + r"\boxed{1}"], [prompt], [""])
    assert out["rewards"].tolist() == [0.0] and out["extra_logs"]["grade_error"].tolist() == [1.0]


def test_response_text(reward_module):
    response_text = reward_module.response_text
    assert response_text("PROMPT answer", "PROMPT") == " answer"
    # Decoding changed the prompt's start (e.g. a left-truncated prompt): cut after its tail.
    long_prompt = "x" * 300 + "END OF PROMPT"
    assert response_text("<bos>" + long_prompt[50:] + " reply", long_prompt) == " reply"
    assert response_text("something else", "PROMPT") == "something else"


def test_upstream_executor_loads_and_calls_it():
    # The seam itself: OpenRLHF's SingleTurnAgentExecutor loading this file and offloading the
    # call to a thread, then samples_generator's torch.tensor([reward]) wrapping.
    agent = pytest.importorskip("openrlhf.utils.agent")
    executor = agent.SingleTurnAgentExecutor(remote_rm_url=str(REWARD_PY))
    prompt = chat_prompt("What is 3 * 4?")
    [info] = asyncio.run(executor._fetch_rewards_via_func(
        [prompt + r"\boxed{12}<|im_end|>"], [prompt], ["12"]))
    assert torch.tensor([info["rewards"]]).tolist() == [1.0]
    assert {k: torch.tensor([v]).tolist() for k, v in info["extra_logs"].items()} == {
        "grade_unparseable": [0.0], "grade_timeout": [0.0], "grade_error": [0.0]}
