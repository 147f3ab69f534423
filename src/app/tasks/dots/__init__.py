"""The toy tasks: small PIL-rendered versions of each paper's task that train on a CPU (the quickstart and the CPU
recipes), each rebuilt from ``(seed, index)``.

- :class:`DotsDataset` (``dots_left_of``): is the red dot left of the blue dot? (the quickstart)
- :class:`PairedDotsDataset` (``dots_left_of_pairs``): a dots prompt and an augmented twin, for OT-GRPO's consistency
  reward; :class:`DotsPairAugmenter` makes the twins on the fly for streamed shards.
- :class:`TripletDotsDataset` (``dots_count_triplets``): which of three images has more dots (CoRe / TriSR format).
- :class:`CountingDataset` (``dots_count``): how many dots (Reason-RFT's numeric answers).
- :class:`TransformDataset` (``dots_transform``): which changes turn one scene into another (Reason-RFT's function
  sequences).
- :class:`ShapePromptDataset` (``shape_prompts``): "a red circle on the left" prompts and pictures for the tiny flow
  models.
"""

from app.tasks.dots.counting import CountingDataset
from app.tasks.dots.dots import DotsDataset, make_dots_sample
from app.tasks.dots.pairs import DotsPairAugmenter, PairedDotsDataset
from app.tasks.dots.shapes import ShapePromptDataset
from app.tasks.dots.transforms import TransformDataset
from app.tasks.dots.triplets import TripletDotsDataset, make_dots_triplet_sample

__all__ = [
    "CountingDataset",
    "DotsDataset",
    "DotsPairAugmenter",
    "PairedDotsDataset",
    "ShapePromptDataset",
    "TransformDataset",
    "TripletDotsDataset",
    "make_dots_sample",
    "make_dots_triplet_sample",
]
