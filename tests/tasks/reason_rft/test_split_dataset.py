"""SplitDataset.make_samples: the shard writer's samples of a suite are its data set's, for every suite built on it."""

import pytest

from app.tasks.reason_rft import counting, transformation
from app.tasks.reason_rft.counting import VisualCountingDataset
from app.tasks.reason_rft.transformation import SpatialTransformationDataset

SUITES = [
    (counting, VisualCountingDataset, "test_domain_shift"),
    (transformation, SpatialTransformationDataset, "test_left"),
]


def content(sample):
    return sample.question, sample.answer, sample.reasoning, sample.meta, [image.tobytes() for image in sample.images]


@pytest.mark.parametrize(("module", "dataset", "split"), SUITES)
def test_make_samples_gives_the_labeled_samples_of_the_suite_s_data_set_in_order(module, dataset, split):
    expected = [content(s) for s in dataset(3, 4, 32, split)]
    assert [content(s) for s in module.make_samples(3, 4, split, 32)] == expected
    assert [content(s) for s in module.make_samples(2, 4, split, 32)] == expected[:2]  # a prefix: the same first ones
    assert next(module.make_samples(1, 4, split)).images[0].size == (128, 128)  # the data set's default size


@pytest.mark.parametrize(("module", "dataset", "split"), SUITES)
def test_make_samples_refuses_an_unknown_split_or_a_negative_count_when_called(module, dataset, split):
    with pytest.raises(ValueError, match=r"^unknown split 'val'; known: train, "):
        module.make_samples(1, 0, "val", 32)  # at the call, before the first sample is asked for
    with pytest.raises(ValueError, match=r"^num_samples must be >= 0, got -1$"):
        module.make_samples(-1, 0, split, 32)
    assert list(module.make_samples(0, 0, split, 32)) == []
