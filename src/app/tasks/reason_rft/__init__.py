"""Reason-RFT's visual reasoning suites (Reason-RFT Appendix A, docs/algorithms.md#papers): visual counting
(CLEVR-Math-like), structure perception and spatial transformation (TRANCE-like), each with train, in-domain test,
domain-shift test and CoT-SFT splits.

Every suite exposes ``make_samples(num, seed, split, image_size)``; ``python -m app.tasks reason_rft`` writes them as
WebDataset shards.
"""

from app.tasks.reason_rft.counting import VisualCountingDataset as VisualCountingDataset
from app.tasks.reason_rft.structure import StructurePerceptionDataset as StructurePerceptionDataset
from app.tasks.reason_rft.transformation import SpatialTransformationDataset as SpatialTransformationDataset
