"""``python -m app fit|validate|test|export --config configs/X.yaml``, and ``python -m app rehearse --config X.yaml``
(several fits of a GPU recipe on CPU, :mod:`app.rehearsal`: not a Lightning command)."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["rehearse"]:
        from app.rehearsal.run import main as rehearse

        rehearse(sys.argv[2:])
    else:
        from app.command_line.commands import main

        main()
