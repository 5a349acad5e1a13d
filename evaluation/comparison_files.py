"""The files of `python -m evaluation compare`: compare.md (rendered by `evaluation.comparison`,
which builds the `Comparison`), the CSVs, compare_provenance.json and the plots."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from evaluation import analysis, provenance, report
from evaluation.comparison import Comparison, markdown, paired_rows


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


def write(out_dir: Path, c: Comparison) -> None:
    """compare.md, the CSVs, compare_provenance.json and the plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.md").write_text(markdown(c), encoding="utf-8")
    write_csvs(out_dir, c)
    (out_dir / "compare_provenance.json").write_text(json.dumps(
        {"runs": {r.label: {"provenance": r.provenance, "provenance_changes": r.provenance_changes}
                  for r in c.runs},
         "differences_from_baseline": {r.label: provenance.differences(c.runs[0].settings,
                                                                       r.settings)
                                       for r in c.runs[1:]},
         "warnings": c.warnings}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    groups = c.columns + [c.avg_name]
    keys = c.columns + ["avg"]
    report.bars(out_dir / "compare_accuracy.png", "accuracy (%) with 95% CI", groups,
                {r["run"]: [None if r[k] is None else 100 * r[k] for k in keys] for r in c.rows},
                {r["run"]: [None if r["ci"].get(k) is None else
                            tuple(100 * v for v in r["ci"][k]) for k in keys] for r in c.rows})
    report.bars(out_dir / "compare_tokens.png", "mean response tokens", groups,
                {r["run"]: [r["tokens_by_benchmark"].get(b) for b in c.columns] + [r["tokens"]]
                 for r in c.rows})
    if c.paired:
        def diffs(p: analysis.PairedComparison) -> list:
            return [p.per_benchmark.get(b) for b in c.columns] + [p.average]
        report.bars(out_dir / "compare_paired.png",
                    f"difference from {c.rows[0]['run']} (points) with 95% CI", groups,
                    {label: [None if d is None else 100 * d.diff for d in diffs(p)]
                     for label, p in c.paired.items()},
                    {label: [None if d is None else (100 * d.ci[0], 100 * d.ci[1])
                             for d in diffs(p)] for label, p in c.paired.items()})
