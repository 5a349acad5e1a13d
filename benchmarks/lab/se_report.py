"""The lab's plots and tables: curves of held-out accuracy and training reward against steps,
rollouts, compute units and token cost (median and IQR over seeds), per band, the share of
generation spent on zero-variance groups, the warm start's spread, and table.md. Everything is
drawn from the records and the summary `se_analysis.summarize` makes.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import se_analysis
from infra.hardware import cpu_description
from se_settings import ROLLOUT_TEMPERATURE

REWARD_WINDOW = 5
AXES = (("step", "training step"), ("rollouts", "generated rollouts"), ("compute_units", "compute units"),
        ("token_cost", "token cost (generated + 3 x trained tokens)"))
COLOURS = {"none": "black", "none_half_lr": "tab:cyan", "none_half_prompts": "darkgoldenrod",
           "none_2epochs": "tab:grey", "uniform": "tab:blue", "advantage": "tab:red", "advantage_alpha1": "tab:purple",
           "advantage_tau2": "tab:pink", "advantage_tau40": "tab:brown", "naive": "tab:orange",
           "freshness": "tab:green", "success": "tab:olive", "none_matched": "dimgrey", "age0": "tab:cyan",
           "advantage_alpha2": "magenta", "exgrpo": "tab:brown", "none_df": "darkgoldenrod", "uniform_df": "navy",
           "refill": "tab:green", "skip": "darkorange", "skip_uniform": "mediumvioletred", "skip_refill": "seagreen"}
MAIN_PLOT = {4: ("none", "none_matched", "age0", "none_2epochs", "uniform"),
             5: ("none", "uniform", "skip", "skip_uniform", "skip_refill")}
"""The conditions of curves.png and bands.png, per edition (curves_all.png has every one)."""


def plot(runs: list[dict], summary: dict, path: Path, conditions, iqr: bool = True) -> None:
    """2 x 4 panels: held-out accuracy / training reward vs steps, rollouts, compute units, token cost."""
    plt = _pyplot()
    unit_s = summary["unit_s"]
    fig, axes = plt.subplots(2, len(AXES), figsize=(5 * len(AXES), 8), sharey="row")
    for cond in conditions:
        rs = [r for r in runs if r["condition"] == cond]
        for row, curve_fn in enumerate((se_analysis.eval_curve, se_analysis.reward_curve)):
            for col, (axis, _) in enumerate(AXES):
                curves = [curve_fn(r, unit_s, axis) for r in rs]
                if row == 1:
                    curves = [(x, se_analysis.trailing_mean(y, REWARD_WINDOW)) for x, y in curves]
                agg = se_analysis.aggregate(curves)
                ax = axes[row, col]
                ax.plot(agg["x"], agg["median"], color=COLOURS.get(cond), label=f"{cond} (n={len(rs)})",
                        marker="o" if row == 0 else None, ms=3)
                if iqr:
                    ax.fill_between(agg["x"], agg["q25"], agg["q75"], color=COLOURS.get(cond), alpha=0.15)
    for col, (axis, label) in enumerate(AXES):
        axes[1, col].set_xlabel(label)
        if axis == "token_cost":  # hundreds of thousands: a power of ten beside the axis, not on every tick
            for row in (0, 1):
                axes[row, col].ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    axes[0, 0].set_ylabel(summary["primary_metric"]["name"])
    axes[1, 0].set_ylabel(f"training reward (fresh rollouts, mean of last {REWARD_WINDOW} steps)")
    axes[0, 0].axhline(summary["match_threshold"], color="grey", ls=":", lw=1)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"median{' and IQR' if iqr else ''} over seeds; 1 compute unit = one GRPO optimizer step = "
                 f"{unit_s:.3f} s here; dotted: {summary['match_fraction']} x GRPO's best median")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_zero_variance(runs: list[dict], conditions, path: Path) -> None:
    """Per condition, the share of each step's generated groups whose rewards were all equal
    (dropped or skipped ones included): median and IQR over seeds, against the training step."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for cond in conditions:
        rs = [r for r in runs if r["condition"] == cond]
        curves = [(list(range(1, len(r["steps"]) + 1)), se_analysis.zero_variance_share(r)) for r in rs]
        agg = se_analysis.aggregate(curves)
        ax.plot(agg["x"], agg["median"], color=COLOURS.get(cond), label=f"{cond} (n={len(rs)})")
        ax.fill_between(agg["x"], agg["q25"], agg["q75"], color=COLOURS.get(cond), alpha=0.15)
    ax.set_xlabel("training step")
    ax.set_ylabel("zero-variance share of the groups generated")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("generation spent on groups of equal rewards (no GRPO advantage): median and IQR over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_bands(runs: list[dict], conditions, path: Path) -> None:
    """Held-out accuracy (the primary metric) per band against generated rollouts: median and IQR over seeds."""
    plt = _pyplot()
    bands = list(runs[0]["evals"][0].get("by_band", {}))
    if len(bands) < 2:
        return
    fig, axes = plt.subplots(1, len(bands), figsize=(4 * len(bands), 3.6), sharey=True)
    for ax, band in zip(axes, bands):
        for cond in conditions:
            rs = [r for r in runs if r["condition"] == cond]
            curves = [([se_analysis.generated_through(r)[e["step"]] for e in r["evals"]],
                       [e["by_band"][band] for e in r["evals"]]) for r in rs]
            agg = se_analysis.aggregate(curves)
            ax.plot(agg["x"], agg["median"], color=COLOURS.get(cond), label=cond, marker="o", ms=2)
            ax.fill_between(agg["x"], agg["q25"], agg["q75"], color=COLOURS.get(cond), alpha=0.12)
        ax.set_title(band)
        ax.set_xlabel("generated rollouts")
    axes[0].set_ylabel("held-out accuracy (the primary metric)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_spread(report: dict, path: Path) -> None:
    """Per-prompt success rates of the pool after the warm start, one bar group per band."""
    plt = _pyplot()
    hist, n = report["success_rate_histogram"], report["samples_per_prompt"]
    bands = [b for b in hist if b != "all"]
    fig, ax = plt.subplots(figsize=(9, 4))
    bottom = [0] * (n + 1)
    for band in bands:
        ax.bar(range(n + 1), hist[band], bottom=bottom, label=band)
        bottom = [b + h for b, h in zip(bottom, hist[band])]
    ax.set_xticks(range(n + 1), [f"{k}/{n}" for k in range(n + 1)])
    ax.set_xlabel(f"correct answers in {n} samples (temperature 1.0) after the warm start")
    ax.set_ylabel("prompts of the RL pool")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _fmt(x, spec=".3f", none="never"):
    return none if x is None else format(x, spec)


def _interval(st: dict, spec: str = "+.3f", key: str = "interval") -> str:
    """`[lo, hi]`, named when it is not a 95% interval (fewer than 6 seeds: their [min, max])."""
    lo, hi = st[key]
    kind = st[f"{key}_kind"]
    return f"[{_fmt(lo, spec)}, {_fmt(hi, spec)}]" + ("" if kind.startswith("95%") else f" ({kind})")


def _ratio_ci(s: dict, axis: str) -> str:
    """A to-match ratio, its interval and its bootstrap p (uncorrected), or why it has none."""
    if s[f"{axis}_to_match_interval"] is None:
        return s[f"{axis}_to_match_interval_kind"]
    p = s[f"{axis}_to_match_p"]
    return (f"{_fmt(s[f'{axis}_to_match_ratio'], '.2f')} {_interval(s, '.2f', f'{axis}_to_match_interval')}"
            + ("" if p is None else f" p {p:.3f}" if p >= 0.001 else " p < 0.001"))


def _sign_words(st: dict, a: str, b: str) -> str:
    """The words of an untested difference: its sign only."""
    if st["mean"] == 0:
        return f"{a} level with {b}, not tested"
    return f"{a} {'above' if st['mean'] > 0 else 'below'} {b}, not tested"


def _primary_lines(summary: dict) -> list[str]:
    """The edition's primary question, first: its estimate, interval, p and verdict."""
    pr = summary["primary"]
    if pr is None:
        return []
    a, b = pr["pair"].split("_vs_")
    if pr["verdict"] == "not run":
        return [f"**Primary question: rollouts-to-match of {a} against {b}.** Not run in this sweep.", ""]
    p = ("no p (fewer than 6 seeds)" if pr["p"] is None else
         f"p {pr['p']:.4f} (bootstrap, ratio 1)" if pr["p"] >= 0.001 else "p < 0.001 (bootstrap, ratio 1)")
    return [f"**Primary question: rollouts-to-match of {a} against {b}** ({pr['n']} seeds): "
            f"{_fmt(pr['ratio'], '.2f')} [{_fmt(pr['interval'][0], '.2f')}, {_fmt(pr['interval'][1], '.2f')}] "
            f"({pr['interval_kind']}), {p}: **{pr['verdict']}**.", "",
            f"The generated rollouts for {a}'s median curve to first reach {summary['match_threshold']:.3f} "
            f"({summary['match_fraction']} x {b}'s best median, interpolated between checkpoints), over {b}'s own. "
            "Rule: \"reaches the 0.5 mark\" when the estimate is <= 0.5 and the interval's upper end < 1; "
            "\"saves rollouts\" when the upper end < 1; otherwise \"not resolved\".", ""]


def _power_lines(summary: dict) -> list[str]:
    """GRPO's own gain and the positive control: can this lab see an effect at all?"""
    g = summary["grpo_gain"]
    lines = [f"GRPO's gain over the run (final minus step 0, paired by seed, n {g['n']}): mean {g['mean']:+.3f} "
             f"{_interval(g)}, p {g['p']:.3f}."]
    c = summary["positive_control"]
    if c is None:
        return lines + ["Positive control: not run (its conditions are not in this sweep)."]
    return lines + [f"Positive control {c['pair']} (its sign is known: GRPO above GRPO on half the prompts per "
                    f"step; a test of its own), final accuracy: mean {c['mean']:+.3f} {_interval(c)}, "
                    f"p {c['p']:.3f}, "
                    f"{'resolved' if c['resolved'] else 'NOT resolved'} at {c['n']} seeds (MDE "
                    f"{_fmt(c['mde'], '.3f', 'n/a')})."]


def header_line(summary: dict) -> str:
    """What was run, when and on which CPU: the runs' own date and CPU, or, for records from before
    2026-12-06 that lack them, when and where they were analysed."""
    s, t = summary["settings"], summary["timing"]
    where = (f"measured {t['date']} on {t['cpu']}" if t["date"] else
             f"analysed {t['analysed']} on {t['analysed_on']}; the runs do not record their date and CPU (records "
             "from before 2026-12-06: see the results page)")
    return (f"Sample-efficiency lab, task `{s['task']}`: {s['steps']} steps x {s['prompts_per_step']} prompts x "
            f"{s['group_size']} rollouts per condition; {where}.")


def table(summary: dict) -> str:
    """table.md: the primary question, conditions, the family's tests, every paired difference
    with words, the warm start's spread."""
    out = [header_line(summary), ""]
    out += _primary_lines(summary)
    out += _conditions_table(summary) + [""] + _curves_table(summary)
    out += _power_lines(summary) + [""] + _family_table(summary)
    out += [""] + _pairs_table(summary)
    if summary.get("warm_start"):
        out += _warm_start_table(summary["warm_start"], summary["primary_metric"]["name"])
    return "\n".join(out) + "\n"


def _seconds_ratio(r: dict | None) -> str:
    return "n/a" if r is None else f"{r['median']:.2f} [{r['iqr'][0]:.2f}, {r['iqr'][1]:.2f}], {r['n']}"


def _conditions_table(summary: dict) -> list[str]:
    """One row per condition: its scores, what it cost, and the rule every score follows."""
    conds, metric = summary["conditions"], summary["primary_metric"]
    bands = None
    for s in conds.values():
        bands = bands or list(s["final_acc_by_band"])
    out = [f"Primary metric: {metric['name']}, answers sampled at temperature {metric['temperature']} "
           f"({metric['samples_per_problem']} per problem, the same seeds for every condition); greedy beside it.", ""]
    out += ["| condition | seeds | final acc (median [IQR]) | best acc | AUC | final greedy | "
            + "".join(f"final {b} | " for b in bands)
            + "rollouts to match [interval] p | compute to match [interval] p | token cost to match [interval] p "
            "| tokens generated | tokens trained | token cost | tokens trained / step | updates / step "
            "| replayed / step | compute units (train + gen) | wall s, train / grade (median run) "
            "| steps' seconds / GRPO's, same session (median [IQR], pairs) "
            "| zero-variance share of generation (mean over the run) | AES vs GRPO |",
            "|---" * (21 + len(bands)) + "|"]
    for c, s in conds.items():
        lo, hi = s["final_acc_iqr"]
        out.append(f"| {c} | {s['seeds']} | {s['final_acc']:.3f} [{lo:.3f}, {hi:.3f}] | {s['best_acc']:.3f} | "
                   f"{s['auc']:.3f} | {s['final_acc_greedy']:.3f} | "
                   + "".join(f"{s['final_acc_by_band'][b]:.2f} | " for b in bands)
                   + f"{_ratio_ci(s, 'rollouts')} | {_ratio_ci(s, 'compute')} | {_ratio_ci(s, 'cost')} | "
                   f"{s['generated_tokens']:,.0f} | {s['trained_tokens']:,.0f} | {s['token_cost']:,.0f} | "
                   f"{s['train_tokens_per_step']:.0f} | {s['optimizer_steps_per_step']:.2f} | "
                   f"{s['replayed_per_step']:.1f} | {s['compute_units']:.0f} ({s['train_units']:.0f} + "
                   f"{s['generation_units']:.0f}) | {_fmt(s['wall_s_median'], '.0f', 'n/a')} / "
                   f"{_fmt(s['eval_s_median'], '.0f', 'n/a')} | {_seconds_ratio(s['seconds_vs_baseline'])} | "
                   f"{_fmt(s['zero_variance_share'], '.2f', 'n/a')} | "
                   f"{_fmt(s['aes_vs_grpo'], '+.3f', 'n/a')} |")
    return out + ["", f"1 compute unit = {summary['unit_s']:.4f} s (one GRPO optimizer step on "
                  f"{summary['settings']['train_batch']} rollouts), this session's machine: compare compute and "
                  "wall-clock only between conditions measured in one session. Steps' seconds / GRPO's: a run's "
                  "seconds inside its steps (start-up left out) over those of GRPO's run of its seed timed in the same "
                  "session, median and IQR over the pairs. Token cost = generated + 3 x trained "
                  "tokens (a sampled token about one forward pass, a trained one a forward and a backward; decoding "
                  "on GPUs costs more per token than this FLOP count, hence both parts apart). Scores per seed, the "
                  "same rule for every condition: final = last checkpoint; best = best checkpoint after step 0; "
                  "AUC = area under held-out accuracy over generated rollouts / rollouts (the curve's mean). "
                  "\"to match\": rollouts (compute units, token cost) for the median curve to first reach "
                  f"{summary['match_threshold']:.3f} ({summary['match_fraction']} x GRPO's best median; interpolated "
                  "between checkpoints), over GRPO's own; [95% paired percentile bootstrap over seeds] and its p of "
                  "ratio 1, uncorrected (only the primary question above is tested)."]


def _family_table(summary: dict) -> list[str]:
    """The pre-registered family on the primary score (plan.md): raw and Holm-adjusted p, MDE, and
    for selection against uniform the equivalence test's verdict."""
    rows = {name: st["final_acc"] for name, st in summary["pairs"].items() if "p_holm" in st["final_acc"]}
    if not rows:
        return []
    family = next(iter(rows.values()))["holm_family"]
    out = [f"Pre-registered pairs, final {summary['primary_metric']['name']} (plan.md): Holm's adjustment over the "
           f"{family} pairs planned (a pair not run counts as p = 1); resolved = Holm p < 0.05 (the interval, the "
           "95% interval of the mean that inverts the sign-flip test, then excludes 0 too). "
           f"Selection against uniform: equivalent = both one-sided sign-flip tests of |A - B| < "
           f"{se_analysis.EQUIVALENCE_MARGIN:.3f} give p < 0.05.", "",
           "| pair | n | mean A - B | interval | p | p (Holm) | MDE | equivalence (p) | verdict |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, st in rows.items():
        a, b = name.split("_vs_")
        eq = st.get("equivalence")
        if st["resolved_holm"]:
            words = f"resolved: {a} {'above' if st['mean'] > 0 else 'below'} {b}"
        elif eq and eq["equivalent"]:
            words = f"equivalent within +-{eq['margin'] * 100:.1f} points"
        else:
            words = "not resolved" + (", not shown equivalent" if eq else "")
        eq_cell = "" if eq is None else f"{'yes' if eq['equivalent'] else 'no'} ({eq['p']:.3f})"
        out.append(f"| {name} | {st['n']} | {st['mean']:+.3f} | {_interval(st)} | {st['p']:.4f} | "
                   f"{st['p_holm']:.4f} | {_fmt(st.get('mde'), '.3f', '')} | {eq_cell} | {words} |")
    return out


def _pairs_table(summary: dict) -> list[str]:
    """Every paired difference on every score: only the family's final accuracy is tested (Holm);
    every other row is described by its sign, its p given uncorrected."""
    out = ["Paired differences A - B over the seeds both have (seed s of both: same prompt order, same warm start): "
           "mean, the 95% interval of the mean that inverts the sign-flip test (below 6 seeds the [min, max] of "
           "the differences, marked min-max), median, exact sign-flip permutation p, uncorrected (sign test p). "
           "Only the pre-registered pairs' final accuracy is tested, with Holm's adjustment (above); every other "
           "score and pair is secondary, and its words give only the sign. MDE: the approximate smallest mean "
           "difference of final accuracy these seeds detect with 80% power at two-sided alpha 0.05, from the "
           "spread of the paired differences.", "",
           "| pair | score | n | mean A - B | interval | median | p (uncorrected) | p (sign) | MDE | in words |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for pair, stats in summary["pairs"].items():
        a, b = pair.split("_vs_")
        for score, st in stats.items():
            if "resolved_holm" in st:
                words = (f"resolved (Holm): {a} {'above' if st['mean'] > 0 else 'below'} {b}"
                         if st["resolved_holm"] else f"not resolved (Holm p {st['p_holm']:.3f})")
            else:
                words = _sign_words(st, a, b)
            out.append(f"| {pair} | {score} | {st['n']} | {st['mean']:+.3f} | {_interval(st)} | {st['median']:+.3f} | "
                       f"{st['p']:.3f} | {st['sign_p']:.3f} | "
                       f"{_fmt(st.get('mde'), '.3f', '')} | {words} |")
    return out


def _curves_table(summary: dict) -> list[str]:
    """Each condition's median curve, checkpoint by checkpoint, and where its generation went by
    third of the run; nothing when a condition's runs were evaluated at different steps."""
    conds = summary["conditions"]
    curves = [s["median_curve"] for s in conds.values()]
    if any(c is None for c in curves) or len({tuple(c) for c in curves}) != 1:
        return []
    steps = list(curves[0])
    out = [f"Median {summary['primary_metric']['name']} over seeds at each checkpoint (step), and the share "
           "of generated groups with equal rewards in each third of the run (median over seeds):", "",
           "| condition | " + " | ".join(f"{step}" for step in steps) + " | zero-variance share by third |",
           "|---" * (len(steps) + 2) + "|"]
    for c, s in conds.items():
        thirds = s["zero_variance_share_by_third"]
        out.append(f"| {c} | " + " | ".join(f"{v:.3f}" for v in s["median_curve"].values())
                   + f" | {'n/a' if thirds is None else ' / '.join(f'{t:.2f}' for t in thirds)} |")
    return out + [""]


def _warm_start_table(ws: dict, metric_name: str) -> list[str]:
    """The warm start's held-out accuracy and the histogram of the RL pool's per-prompt success."""
    n, base = ws["samples_per_prompt"], ws["heldout"]
    out = ["", f"Warm start ({ws['supervised_steps']} supervised steps): {metric_name} "
           f"{base['accuracy']:.3f} (" + ", ".join(f"{b} {v:.2f}" for b, v in base["by_band"].items())
           + f"), greedy {base['accuracy_greedy']:.3f}. Per-prompt success "
           f"rates over the {ws['pool_size']}-prompt RL pool ({n} samples each, temperature 1.0): "
           f"{ws['share_all_wrong']:.0%} all wrong, {ws['share_all_right']:.0%} all right, "
           f"{ws['share_mixed']:.0%} in between.", "",
           "| band | " + " | ".join(f"{k}/{n}" for k in range(n + 1)) + " |", "|---" * (n + 2) + "|"]
    return out + [f"| {b} | " + " | ".join(str(v) for v in h) + " |" for b, h in ws["success_rate_histogram"].items()]


def write_plots(runs: list[dict], summary: dict, out_dir: Path, order) -> None:
    """curves.png (the edition's main conditions, median and IQR), curves_all.png, bands.png,
    zero_variance.png (when the records count zero-variance groups) and spread.png."""
    present = [c for c in order if c in summary["conditions"]]
    main = [c for c in present if c in MAIN_PLOT[summary["edition"]]]
    plot(runs, summary, out_dir / "curves.png", main)
    plot(runs, summary, out_dir / "curves_all.png", present, iqr=False)
    plot_bands(runs, main, out_dir / "bands.png")
    counted = [c for c in present if all(se_analysis.has_zero_variance_counts(r) for r in runs if r["condition"] == c)]
    if counted:
        plot_zero_variance(runs, counted, out_dir / "zero_variance.png")
    if summary["warm_start"]:
        plot_spread(summary["warm_start"], out_dir / "spread.png")


def _pyplot():
    """matplotlib's pyplot without a display; imported when the first plot is drawn (it is heavy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def summarize(a, runs: list[dict]) -> dict:
    """`se_analysis.summarize` of the runs for the edition `a.edition` names (its pairs, family and
    primary question; the fourth edition's family is that of `a.holm_conditions`, the fifth's its
    own), with the sweep's settings, metric, provenance, warm start and timing beside it."""
    edition = se_analysis.EDITIONS[a.edition]
    summary = se_analysis.summarize(runs, edition=edition, planned=edition.planned or a.holm_conditions)
    summary["edition"] = a.edition
    summary["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()
                           if not k.startswith("_")}
    summary["primary_metric"] = {"name": f"held-out avg@{a.eval_samples}", "temperature": ROLLOUT_TEMPERATURE,
                                 "samples_per_problem": a.eval_samples}
    summary["provenance"] = evaluation_provenance()
    if a.analyse_only:  # this checkout only re-read the records: the runs' grading came with their calls
        summary["provenance"] = {"analysed_with": summary["provenance"]}
    warm_path = a.out_dir / "warm_start.json"
    summary["warm_start"] = json.loads(warm_path.read_text()) if warm_path.is_file() else None
    dates = sorted({r["session"][:10] for r in runs if r.get("session")})
    cpus = sorted({r["cpu"] for r in runs if r.get("cpu")})
    summary["timing"] = {  # date and cpu: the runs' own (None for older records, which lack them)
        "date": " to ".join(dict.fromkeys([dates[0], dates[-1]])) if dates else None,
        "cpu": "; ".join(cpus) or None, "analysed": time.strftime("%Y-%m-%d"), "analysed_on": cpu_description(),
        "runs": len(runs),
        "run_wall_s_median": _median([r["wall_s"] for r in runs]),
        "startup_s_median": _median([r["startup_s"] for r in runs]),
        "session_startup_s_total": sum(r.get("session_startup_s", 0.0) for r in runs),
        "eval_s_median": _median([r["eval_s"] for r in runs]),
        "run_wall_s_total": sum(r["wall_s"] + r["eval_s"] for r in runs),
        "this_call": None}  # main fills it in
    return summary


def evaluation_provenance() -> dict:
    """What graded the held-out answers: the grader's package versions and the code's commit."""
    from evaluation.provenance import harness_provenance, software_versions

    versions = software_versions()
    harness = harness_provenance()
    return {"grader": {"math-verify": versions.get("math-verify"),
                       "grader_sha256": harness["sources_sha256"].get("grader.py")},
            "git_commit": harness["git_commit"],
            "evaluation_uncommitted_changes": harness["evaluation_uncommitted_changes"]}


def _median(values) -> float:
    import numpy as np

    return float(np.median(values)) if values else math.nan


def jsonable(value):
    """`json.dumps` default for numpy values."""
    import numpy as np

    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(type(value))
