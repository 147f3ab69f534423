"""The exception for a user's mistake, raised by any layer: a configuration or input a run cannot use.

Only the class lives here, so that the data, models and modules import it without the command line; ``python -m app``
(:mod:`app.command_line`) prints its message alone, and :mod:`app.command_line.error_messages` shortens the errors
jsonargparse reports.
"""


class ConfigError(ValueError):
    """A configuration or input a run cannot use. ``python -m app`` prints its message alone and exits 1."""
