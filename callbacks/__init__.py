"""Lightning callbacks for seeing what training does: completion tables with prompt thumbnails, sample grids and
videos, reward breakdowns, throughput, training-health alarms and the end-of-run report. Each is used from YAML as
``class_path: callbacks.<module>.<Class>`` under ``trainer.callbacks``."""

from callbacks.completion_table import CompletionTableLogger
from callbacks.health import TrainingHealthMonitor
from callbacks.report import ReportWriter
from callbacks.reward_breakdown import RewardBreakdownLogger
from callbacks.sample_grid import SampleGridLogger
from callbacks.throughput import ThroughputLogger

__all__ = [
    "CompletionTableLogger",
    "ReportWriter",
    "RewardBreakdownLogger",
    "SampleGridLogger",
    "ThroughputLogger",
    "TrainingHealthMonitor",
]
