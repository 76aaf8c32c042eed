"""Evaluation: accuracy per (method, task, length) with 95% intervals, as a table and two plots.

Records are the batch job's output rows (one per item and method): ``method``, ``task``,
``length``, ``score`` (the task's metric in [0, 1]) and ``error``. A row that errored scores 0
and is counted in ``errors``: nothing is dropped from the denominator.

The pictures follow the paper: a heatmap of accuracy over (method · task) × length (its
Figure 6 / Table 2 shape) and accuracy against length, one line per method.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

# Display names; RULER ids are kept in the CSV.
TASK_LABELS = {
    "niah_single_1": "NIAH single (noise)",
    "niah_single_2": "NIAH single (essay)",
    "niah_single_3": "NIAH single (essay, uuid)",
    "niah_multikey_1": "NIAH multikey 1",
    "niah_multikey_2": "NIAH multikey 2",
    "niah_multikey_3": "NIAH multikey 3",
    "niah_multivalue": "NIAH multivalue",
    "niah_multiquery": "NIAH multiquery",
    "vt": "Variable tracking",
    "cwe": "Common words",
    "fwe": "Frequent words",
    "qa_1": "SQuAD QA",
    "qa_2": "HotpotQA",
}
SUMMARY_COLUMNS = ["method", "task", "length", "n", "errors", "accuracy", "ci_low", "ci_high"]


def wilson_interval(mean: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion ``mean`` observed over ``n`` items.

    Better than mean ± 1.96·se at the small n and 0%/100% accuracies evaluations have (it never
    leaves [0, 1] and is not zero-width at the extremes). Fractional scores (string_match_all
    over several needles) are treated as proportions.

    >>> [round(x, 3) for x in wilson_interval(1.0, 4)]
    [0.51, 1.0]
    """
    if n <= 0:
        return (math.nan, math.nan)
    denom = 1 + z * z / n
    centre = (mean + z * z / (2 * n)) / denom
    half = z * math.sqrt(mean * (1 - mean) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def summarize(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (method, task, length): n items, errors, mean accuracy and its 95% interval.

    Shape: ``len(methods) * len(tasks) * len(lengths)`` rows, :data:`SUMMARY_COLUMNS`.
    """
    df = pd.DataFrame(list(records), columns=["method", "task", "length", "score", "error"])
    if df.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    df["errored"] = df["error"].notna()
    df["score"] = df["score"].where(~df["errored"], 0.0).fillna(0.0).astype(float)
    rows = []
    for (method, task, length), g in df.groupby(["method", "task", "length"], sort=True):
        n, acc = len(g), float(g["score"].mean())
        lo, hi = wilson_interval(acc, n)
        rows.append((method, task, int(length), n, int(g["errored"].sum()), acc, lo, hi))
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


RETENTION_COLUMNS = ["method", "task", "length", "n", "needles_read", "capture", "retention", "end_to_end"]


def summarize_retention(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (method, task, length) whose rows have evidence: capture (captured / read), retention
    (retained / captured) and end to end (retained / read), summed over the cell's items.

    ``records`` carry method, task, length and the :func:`memagent.retention.row_retention` counts
    ``n_read``, ``n_captured``, ``n_retained`` (rows without evidence left out). Shape: at most one row
    per cell of :func:`summarize`, :data:`RETENTION_COLUMNS`; a rate over no item is NaN.
    """
    df = pd.DataFrame(list(records), columns=["method", "task", "length", "n_read", "n_captured", "n_retained"])
    rows = []
    for (method, task, length), g in df.groupby(["method", "task", "length"], sort=True):
        read, cap, ret = (int(g[c].sum()) for c in ("n_read", "n_captured", "n_retained"))
        rows.append((method, task, int(length), len(g), read, _ratio(cap, read), _ratio(ret, cap), _ratio(ret, read)))
    return pd.DataFrame(rows, columns=RETENTION_COLUMNS)


def _ratio(num: int, den: int) -> float:
    return num / den if den else math.nan


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:.0f}"


def task_length_tables(summary: pd.DataFrame, cell: Callable[[pd.Series], str]) -> list[str]:
    """One markdown table per method, tasks × lengths; ``cell`` writes a (task, length) row's cell
    ('–' where the cell has no row)."""
    lines = []
    lengths = sorted(summary["length"].unique())
    for method, m in summary.groupby("method", sort=False):
        lines += [f"### {method}", "", "| task | " + " | ".join(length_label(x) for x in lengths) + " |",
                  "|---|" + "---|" * len(lengths)]
        for task, t in m.groupby("task", sort=False):
            rows = [t[t["length"] == length] for length in lengths]
            cells = ["–" if r.empty else cell(r.iloc[0]) for r in rows]
            lines.append(f"| {TASK_LABELS.get(task, task)} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def retention_markdown(summary: pd.DataFrame) -> str:
    """Task × length table per method: 'capture% / retention% (items read)'; empty without rows."""
    if summary.empty:
        return ""

    def cell(r: pd.Series) -> str:
        return "–" if not r.needles_read else f"{_pct(r.capture)} / {_pct(r.retention)} (read {r.needles_read})"

    lines = ["## Evidence kept in memory", "", *task_length_tables(summary, cell)]
    lines.append("Capture % / retention % of the evidence read (needles; supporting paragraphs' titles): capture = "
                 "items held by the memory at or after the step that read them / items read; retention = of those, "
                 "items the memory the answer reads still holds.")
    return "\n".join(lines) + "\n"


def length_label(tokens: int) -> str:
    """4096 -> '4K', 131072 -> '128K', 1000 -> '1000'."""
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def results_markdown(summary: pd.DataFrame, notes: Iterable[str] = ()) -> str:
    """Task × length table per method: 'accuracy% [low, high] (n)'."""

    def cell(r: pd.Series) -> str:
        err = f", {r.errors} err" if r.errors else ""
        return f"{100 * r.accuracy:.0f} [{100 * r.ci_low:.0f}, {100 * r.ci_high:.0f}] (n={r.n}{err})"

    lines = task_length_tables(summary, cell)
    lines += ["Accuracy in %, 95% Wilson interval in brackets, n items per cell."] + [f"{n}" for n in notes]
    return "\n".join(lines) + "\n"


def plot_heatmap(summary: pd.DataFrame, path: str | Path, title: str = "Accuracy (%)") -> Path:
    """Rows: method · task; columns: length; cells annotated with the accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summary.assign(row=summary["method"] + " · " + summary["task"].map(lambda t: TASK_LABELS.get(t, t)))
    grid = summary.pivot_table(index="row", columns="length", values="accuracy", sort=False) * 100
    fig, ax = plt.subplots(figsize=(1.2 * grid.shape[1] + 4, 0.5 * grid.shape[0] + 1.5))
    im = ax.imshow(grid.values, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(grid.shape[1]), [length_label(int(c)) for c in grid.columns])
    ax.set_yticks(range(grid.shape[0]), list(grid.index))
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            v = grid.values[i, j]
            if not math.isnan(v):
                ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=9)
    ax.set_xlabel("document length (tokens)")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_accuracy_vs_length(summary: pd.DataFrame, path: str | Path) -> Path:
    """One panel per task plus their mean; one line per method with its 95% interval as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(summary["task"]))
    mean = summary.groupby(["method", "length"], as_index=False, sort=False)["accuracy"].mean().assign(task="mean")
    panels = tasks + (["mean"] if len(tasks) > 1 else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2), squeeze=False, sharey=True)
    for ax, task in zip(axes[0], panels):
        data = mean if task == "mean" else summary[summary["task"] == task]
        for method, m in data.groupby("method", sort=False):
            m = m.sort_values("length")
            ax.plot(m["length"], 100 * m["accuracy"], marker="o", label=method)
            if "ci_low" in m:
                ax.fill_between(m["length"], 100 * m["ci_low"], 100 * m["ci_high"], alpha=0.15)
        ax.set_xscale("log", base=2)
        lengths = sorted(data["length"].unique())
        ax.set_xticks(lengths, [length_label(int(x)) for x in lengths])
        ax.minorticks_off()
        ax.set_title("mean over tasks" if task == "mean" else TASK_LABELS.get(task, task), fontsize=10)
        ax.set_xlabel("tokens")
        ax.set_ylim(-5, 105)
    axes[0][0].set_ylabel("accuracy (%)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
