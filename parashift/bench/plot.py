"""PNG views of a run: concurrency, TTFT, throughput and the plan over time (the
Shift paper's Fig. 8 view), and latency against arrival rate for a sweep."""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from parashift.bench.runner import PhaseResult  # noqa: E402


def plot_timeline(result: PhaseResult, rows: list[dict], path: Path, title: str) -> None:
    has_plan = any(row["plan"] for row in rows)
    fig, axes = plt.subplots(4 if has_plan else 3, 1, sharex=True,
                             figsize=(10, 9 if has_plan else 7.5))
    t = [row["t_s"] for row in rows]
    _concurrency(axes[0], t, rows)
    _ttft(axes[1], result, rows)
    axes[2].plot(t, [row["output_tok_per_s"] for row in rows], drawstyle="steps-post")
    axes[2].set_ylabel("output tok/s")
    if has_plan:
        _plans(axes[3], t, rows)
    _transitions(axes, rows)
    axes[-1].set_xlabel("time since start (s)")
    axes[0].set_title(title)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _concurrency(ax, t, rows) -> None:
    ax.plot(t, [row["in_flight"] for row in rows], drawstyle="steps-post",
            label="in flight (client)")
    if any(row["server_running"] is not None for row in rows):
        for key, label in (("server_running", "running (server)"),
                           ("server_waiting", "waiting (server)")):
            ax.plot(t, [row[key] if row[key] is not None else float("nan") for row in rows],
                    drawstyle="steps-post", label=label, alpha=0.8)
    ax.set_ylabel("requests")
    ax.legend(loc="upper right", fontsize=8)


def _ttft(ax, result: PhaseResult, rows) -> None:
    done = [r for r in result.records if r.ttft is not None]
    ax.scatter([r.start_s for r in done], [r.ttft * 1e3 for r in done], s=6, alpha=0.4,
               label="per request")
    medians = [(row["t_s"], row["ttft_median_ms"]) for row in rows
               if row["ttft_median_ms"] is not None]
    if medians:
        ax.plot(*zip(*medians), color="C3", drawstyle="steps-post", label="median")
    ax.set_ylabel("TTFT (ms), by start")
    ax.legend(loc="upper right", fontsize=8)


def _plans(ax, t, rows) -> None:
    names = sorted({row["plan"] for row in rows if row["plan"]})
    index = {name: i for i, name in enumerate(names)}
    ax.plot(t, [index.get(row["plan"], float("nan")) for row in rows],
            drawstyle="steps-post", marker=".")
    ax.set_yticks(range(len(names)), names)
    ax.set_ylabel("plan")


def _transitions(axes, rows) -> None:
    """A dashed line on every panel where the server committed a layout transition."""
    before = 0.0
    for row in rows:
        if row.get("transitions", 0.0) > before:
            for ax in axes:
                ax.axvline(row["t_s"], color="gray", linestyle="--", linewidth=0.8)
        before = row.get("transitions", 0.0)


def plot_sweep(points: list[tuple[float, dict]], path: Path, title: str) -> None:
    """Latency (mean end-to-end, median TTFT and TPOT) against request rate."""
    points = sorted(points, key=lambda p: p[0])
    rates = [rate for rate, _ in points]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, stat, label in (("e2el_ms", "mean", "mean end-to-end"),
                             ("ttft_ms", "median", "median TTFT"),
                             ("tpot_ms", "median", "median TPOT")):
        values = [s[key][stat] for _, s in points]
        ax.plot(rates, [float("nan") if v is None else v for v in values], marker="o",
                label=label)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
