"""How often graders agree with the verdicts peers' own test suites expect.

    python benchmarks/grader_agreement.py                      # grade() and math-verify alone
    pip install --target /tmp/peers --no-deps mathruler verl    # once, for the peer columns
    python benchmarks/grader_agreement.py --peer-path /tmp/peers --peer mathruler --peer prime_math

The cases (`tests/evaluation/data/grader_cases.jsonl`, one JSON object a line) were gathered from
the public test suites of Math-Verify, lighteval, hendrycks MATH, AReaL, verl, open-r1, rllm
(DeepScaleR), Qwen2.5-Math and simple-evals: a response, a gold answer, the verdict the suite
expects, and the suite's repository and file. A case with `deliberate` is one where this project
grades otherwise on purpose; the field says why.

Graders compared, each agreeing with a case when it says CORRECT exactly when the suite expects a
match (TIMEOUT and UNPARSEABLE count as "no match"):
- grade: `evaluation.grader`, in a `Grader` pool (what `grade()` runs);
- math-verify: `verify(parse("$gold$"), parse(response))` with math-verify's defaults (its
  timeouts off), the gold wrapped as `grade()` wraps it and the response extracted by math-verify
  alone. `--record-math-verify` stores these verdicts in the case file (field `math_verify`), so
  the test compares against them without grading every case twice;
- peers (optional): `mathruler` (EasyR1's packaged grader: last box, then `grade_answer`),
  `prime_math` and `math_dapo` (verl's reward functions `compute_score`). verl's package
  `__init__` needs its training stack, so its reward modules are loaded without it.

Prints a markdown table, one row per source, then the overall figures with and without the
deliberate disagreements; `--misses` lists the cases `grade` gets wrong.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import sys
import types
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = REPO / "tests" / "evaluation" / "data" / "grader_cases.jsonl"
PEER_TIMEOUT_S = 20.0
"""A peer's or math-verify's verdict not back by then counts as no match."""


@dataclass(frozen=True)
class Case:
    source: str
    file: str
    test: str
    response: str
    gold: str
    expected: bool
    """True when the suite expects the response to match the gold."""
    note: str = ""
    deliberate: str = ""
    """Why this project grades the case otherwise on purpose; empty when it does not."""
    math_verify: bool | None = None
    """math-verify 0.9.0 alone's match, as `--record-math-verify` measured it (None: not yet)."""


def load_cases(path: Path = CASES) -> list[Case]:
    """The cases of a JSONL file; a malformed line raises ValueError naming the line."""
    cases = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
            case = Case(**row)
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path}:{number}: not a case ({e}); each line needs source, file, "
                             "test, response, gold, expected, and optionally note, deliberate")
        if not isinstance(case.expected, bool) or not case.gold.strip():
            raise ValueError(f"{path}:{number}: 'expected' must be true/false and 'gold' non-empty")
        cases.append(case)
    return cases


# ---- the graders -------------------------------------------------------------------------

def grade_matches(cases: list[Case], workers: int = 2, timeout_s: float = 30.0) -> list[bool]:
    """Whether `evaluation.grader` says CORRECT for each case, graded in one pool batch with a
    per-sample limit of `timeout_s` (roomier than the default 10 s: on a loaded machine a few
    cases take longer, and a TIMEOUT would measure the load, not the grader)."""
    sys.path.insert(0, str(REPO))
    from evaluation.grader import Grader
    from evaluation.verify import Verdict

    with Grader(workers=workers, timeout_s=timeout_s) as pool:
        graded = pool.grade_many_detailed([(c.response, c.gold) for c in cases])
    return [g.verdict is Verdict.CORRECT for g in graded]


def math_verify_alone(response: str, gold: str) -> bool:
    """math-verify's own extraction and comparison, its timeouts off: they only fire on a loaded
    machine, and a verdict should not depend on the load (the pool's PEER_TIMEOUT_S bounds it)."""
    from math_verify import parse, verify

    gold_parsed = parse(f"${' '.join(gold.split())}$", parsing_timeout=None)
    return bool(verify(gold_parsed, parse(response, parsing_timeout=None), timeout_seconds=None))


def _mathruler(response: str, gold: str) -> bool:
    from mathruler.grader import extract_boxed_content, grade_answer

    return bool(grade_answer(extract_boxed_content(response), gold))


def _verl_module(name: str):
    """verl.utils.reward_score.<name>, imported without running verl's package `__init__`s."""
    import importlib
    import importlib.util

    module = sys.modules.get(f"verl.utils.reward_score.{name}")
    if module is not None:
        return module
    spec = importlib.util.find_spec("verl")
    if spec is None:
        raise ImportError("verl is not on sys.path (see --peer-path)")
    root = Path(spec.submodule_search_locations[0])
    for package, folder in [("verl", root), ("verl.utils", root / "utils"),
                            ("verl.utils.reward_score", root / "utils" / "reward_score")]:
        if package not in sys.modules or not hasattr(sys.modules[package], "__path__"):
            stub = types.ModuleType(package)
            stub.__path__ = [str(folder)]
            sys.modules[package] = stub
    return importlib.import_module(f"verl.utils.reward_score.{name}")


def _prime_math(response: str, gold: str) -> bool:
    return bool(_verl_module("prime_math").compute_score(response, gold)[0])


def _math_dapo(response: str, gold: str) -> bool:
    return bool(_verl_module("math_dapo").compute_score(response, gold)["acc"])


PEERS = {"mathruler": _mathruler, "prime_math": _prime_math, "math_dapo": _math_dapo}


def _call(fn_name: str, response: str, gold: str) -> bool:
    fn = math_verify_alone if fn_name == "math-verify" else PEERS[fn_name]
    try:
        return fn(response, gold)
    except Exception:  # a peer that raises on a case has not matched it
        return False


def pool_matches(fn_name: str, cases: list[Case], workers: int = 2) -> list[bool]:
    """`fn_name`'s verdict for each case, in forked worker processes (math-verify's signal-based
    timeouts need a main thread; verl's start processes of their own, which a daemonic
    `multiprocessing.Pool` worker may not); a verdict missing after PEER_TIMEOUT_S is False. Each worker
    grades one sample first, so imports do not eat into a case's time."""
    context = multiprocessing.get_context("fork")
    executor = concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_call, initargs=(fn_name, r"\boxed{1}", "1"))
    try:
        pending = [executor.submit(_call, fn_name, c.response, c.gold) for c in cases]
        out = []
        for future in pending:
            try:
                out.append(future.result(timeout=PEER_TIMEOUT_S))
            except concurrent.futures.TimeoutError:
                out.append(False)
    finally:
        for child in multiprocessing.active_children():  # a hung peer would block shutdown
            child.kill()
        executor.shutdown(wait=False, cancel_futures=True)
    return out


def record_math_verify(path: Path, verdicts: list[bool]) -> None:
    """Rewrite the case file with each case's `math_verify` field set, lines otherwise as they were."""
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]
    if len(rows) != len(verdicts):
        raise ValueError(f"{path} has {len(rows)} cases, {len(verdicts)} verdicts were given")
    with open(path, "w", encoding="utf-8") as f:
        for row, verdict in zip(rows, verdicts):
            f.write(json.dumps({**row, "math_verify": verdict}, ensure_ascii=False) + "\n")


# ---- the table ---------------------------------------------------------------------------

def agreement_table(cases: list[Case], matches: dict[str, list[bool]]) -> str:
    """Markdown: per source, the share of cases each grader agrees on (false positives / false
    negatives in brackets), then overall, with and without the deliberate disagreements."""
    names = list(matches)
    header = "| source | cases | deliberate | " + " | ".join(names) + " |"
    lines = [header, "|" + "---|" * (3 + len(names))]
    groups = sorted(Counter(c.source for c in cases).items(), key=lambda kv: -kv[1])
    for source, n in groups + [("overall", len(cases)), ("overall, deliberate excluded", None)]:
        picked = [i for i, c in enumerate(cases) if source in (c.source, "overall")
                  or (source.startswith("overall,") and not c.deliberate)]
        cells = [_cell(cases, matches[name], picked) for name in names]
        deliberate = sum(bool(cases[i].deliberate) for i in picked)
        lines.append(f"| {source} | {len(picked)} | {deliberate} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(cases: list[Case], match: list[bool], picked: list[int]) -> str:
    agree = sum(match[i] == cases[i].expected for i in picked)
    fp = sum(match[i] and not cases[i].expected for i in picked)
    fn = sum(not match[i] and cases[i].expected for i in picked)
    return f"{100 * agree / len(picked):.1f}% ({fp} FP, {fn} FN)"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=Path, default=CASES, help="the JSONL case file")
    p.add_argument("--workers", type=int, default=2, help="worker processes per grader")
    p.add_argument("--peer", action="append", default=[], choices=sorted(PEERS),
                   help="a peer grader to add as a column (repeatable); needs it importable")
    p.add_argument("--peer-path", action="append", default=[],
                   help="a folder to put on sys.path for the peers (e.g. a pip --target folder)")
    p.add_argument("--misses", action="store_true", help="list the cases grade() disagrees on")
    p.add_argument("--record-math-verify", action="store_true",
                   help="write math-verify alone's verdicts into the case file's math_verify field")
    args = p.parse_args(argv)
    sys.path[:0] = args.peer_path
    cases = load_cases(args.cases)
    matches = {"grade": grade_matches(cases, args.workers),
               "math-verify": pool_matches("math-verify", cases, args.workers)}
    for peer in args.peer:
        matches[peer] = pool_matches(peer, cases, args.workers)
    if args.record_math_verify:
        record_math_verify(args.cases, matches["math-verify"])
    print(f"{len(cases)} cases from {len({c.source for c in cases})} sources\n")
    print(agreement_table(cases, matches))
    if args.misses:
        for case, ok in zip(cases, matches["grade"]):
            if ok != case.expected:
                print(f"\n[{case.source} {case.test}] expected {case.expected}"
                      f"{' (deliberate)' if case.deliberate else ''}; gold {case.gold!r}\n"
                      f"  response {case.response[:300]!r}")


if __name__ == "__main__":
    main()
