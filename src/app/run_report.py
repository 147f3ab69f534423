"""The end-of-run report: ``report.md`` with the held-out tables (per data set, per task, first vs last evaluation)
and PNG plots (training reward curves, held-out curves, before/after bars), written with matplotlib's Agg canvas.

Metric keys are the logged ones without their stage: ``acc``, ``format``, ``pass@4``, ``reward/total`` (all evaluation
samples), ``acc/<task>`` (per task) and ``<set>/acc`` (a named evaluation set, see
:class:`~app.data.eval_sets.EvalSets`). :class:`RunHistory` collects them; ``callbacks.report``
fills it during a run and calls :func:`write_report`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_SET = "all"
"""The column of the per-set table for the keys without a set: every evaluation sample."""


@dataclass
class Evaluation:
    """One validation or test pass: ``metrics`` are keyed without the stage (``acc``, ``acc/<task>``, ``<set>/acc``)."""

    stage: str
    step: int
    metrics: dict[str, float]


@dataclass
class RunHistory:
    """What a report is made of.

    Attributes:
        train: ``train/...`` key -> {optimizer step: value}.
        evaluations: every evaluation, in order.
        eval_sets: names of the named evaluation sets (their keys start with ``<set>/``).
        title: the report's heading.
    """

    train: dict[str, dict[int, float]] = field(default_factory=dict)
    evaluations: list[Evaluation] = field(default_factory=list)
    eval_sets: list[str] = field(default_factory=list)
    title: str = "Run report"

    def add_train(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.train.setdefault(key, {})[step] = value

    def add_evaluation(self, stage: str, step: int, metrics: dict[str, float]) -> None:
        """Keep the ``<stage>/...`` entries of ``metrics`` (without the prefix)."""
        prefix = f"{stage}/"
        kept = {k[len(prefix) :]: v for k, v in metrics.items() if k.startswith(prefix)}
        if kept:
            self.evaluations.append(Evaluation(stage, step, kept))


def split_key(key: str, eval_sets: list[str]) -> tuple[str, str, str | None]:
    """``(data set, metric, task or None)`` of an evaluation key.

    >>> split_key("shift/acc/dots_left_of", ["shift"])
    ('shift', 'acc', 'dots_left_of')
    >>> split_key("reward/total", [])
    ('all', 'reward/total', None)
    """
    data_set, rest = DEFAULT_SET, key
    head, _, tail = key.partition("/")
    if head in eval_sets and tail:
        data_set, rest = head, tail
    if rest.startswith("reward/"):
        return data_set, rest, None
    metric, _, task = rest.partition("/")
    return data_set, metric, task or None


def _fmt(value: float | None) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _evaluation_tables(history: RunHistory) -> list[str]:
    lines: list[str] = []
    for stage in dict.fromkeys(e.stage for e in history.evaluations):
        evals = [e for e in history.evaluations if e.stage == stage]
        first, last = evals[0], evals[-1]
        lines += [
            "",
            f"## Held-out metrics ({stage}: {len(evals)} evaluation(s), step {first.step} -> {last.step})",
            "",
        ]
        keys = sorted(set(first.metrics) | set(last.metrics))
        rows = []
        for key in keys:
            a, b = first.metrics.get(key), last.metrics.get(key)
            change = f"{b - a:+.3f}" if a is not None and b is not None else ""
            rows.append([f"`{key}`", _fmt(a), _fmt(b), change])
        lines += _table(["metric", f"first (step {first.step})", f"last (step {last.step})", "change"], rows)
        parts = {key: split_key(key, history.eval_sets) for key in last.metrics}
        sets = sorted({s for s, _, _ in parts.values()}, key=lambda s: (s != DEFAULT_SET, s))
        if len(sets) > 1:
            metrics = sorted({m for _, m, t in parts.values() if t is None})
            lines += ["", f"### By data set (last {stage} evaluation)", ""]
            cell = {(s, m): v for key, v in last.metrics.items() for s, m, t in [parts[key]] if t is None}
            lines += _table(["metric", *sets], [[m, *(_fmt(cell.get((s, m))) for s in sets)] for m in metrics])
        tasks = sorted({(s, m, t) for s, m, t in parts.values() if t is not None})
        if tasks:
            lines += ["", f"### By task (last {stage} evaluation)", ""]
            rows = []
            for s, m, t in tasks:
                key = m + "/" + t if s == DEFAULT_SET else f"{s}/{m}/{t}"
                rows.append([s, t, m, _fmt(first.metrics.get(key)), _fmt(last.metrics.get(key))])
            lines += _table(["data set", "task", "metric", "first", "last"], rows)
    return lines


def _figure(width: float = 6.0, height: float = 3.5):
    from matplotlib.figure import Figure  # Figure + savefig use the Agg canvas: no display, no global pyplot state

    figure = Figure(figsize=(width, height), dpi=100)
    return figure, figure.add_subplot()


def _plot_curves(curves: dict[str, dict[int, float]], title: str, path: Path) -> None:
    figure, axes = _figure()
    for name, points in curves.items():
        steps = sorted(points)
        axes.plot(steps, [points[s] for s in steps], marker="." if len(steps) < 30 else None, label=name)
    axes.set_xlabel("optimizer step")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path)


def _plot_before_after(first: Evaluation, last: Evaluation, eval_sets: list[str], path: Path) -> None:
    keys = [k for k in sorted(set(first.metrics) & set(last.metrics)) if split_key(k, eval_sets)[2] is None]
    figure, axes = _figure(max(4.0, 0.9 * len(keys) + 2), 3.5)
    xs = range(len(keys))
    axes.bar([x - 0.2 for x in xs], [first.metrics[k] for k in keys], width=0.4, label=f"step {first.step}")
    axes.bar([x + 0.2 for x in xs], [last.metrics[k] for k in keys], width=0.4, label=f"step {last.step}")
    axes.set_xticks(list(xs), keys, rotation=30, ha="right", fontsize=8)
    axes.set_title(f"{first.stage}: first vs last evaluation")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)


def write_report(history: RunHistory, directory: str | Path) -> Path:
    """Write ``<directory>/report.md`` and its PNG plots; return the path of ``report.md``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"# {history.title}"]
    rewards = {k.removeprefix("train/"): v for k, v in history.train.items() if k.startswith("train/reward/") and v}
    if rewards:
        _plot_curves(rewards, "training reward (mean over the rollout)", directory / "train_rewards.png")
        lines += ["", "## Training", "", "![training rewards](train_rewards.png)", ""]
        last = {k: v[max(v)] for k, v in sorted(history.train.items()) if v}
        lines += _table(
            ["metric", "last value", "at step"],
            [[f"`{k}`", _fmt(v), str(max(history.train[k]))] for k, v in last.items()],
        )
    lines += _evaluation_tables(history)
    for stage in dict.fromkeys(e.stage for e in history.evaluations):
        evals = [e for e in history.evaluations if e.stage == stage]
        curves: dict[str, dict[int, float]] = {}
        for e in evals:
            for key, value in e.metrics.items():
                if split_key(key, history.eval_sets)[2] is None:
                    curves.setdefault(key, {})[e.step] = value
        if len(evals) > 1 and curves:
            _plot_curves(curves, f"{stage} metrics", directory / f"{stage}_curves.png")
            _plot_before_after(evals[0], evals[-1], history.eval_sets, directory / f"{stage}_before_after.png")
            lines += [
                "",
                f"![{stage} curves]({stage}_curves.png)",
                f"![{stage} before/after]({stage}_before_after.png)",
            ]
    if len(lines) == 1:
        lines += ["", "Nothing was logged yet (no training step and no evaluation)."]
    path = directory / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
