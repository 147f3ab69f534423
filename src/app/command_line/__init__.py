"""The command line, ``python -m app fit|validate|test|predict|export --config X.yaml`` (:mod:`app.__main__` is the
entry point).

- :mod:`~app.command_line.commands`: the commands (:class:`~app.command_line.commands.AppCLI`, a LightningCLI) and
  ``main``, which turns a user's mistake into a few lines and exit status 1.
- :mod:`~app.command_line.error_messages`: jsonargparse's errors and the constructors' errors reduced to the field, the
  bad value and a close match.
- :mod:`~app.command_line.config_search`: every bad field of a config at once.
- :mod:`~app.command_line.output_folders` and :mod:`~app.command_line.faults`: start-up checks (writable output
  folders) and losing nothing when a run is stopped (atomic checkpoint files, a checkpoint on preemption).
- :mod:`~app.command_line.console`: what a run prints (known noise filtered, a step progress bar, the artefact list).

Nothing is imported here: the reward server's command line (:mod:`app.rewards.serve`) uses the error messages
without loading the training stack.
"""
