"""Built-in tasks; importing this package registers them."""

from app.vbvr.tasks import counting  # noqa: F401
from app.vbvr.tasks import color_mixing  # noqa: F401
from app.vbvr.tasks import symmetry_completion  # noqa: F401
from app.vbvr.tasks import pattern_continuation  # noqa: F401
from app.vbvr.tasks import rotation  # noqa: F401
from app.vbvr.tasks import maze_path  # noqa: F401
from app.vbvr.tasks import path_around_obstacles  # noqa: F401
from app.vbvr.tasks import sliding_block  # noqa: F401
from app.vbvr.tasks import gravity_drop  # noqa: F401
from app.vbvr.tasks import object_tracking  # noqa: F401
from app.vbvr.tasks import sorting_by_size  # noqa: F401
from app.vbvr.tasks import shape_matching  # noqa: F401
from app.vbvr.tasks import connect_the_dots  # noqa: F401
