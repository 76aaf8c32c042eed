"""The retention curve: retention and end-to-end recall by document length, per writer and memory heads K.

    python -m benchmarks.retention_curve --out benchmarks/results/retention_curve.png \
        benchmarks/results/retention.json benchmarks/results/retention_smollm2.json

Reads the cells of :mod:`benchmarks.retention`'s result files (no run of its own) and draws one panel
per measure: x the document length (log scale), one line per (writer, K). A cell whose writer captured
nothing has no retention (nothing to retain): it is left out of the retention panel, kept in end-to-end.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MEASURES = (("retention", "retention (held at the answer / captured)"),
            ("end_to_end", "end to end (held at the answer / read)"))


def curves(cells: list[dict], measure: str) -> dict[tuple[str, int], list[tuple[int, float]]]:
    """(writer, K) -> [(length, value)] sorted by length; cells without a value (None) left out."""
    out: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for c in cells:
        if c.get(measure) is not None:
            out.setdefault((c["writer"], c["heads"]), []).append((c["length"], c[measure]))
    return {key: sorted(points) for key, points in sorted(out.items())}


def draw(cells: list[dict], path: Path) -> None:
    """Both panels of the curve into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(MEASURES), figsize=(11, 4), sharey=True)
    styles = {1: "-", 2: "--", 4: ":"}
    for ax, (measure, label) in zip(axes, MEASURES):
        for (writer, k), points in curves(cells, measure).items():
            xs, ys = zip(*points)
            n = min(c["n_docs"] for c in cells if c["writer"] == writer and c["heads"] == k)
            ax.plot(xs, ys, styles.get(k, "-."), marker="o", label=f"{writer}, K={k} (n={n})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("document tokens")
        ax.set_title(label, fontsize=10)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of needles")
    axes[-1].legend(fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("results", nargs="+", help="result files of benchmarks.retention")
    a = p.parse_args()
    cells = [c for f in a.results for c in json.loads(Path(f).read_text())["results"]]
    draw(cells, Path(a.out))
    print(f"{a.out}: {len(cells)} cells")


if __name__ == "__main__":
    main()
