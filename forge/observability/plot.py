"""A PNG of training curves from a metrics history (matplotlib, imported lazily)."""

from __future__ import annotations

from pathlib import Path


def plot_curves(history: list[dict[str, float]], keys: list[str], path: str | Path) -> Path:
    """One panel per key present in ``history`` (a list of per-step metric dicts with a
    ``step`` entry); writes ``path`` and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [k for k in keys if any(k in h for h in history)]
    fig, axes = plt.subplots(len(present) or 1, 1, figsize=(7, 2.6 * max(1, len(present))))
    axes = [axes] if len(present) <= 1 else list(axes)
    for ax, key in zip(axes, present):
        pts = [(h["step"], h[key]) for h in history if key in h]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.5)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
