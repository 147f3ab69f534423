"""Lightning callbacks for logging: completion tables, reward breakdowns, sample grids."""

from callbacks.completion_table import CompletionTableLogger

__all__ = ["CompletionTableLogger"]
