"""One PNG per scenario: replicas asked for over time by every scaler, the work overlaid."""

from __future__ import annotations

from pathlib import Path

from bench.autoscale_lab.compare import ScenarioResult
from bench.autoscale_lab.oracle import WINDOW_S
from bench.autoscale_lab.scenarios import SCENARIOS

COLORS = {
    "oracle": "black",
    "kvgate": "tab:blue",
    "kvgate_forecast": "tab:cyan",
    "request_rate": "tab:red",
    "utilization": "tab:orange",
    "waiting": "tab:purple",
}


def plot(result: ScenarioResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenario = SCENARIOS[result.scenario]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    minutes = [(i + 0.5) * WINDOW_S / 60 for i in range(len(result.work))]
    ax.fill_between(minutes, result.work, step="mid", color="0.85", label="work (replicas at full use)")
    for name, run in result.runs.items():
        ax.step(
            [t.time_s / 60 for t in run.ticks],
            [t.desired for t in run.ticks],
            where="post",
            color=COLORS.get(name, "tab:gray"),
            linewidth=2.5 if name in ("oracle", "kvgate") else 1.3,
            linestyle="--" if name == "oracle" else "-",
            label=name,
        )
    for at_s in (scenario.rise_s, scenario.fall_s):
        ax.axvline(at_s / 60, color="0.5", linestyle=":", linewidth=1)
    ax.set_xlabel("minutes (virtual)")
    ax.set_ylabel("replicas asked for")
    ax.set_title(f"{result.scenario}: {scenario.description}", fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
