"""PNG plots for eval reports (matplotlib, no display)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def paired_bars(path: Path, groups: Sequence[str], baseline: Sequence[float], measured: Sequence[float],
                baseline_label: str, measured_label: str, ylabel: str, title: str) -> str:
    """Per group: a grey bar (the baseline) beside a coloured bar (the measurement)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.6 * len(groups) + 2, 3.6))
    x = range(len(groups))
    ax.bar([i - 0.2 for i in x], baseline, 0.4, color="#9aa0a6", label=baseline_label)
    ax.bar([i + 0.2 for i in x], measured, 0.4, color="#0b5cad", label=measured_label)
    ax.set_xticks(list(x), groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def scatter(path: Path, x: Sequence[float], y: Sequence[float], xlabel: str, ylabel: str, title: str) -> str:
    """Points against the y = x diagonal."""
    return _xy(path, x, y, xlabel, ylabel, title, diagonal=True, points=True)


def curve(path: Path, x: Sequence[float], y: Sequence[float], xlabel: str, ylabel: str, title: str,
          diagonal: bool = False) -> str:
    return _xy(path, x, y, xlabel, ylabel, title, diagonal=diagonal, points=False)


def _xy(path: Path, x: Sequence[float], y: Sequence[float], xlabel: str, ylabel: str, title: str, diagonal: bool,
        points: bool) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4, 4) if points else (4.5, 3.6))
    if diagonal:
        ax.plot([0, 1], [0, 1], color="#9aa0a6", linewidth=1)
    if points:
        ax.scatter(x, y, s=8, color="#0b5cad")
    else:
        ax.plot(x, y, marker="o", markersize=3, color="#0b5cad")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
