"""benchmarks/cpu_path.py's timing rule: the settings of a knob take turns within every round."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import cpu_path  # noqa: E402


def test_settings_take_turns_and_each_gets_the_median_of_its_own_rounds(monkeypatch):
    order, clock = [], iter(range(100))
    monkeypatch.setattr(cpu_path.time, "perf_counter", lambda: next(clock))

    def setting(name, ticks):
        def call():  # the clock ticks once at each read: the timer's own two reads make 1
            order.append(name)
            for _ in range(ticks - 1):
                next(clock)

        def prepare():
            order.append(f"prepare {name}")
            return call
        return prepare

    medians = cpu_path.side_by_side({"a": setting("a", 1), "b": setting("b", 3)}, rounds=3)
    assert order == ["prepare a", "a", "prepare b", "b"] * 3  # the knob is set outside the timed call
    assert medians == {"a": 1, "b": 3}


def test_the_vllm_layouts_take_turns_each_in_a_fresh_process_with_its_own_flag(monkeypatch):
    calls = []

    class Done:
        returncode = 0

        def __init__(self, flag):
            figures = {"1": (40.0, 60.0), "0": (12.0, 80.0)}[flag]
            self.stdout = f'noise\n{{"startup_s": {figures[0] + len(calls)}, "tok_s": {figures[1]}}}\n'

    def run(argv, env, **kwargs):
        flag = env["VLLM_ENABLE_V1_MULTIPROCESSING"]
        calls.append(flag)
        assert argv[1:4] == [cpu_path.__file__, "--vllm-child", "model-dir"] and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
        return Done(flag)

    monkeypatch.setattr("subprocess.run", run)
    figures = cpu_path.vllm_layouts("model-dir", rounds=3, prompts=4, tokens=8)
    assert calls == ["1", "0"] * 3
    # startups 41, 43, 45 (worker process) and 14, 16, 18 (engine process): medians of its own rounds
    assert figures == {"worker_process": {"startup_s": 43.0, "tok_s": 60.0},
                       "engine_process": {"startup_s": 16.0, "tok_s": 80.0}}
