"""Built-in tasks; importing this package registers them."""

from app.vbvr.tasks import (
    color_mixing,  # noqa: F401
    connect_the_dots,  # noqa: F401
    counting,  # noqa: F401
    gravity_drop,  # noqa: F401
    maze_path,  # noqa: F401
    object_tracking,  # noqa: F401
    path_around_obstacles,  # noqa: F401
    pattern_continuation,  # noqa: F401
    rotation,  # noqa: F401
    shape_matching,  # noqa: F401
    sliding_block,  # noqa: F401
    sorting_by_size,  # noqa: F401
    symmetry_completion,  # noqa: F401
)
