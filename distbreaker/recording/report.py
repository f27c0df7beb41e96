"""How `distbreaker replay` shows its results: the table, the terminal plot, the PNG
(matplotlib, extra ``plot``, imported only for ``--plot FILE.png``). No decisions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .replay_core import ReplayResult, Truth

COLUMNS = ("config", "trips", "reopens", "time open", "rejected", "failures through",
           "false trips", "detect", "missed")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 600:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}m"


def row(r: ReplayResult) -> list[str]:
    return [r.label, str(r.trips), str(r.reopens), _duration(r.time_open_s),
            str(r.calls_rejected), str(r.failures_let_through), str(r.false_trips),
            _duration(r.mean_detect_s), f"{r.missed_incidents}/{r.incidents}"]


def table(results: Sequence[ReplayResult]) -> str:
    """One line per config, columns aligned."""
    rows = [list(COLUMNS), *(row(r) for r in results)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(r, widths, strict=True))).rstrip()
             for r in rows]
    return "\n".join(lines)


def _state_at(result: ReplayResult, t_ms: int) -> str:
    state = "CLOSED"
    for at, _, to in result.transitions:
        if at > t_ms:
            break
        state = to
    return state


_GLYPH = {"CLOSED": ".", "OPEN": "#", "HALF_OPEN": "~"}


def terminal_plot(results: Sequence[ReplayResult], truth: Truth, target: float,
                  width: int = 72) -> str:
    """A strip per config over the timeline ('.' CLOSED, '#' OPEN, '~' HALF_OPEN), under
    the recorded failure rate ('0'-'9': tens of percent, '!' at or above the target)."""
    if not results:
        return ""
    start, end = results[0].start_ms, max(results[0].end_ms, results[0].start_ms + 1)
    step = (end - start) / width
    label_w = max(len("failure rate"), *(len(r.label) for r in results))
    cols = [int(start + (i + 0.5) * step) for i in range(width)]

    def rate_glyph(t: int) -> str:
        rate = truth.rate_at(t)
        if rate is None:
            return " "
        if rate >= target:
            return "!"
        return str(min(9, int(rate // 10)))

    lines = [f"{'failure rate'.ljust(label_w)} |{''.join(rate_glyph(t) for t in cols)}|"]
    for r in results:
        strip = "".join(_GLYPH.get(_state_at(r, t), "?") for t in cols)
        lines.append(f"{r.label.ljust(label_w)} |{strip}|")
    lines.append(f"{''.ljust(label_w)}  0s{'':>{max(0, width - 8)}}"
                 f"{_duration((end - start) / 1000)}")
    lines.append("  '.' CLOSED  '#' OPEN  '~' HALF_OPEN;  failure rate: 0-9 tens of %, "
                 f"'!' >= {target:g}%")
    return "\n".join(lines)


def png_plot(path: str, results: Sequence[ReplayResult], truth: Truth,
             target: float) -> None:
    """The recorded failure rate and each config's state over time, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot FILE.png needs matplotlib: "
                           "pip install 'distbreaker[plot]'") from None
    if not results:
        return
    start = results[0].start_ms
    n = len(results)
    fig, axes = plt.subplots(n + 1, 1, sharex=True, figsize=(10, 1.6 * (n + 1) + 0.6))
    xs = [i * truth.bucket_ms / 1000 for i in range(len(truth.rates))]
    ax: Any = axes[0]
    ax.step(xs, [r if r is not None else 0 for r in truth.rates], where="post")
    ax.axhline(target, linestyle="--", linewidth=1)
    ax.set_ylabel("failure %")
    level = {"CLOSED": 0, "HALF_OPEN": 1, "OPEN": 2}
    for ax, r in zip(axes[1:], results, strict=True):
        ts = [0.0] + [(t - start) / 1000 for t, _, _ in r.transitions] + \
            [(r.end_ms - start) / 1000]
        ys = [0] + [level.get(to, 0) for _, _, to in r.transitions]
        ys.append(ys[-1])
        ax.step(ts, ys, where="post")
        ax.set_yticks([0, 1, 2], ["CLOSED", "HALF", "OPEN"])
        ax.set_ylabel(r.label, rotation=0, ha="right")
    axes[-1].set_xlabel("seconds into the timeline")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
