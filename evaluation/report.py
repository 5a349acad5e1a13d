"""Human-readable outputs: a run's report.md and breakdown.md / .csv, the rows of the
paper-style comparison table (rendered by `comparison`), sweep curves, and the shared formatting
and plotting helpers.

Accuracies are shown in percent. The "avg" column is the macro average over the five
docs/METHOD.md benchmarks when every compared run has all five (else over the benchmarks all runs
share, and the header says how many); "tokens" is the macro mean of the per-benchmark mean response
tokens over the same benchmarks; AES (`metrics.aes`) compares those two against the baseline.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

from evaluation.benchmarks import DEFAULT_BENCHMARKS
from infra.errors import UserError


def pct(value: float | None) -> str:
    """A fraction in percent with one decimal; "-" for None."""
    return "-" if value is None else f"{100 * value:.1f}"


def pct_ci(value: float | None, ci: Sequence[float] | None) -> str:
    """`25.0 [12.5, 40.0]`: a fraction and its interval, in percent (no interval: the value)."""
    if value is None or not ci:
        return pct(value)
    return f"{pct(value)} [{pct(ci[0])}, {pct(ci[1])}]"


def num(value: float | None, digits: int = 1) -> str:
    """A number with `digits` decimals; "-" for None."""
    return "-" if value is None else f"{value:.{digits}f}"


def order(names) -> list[str]:
    """Default benchmarks first in report order, then the others as given."""
    names = list(names)
    return [b for b in DEFAULT_BENCHMARKS if b in names] + [b for b in names
                                                            if b not in DEFAULT_BENCHMARKS]


def _averaged(names: Sequence[str]) -> list[str]:
    """Which benchmarks an average runs over: the default five present, else all given."""
    chosen = [b for b in DEFAULT_BENCHMARKS if b in names]
    return chosen or list(names)


def macro(per_benchmark: dict[str, dict]) -> dict:
    """Macro averages of accuracy and mean response tokens (see `_averaged` for the set)."""
    from evaluation.metrics import macro_average

    names = _averaged(list(per_benchmark))
    return {"benchmarks": names, "complete": set(DEFAULT_BENCHMARKS) <= set(names),
            "accuracy": macro_average(per_benchmark, names, "accuracy"),
            "mean_response_tokens": macro_average(per_benchmark, names, "mean_response_tokens")}


def one_line(summary: dict) -> str:
    """`math500 12.0% | aime24 0.0% | ... | avg 4.0%` for logs."""
    parts = [f"{b} {pct(s['accuracy'])}%" for b, s in summary["benchmarks"].items()]
    return " | ".join(parts + [f"avg {pct(summary['macro_average']['accuracy'])}%"])


def run_markdown(summary: dict) -> str:
    """report.md of one run: settings, per-benchmark metrics, macro average."""
    run, per = summary["run"], summary["benchmarks"]
    names = order(per)
    pass_keys = sorted({k for s in per.values() for k in s if k.startswith("pass@")},
                       key=lambda k: int(k[5:]))
    pass_keys += sorted({k for s in per.values() for k in s if k.startswith("g-pass@")})
    lines = ["# Evaluation report", "", "| setting | value |", "|---|---|"]
    lines += [f"| {k} | `{v}` |" for k, v in run.items()]
    lines += [f"| wall time (s) | {summary['wall_time_s']} |", "",
              "| benchmark | problems | samples/problem | accuracy % [95% CI] | "
              + " | ".join(f"{k} %" for k in pass_keys)
              + " | maj@n % | mean tokens | tokens (correct) | tokens (incorrect) | truncated % "
              "| unparseable | timeout |",
              "|---" * (11 + len(pass_keys)) + "|"]
    for b in names:
        s = per[b]
        lines.append(" | ".join(
            [f"| {b}", str(s["n_problems"]), str(s["samples_per_problem"]),
             pct_ci(s["accuracy"], s.get("accuracy_ci"))]
            + [pct(s.get(k)) for k in pass_keys]
            + [pct(s["maj@n"]), num(s["mean_response_tokens"]),
               num(s["mean_response_tokens_correct"]), num(s["mean_response_tokens_incorrect"]),
               pct(s["truncation_rate"]), str(s["verdicts"]["unparseable"]),
               str(s["verdicts"]["timeout"])]) + " |")
    m = summary["macro_average"]
    scope = "five-benchmark" if m["complete"] else f"{len(m['benchmarks'])}-benchmark"
    ci = m.get("accuracy_ci")
    lines += ["", f"**{scope} macro average**: accuracy {pct(m['accuracy'])}%"
              + (f" [{pct(ci[0])}, {pct(ci[1])}]" if ci else "") + ", "
              f"mean response tokens {num(m['mean_response_tokens'])} "
              f"({', '.join(m['benchmarks'])}).", ""]
    if "ci" in summary:
        ci = summary["ci"]
        lines += [f"Brackets: {100 * ci['level']:.0f}% CI, {ci['method']}, "
                  f"{ci['n_resamples']} resamples. Breakdowns: breakdown.md.", ""]
    if "provenance" in summary:
        lines += provenance_markdown(summary["provenance"], summary.get("provenance_changes"))
    return "\n".join(lines)


def provenance_markdown(record: dict, changes: list | None = None) -> list[str]:
    """A run's provenance as markdown lines: data and model hashes, versions, grader."""
    model = record.get("model", {})
    harness = record.get("harness", {})
    lines = ["## Provenance", "", "| what | value |", "|---|---|",
             f"| model | `{model.get('path') or model.get('hub_id')}` "
             f"(sha256 {str(model.get('sha256') or model.get('hub_revision'))[:12]}) |"]
    lines += [f"| {name} data | `{b.get('source')}` sha256 {str(b.get('sha256'))[:12]}, "
              f"problems {str(b.get('problems_sha256'))[:12]} |"
              for name, b in record.get("benchmarks", {}).items()]
    dirty = harness.get("evaluation_uncommitted_changes")

    def listed(section: str, sep: str = " ") -> str:
        return ", ".join(f"{k}{sep}{v}" for k, v in record.get(section, {}).items() if v)

    lines += [f"| prompt | {record.get('prompt', {}).get('kind')} "
              f"{str(record.get('prompt', {}).get('sha256'))[:12]} |",
              f"| grader | {listed('grader')} |",
              f"| harness | {harness.get('version')} @ {str(harness.get('git_commit'))[:12]}"
              + (" (evaluation/ had uncommitted changes)" if dirty else "") + " |",
              f"| software | {listed('software')} |",
              f"| hardware | {listed('hardware', ': ')} |"]
    if record.get("samples_before_provenance"):
        lines.append(f"| note | {record['samples_before_provenance']} samples predate this "
                     "record |")
    for change in changes or []:
        lines.append(f"| resumed {change['at']} | after {change['samples_before']} samples, with "
                     + "; ".join(f"{k}: {a} -> {b}" for k, (a, b) in change["changes"].items())
                     + " |")
    return lines + [""]


BREAKDOWN_COLUMNS = ("group", "problems", "samples", "accuracy", "truncation_rate", "mean_tokens")
"""The columns of every breakdown row (`breakdown.breakdown_tables`), in CSV order."""


def write_breakdown(out_dir: Path, tables: dict[str, list[dict]]) -> None:
    """breakdown.md (one table per breakdown) and breakdown.csv (all rows, long format)."""
    md = ["# Breakdown", "", "Accuracy in % (avg@n over the group's problems; by response tokens: "
          "over samples). Truncated: samples cut at the token limit.", ""]
    for title, rows in tables.items():
        md += [f"## {title}", "", "| group | problems | samples | accuracy % | truncated % | "
               "mean tokens |", "|---|---|---|---|---|---|"]
        md += [f"| {r['group']} | {r['problems']} | {r['samples']} | {pct(r['accuracy'])} | "
               f"{pct(r['truncation_rate'])} | {num(r['mean_tokens'])} |" for r in rows]
        md.append("")
    (out_dir / "breakdown.md").write_text("\n".join(md), encoding="utf-8")
    with open(out_dir / "breakdown.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["table", *BREAKDOWN_COLUMNS])
        for title, rows in tables.items():
            writer.writerows([title, *(r[c] for c in BREAKDOWN_COLUMNS)] for r in rows)


def label(run_dir: str | Path) -> str:
    """A run's name in tables: its directory name."""
    return Path(run_dir).resolve().name


def comparison_rows(labelled: list[tuple[str, dict]]) -> tuple[list[str], list[str], list[dict]]:
    """(benchmark columns, averaged benchmarks, one row per run); the first run is the baseline."""
    from evaluation.metrics import aes

    labels, seen = [], {}
    for name, _ in labelled:  # repeated directory names get a suffix
        seen[name] = seen.get(name, 0) + 1
        labels.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    columns = order(dict.fromkeys(b for _, s in labelled for b in s["benchmarks"]))
    shared = [b for b in columns if all(b in s["benchmarks"] for _, s in labelled)]
    if not shared:
        raise UserError("the runs share no benchmark, so they have no common average")
    averaged = _averaged(shared)
    rows = []
    for name, summary in zip(labels, (s for _, s in labelled)):
        per = summary["benchmarks"]
        row = {"run": name, **{b: per[b]["accuracy"] if b in per else None for b in columns}}
        row["avg"] = sum(per[b]["accuracy"] for b in averaged) / len(averaged)
        row["tokens"] = sum(per[b]["mean_response_tokens"] for b in averaged) / len(averaged)
        row["tokens_by_benchmark"] = {b: per[b]["mean_response_tokens"] for b in columns if b in per}
        row["samples"] = {b: per[b]["n_samples"] for b in columns if b in per}
        rows.append(row)
    base = rows[0]
    for row in rows:
        ok = base["avg"] > 0 and base["tokens"] > 0
        row["aes"] = aes(row["avg"], row["tokens"], base["avg"], base["tokens"]) if ok else None
    return columns, averaged, rows


def write_sweep(out_dir: Path, points: list[tuple[int, dict]]) -> None:
    """sweep.md, sweep.csv, sweep_accuracy.png, sweep_tokens.png: metrics against training step."""
    columns, averaged, rows = comparison_rows([(f"step {s}", summ) for s, summ in points])
    steps = [s for s, _ in points]
    header = ["step", *columns, "avg", "tokens"]
    md = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    md += ["| " + " | ".join([str(s), *(pct(r[b]) for b in columns), pct(r["avg"]),
                              num(r["tokens"])]) + " |" for s, r in zip(steps, rows)]
    md += ["", f"Accuracy in %; avg and tokens over {', '.join(averaged)}.", ""]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sweep.md").write_text("\n".join(md), encoding="utf-8")
    with open(out_dir / "sweep.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for s, r in zip(steps, rows):
            writer.writerow([s, *("" if r[b] is None else round(100 * r[b], 3) for b in columns),
                             round(100 * r["avg"], 3), round(r["tokens"], 2)])
    _lines(out_dir / "sweep_accuracy.png", "accuracy (%)", steps,
           {**{b: [None if r[b] is None else 100 * r[b] for r in rows] for b in columns},
            "avg": [100 * r["avg"] for r in rows]})
    _lines(out_dir / "sweep_tokens.png", "mean response tokens", steps,
           {**{b: [r["tokens_by_benchmark"].get(b) for r in rows] for b in columns},
            "avg": [r["tokens"] for r in rows]})


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def bars(path: Path, ylabel: str, groups: list[str], series: dict[str, list],
         intervals: dict[str, list] | None = None) -> None:
    """Grouped bar chart: one group per benchmark, one bar per run; `intervals` ({run: [(lo, hi)
    or None per group]}) are drawn as error bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups) * max(1, len(series)) / 2), 4))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [0 if v is None else v for v in values]
        ax.bar(xs, heights, width, label=name)
        spans = (intervals or {}).get(name)
        if spans:
            pts = [(x, h, ci) for x, h, ci in zip(xs, heights, spans) if ci is not None]
            ax.errorbar([x for x, _, _ in pts], [h for _, h, _ in pts],
                        yerr=[[h - ci[0] for _, h, ci in pts], [ci[1] - h for _, h, ci in pts]],
                        fmt="none", ecolor="black", capsize=3, linewidth=1)
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_xticks(range(len(groups)), groups, rotation=20)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _lines(path: Path, ylabel: str, steps: list[int], series: dict[str, list]) -> None:
    """One line per benchmark (and the average) against training step."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, values in series.items():
        pts = [(s, v) for s, v in zip(steps, values) if v is not None]
        ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o",
                linewidth=2.5 if name == "avg" else 1.2, label=name)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
