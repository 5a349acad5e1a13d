"""The CSV files of `python -m evaluation compare` (see `evaluation.comparison`, which builds the
`Comparison` they are written from and renders compare.md)."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

from evaluation import analysis, report

if TYPE_CHECKING:  # a type only: comparison imports this module
    from evaluation.comparison import Comparison


def paired_rows(c: Comparison) -> list[tuple[str, analysis.PairedDifference]]:
    """(run label, difference) for every benchmark and the average of each paired comparison."""
    out = []
    for label, p in c.paired.items():
        out += [(label, d) for d in p.per_benchmark.values()]
        if p.average is not None:
            out.append((label, p.average))
    return out


def _round(value: float | None, scale: float = 100, digits: int = 3):
    return "" if value is None else round(scale * value, digits)


def write_csvs(out_dir: Path, c: Comparison) -> None:
    """compare.csv, compare_paired.csv, compare_breakdown.csv and (with seed groups)
    compare_seeds.csv; the columns are described in `evaluation.comparison`."""
    keys = c.columns + ["avg"]
    with open(out_dir / "compare.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", *c.columns, c.avg_name, "tokens", "AES", "tokens_benchmarks",
                         *(f"{k}_ci_{end}" for k in [*c.columns, c.avg_name, "AES"]
                           for end in ("lo", "hi"))])
        for r in c.rows:
            cis = [r["ci"].get(k) for k in keys]
            writer.writerow([r["run"], *(_round(r[b]) for b in c.columns), _round(r["avg"]),
                             round(r["tokens"], 2), _round(r["aes"], 1, 4), " ".join(c.averaged),
                             *(_round(ci[i]) if ci else "" for ci in cis for i in (0, 1)),
                             *(_round(r["aes_ci"][i], 1, 4) if r["aes_ci"] else ""
                               for i in (0, 1))])
    with open(out_dir / "compare_paired.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "baseline", "benchmark", "problems", "diff_points", "ci_lo_points",
                         "ci_hi_points", "test", "p_value", "resolved", "gained", "lost",
                         "gained_ids", "lost_ids"])
        for label, d in paired_rows(c):
            writer.writerow([label, c.rows[0]["run"],
                             c.avg_name if d.benchmark == "avg" else d.benchmark, d.n_shared,
                             _round(d.diff), _round(d.ci[0]), _round(d.ci[1]), d.test,
                             f"{d.p_value:.6g}", "yes" if d.resolved else "no", len(d.gained),
                             len(d.lost), " ".join(d.gained), " ".join(d.lost)])
    with open(out_dir / "compare_breakdown.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "table", *report.BREAKDOWN_COLUMNS])
        for run in c.runs:
            for title, rows in run.breakdown.items():
                writer.writerows([run.label, title, *(row[k] for k in report.BREAKDOWN_COLUMNS)]
                                 for row in rows)
    if c.groups:
        with open(out_dir / "compare_seeds.csv", "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["condition", "seeds", "metric", "median", "q1", "q3", "mean",
                             "ci_lo", "ci_hi", "median_diff_vs_baseline", "sign_test_p"])
            for g in c.groups:
                for k in keys:
                    s = g.stats(k)
                    if s is None:
                        continue
                    t = c.seed_tests.get(g.condition, {}).get(k)
                    writer.writerow([g.condition, " ".join(map(str, g.seeds)),
                                     c.avg_name if k == "avg" else k,
                                     *(_round(s[x]) for x in ("median", "q1", "q3", "mean")),
                                     *(_round(v) for v in (s["ci"] or (None, None))),
                                     _round(t["median_diff"]) if t else "",
                                     f"{t['p_value']:.6g}" if t else ""])
