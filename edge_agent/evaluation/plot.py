"""The plot: reasoning time per turn by mode and the rationale mix, as a PNG.

matplotlib (the ``plot`` extra) is imported only when a plot is drawn; its absence raises
ImportError for the caller to report. Does not know: how the run was made.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from edge_agent.evaluation.dataset import dataset_name

if TYPE_CHECKING:
    from edge_agent.evaluation.runner import EvalRun


def write_plot(run: EvalRun, path: Path) -> Path | None:
    """Reasoning time per turn by mode (box plot, ms, log scale) and the rationale mix (stacked bars).

    Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend change).
    Raises ImportError when matplotlib is missing; returns None when there is nothing to plot.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    modes = [m.name for m in run.modes]
    times = {n: [1000 * t["reasoning_seconds"] for r in run.records if r["mode"] == n for t in r["turn_log"]
                 if t["reasoning_seconds"] is not None] for n in modes}
    if not any(times.values()):
        return None
    ssr_modes = [n for n in modes if run.metrics[n]["scored_turns"]]
    fig = Figure(figsize=(11, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2, 1)
    shown = [n for n in modes if times[n]]
    ax.boxplot([times[n] for n in shown], showmeans=True)
    ax.set_xticks(range(1, len(shown) + 1), shown)
    if min(min(v) for v in times.values() if v) > 0:
        ax.set_yscale("log")
    ax.set_ylabel("reasoning time per turn (ms)")
    ax.set_title("Reasoning time per turn")
    ax.grid(axis="y", alpha=0.3)
    ax2 = fig.add_subplot(1, 2, 2)
    if ssr_modes:
        ids = sorted({k for n in ssr_modes for k in run.metrics[n]["rationale_mix"]})
        bottom = [0.0] * len(ssr_modes)
        for k in ids:
            vals = [100 * run.metrics[n]["rationale_mix"].get(k, 0.0) for n in ssr_modes]
            ax2.bar(ssr_modes, vals, bottom=bottom, label=k)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax2.set_ylabel("share of scored turns (%)")
        ax2.set_ylim(0, 100)
        ax2.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    else:
        ax2.text(0.5, 0.5, "no SSR mode evaluated", ha="center", va="center")
        ax2.set_axis_off()
    ax2.set_title(f"Rationale mix ({dataset_name(run.dataset)})")
    fig.tight_layout()
    fig.savefig(path, format="png", bbox_inches="tight")  # keep the legend outside the axes
    return path
