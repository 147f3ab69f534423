"""Reason-RFT's visual reasoning suites (papers/001 Appendix A): visual counting (CLEVR-Math-like), structure perception
and spatial transformation (TRANCE-like), each with train, in-domain test, domain-shift test and CoT-SFT splits.

Every suite exposes ``make_samples(num, seed, split, image_size)``; ``python -m app.data reason_rft`` writes them as
WebDataset shards.
"""

from app.data.reason_rft.counting import VisualCountingDataset as VisualCountingDataset
from app.data.reason_rft.structure import StructurePerceptionDataset as StructurePerceptionDataset
from app.data.reason_rft.transformation import SpatialTransformationDataset as SpatialTransformationDataset
