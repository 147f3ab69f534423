"""Built-in tasks; importing this package registers them."""

from app.vbvr.tasks import counting  # noqa: F401
