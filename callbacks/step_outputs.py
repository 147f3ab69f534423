"""What the logging callbacks read from a training step's outputs (the dict a GRPO module's ``training_step``
returns; a module that returns something else is simply not logged by them).

``rows_per_prompt`` is the step's own count of each prompt's rows on this rank: K, or K / ``grpo.group_ranks`` when a
group is spread over ranks. The module's ``group_size`` (K, the whole group) does not say how this rank's rows group.
"""

from __future__ import annotations

from typing import Any


def rows_per_prompt(outputs: Any) -> int:
    """Rows of each prompt in ``outputs`` (``outputs["rows_per_prompt"]``), 1 for a step that does not group."""
    rows = outputs.get("rows_per_prompt", 1) if isinstance(outputs, dict) else 1
    return max(1, int(rows))
