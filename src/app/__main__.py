"""``python -m app fit|validate|test|export --config configs/X.yaml``."""

from app.cli import main

if __name__ == "__main__":
    main()
