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
