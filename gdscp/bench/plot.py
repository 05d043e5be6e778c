"""``--plot``: throughput against thread count, one panel per measurement, for
gdscp, KvikIO, the single-threaded baselines and the ceiling. Needs matplotlib
(the ``plot`` extra); nothing else in gdscp does."""

from __future__ import annotations

import math
import os
from typing import Any

__all__ = ["PlotUnavailable", "require_matplotlib", "plot", "PLOT_SUFFIXES"]

PLOT_SUFFIXES = (".png", ".svg", ".pdf")

_STYLE = {
    "gdscp": {"color": "tab:green", "marker": "o"},
    "kvikio": {"color": "tab:blue", "marker": "s"},
    "python": {"color": "tab:orange", "linestyle": ":"},
    "numpy_cupy": {"color": "tab:red", "linestyle": "-."},
    "preadv": {"color": "tab:gray", "linestyle": "--"},
}
_LABEL = {
    "gdscp": "gdscp",
    "kvikio": "KvikIO",
    "python": "Python readinto",
    "numpy_cupy": "numpy.fromfile + cupy.asarray",
    "preadv": "bare os.preadv",
}


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> Any:
    """Import matplotlib (with a file-only backend) or raise ``PlotUnavailable`` saying how to get it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotUnavailable(
            f"--plot needs matplotlib, which is not installed ({exc}); install it with: pip install 'gdscp[plot]'"
        ) from None
    matplotlib.use("Agg")
    return matplotlib


def _title(record: dict) -> str:
    text = record["mode"] if record["cache"] is None else f"{record['mode']}, {record['cache']}"
    if record["io_size"]:
        size = record["io_size"]
        text += f", {size >> 20} MiB" if size >= 1 << 20 else f", {size >> 10} KiB" if size >= 1024 else f", {size} B"
    if record.get("buffer") == "fresh":
        text += ", fresh buffer"
    return text


def plot(document: dict, path: str) -> None:
    """Draw ``document`` (a ``run_benchmark`` result) to ``path`` (.png, .svg or .pdf)."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    keys: list[tuple] = []
    for record in document["results"]:
        key = (record["mode"], record["cache"], record["io_size"], record.get("buffer", "touched"))
        if key not in keys:
            keys.append(key)
    if not keys:
        raise ValueError("the benchmark result holds no measurements to plot")
    threads = sorted(document["config"]["threads"])
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys):
        records = [
            r for r in document["results"] if (r["mode"], r["cache"], r["io_size"], r.get("buffer", "touched")) == key
        ]
        for tool in ("gdscp", "kvikio"):
            mine = sorted((r for r in records if r["tool"] == tool), key=lambda r: r["threads"])
            if not mine:
                continue
            xs = [r["threads"] for r in mine]
            ys = [r["gb_per_s"]["median"] for r in mine]
            low = [y - r["gb_per_s"]["min"] for y, r in zip(ys, mine)]
            high = [r["gb_per_s"]["max"] - y for y, r in zip(ys, mine)]
            ax.errorbar(xs, ys, yerr=[low, high], capsize=3, label=_LABEL[tool], **_STYLE[tool])
        for tool in ("python", "numpy_cupy", "preadv"):
            for r in records:
                if r["tool"] == tool:
                    ax.axhline(r["gb_per_s"]["median"], label=_LABEL[tool], **_STYLE[tool])
        ceiling_name = records[0].get("ceiling")
        ceiling = document["ceilings"].get(ceiling_name) if ceiling_name else None
        if ceiling and ceiling.get("available"):
            by_threads = ceiling.get("by_threads")
            if by_threads and len(by_threads) > 1:
                ax.plot(
                    [e["threads"] for e in by_threads],
                    [e["gb_per_s"]["median"] for e in by_threads],
                    color="black",
                    linestyle="--",
                    label=f"ceiling: {ceiling_name}",
                )
            else:
                ax.axhline(
                    ceiling["gb_per_s"]["median"], color="black", linestyle="--", label=f"ceiling: {ceiling_name}"
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(threads)
        ax.set_xticklabels([str(t) for t in threads])
        ax.set_xlim(min(threads) / 1.5, max(threads) * 1.5)
        ax.set_ylim(bottom=0)
        ax.set_title(_title(records[0]))
        ax.set_xlabel("threads")
        ax.set_ylabel("GB/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")
    config = document["config"]
    where = "GPU" if config["memory"] == "gpu" else "host memory"
    fig.suptitle(f"gdscp benchmark: {config['size'] / (1 << 20):.0f} MiB file into {where}, {document['date']}")
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=110)
    plt.close(fig)
