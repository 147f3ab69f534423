"""Where the groups and the pairs of groups lie in a batch of scored rows.

The trainer scores ``N = B * K`` rows and passes ``samples[i]``, the prompt of row ``i``, repeating each prompt's
sample object K times, group-major. A group is therefore a maximal run of consecutive rows holding the *same object*
(``is``, not ``==``: two prompts may be equal as data and still be two groups). Rewards of scope ``"group_pair"``
(consistency rewards) further need the groups paired: a prompt ``x`` and its augmented twin ``x'`` are consecutive
groups ``(2j, 2j + 1)`` whose samples share ``meta["pair_id"]``, and the twin's ``meta["relation"]`` says how its
answer relates to the original's (see :data:`RELATIONS`). The paired data sets (``app.tasks.dots.pairs``) and the data
module's collate function lay batches out that way.

>>> from app.types import VisualSample
>>> x = VisualSample(images=[], question="Is red left of blue?", task="t", meta={"pair_id": 7})
>>> negation = {"pair_id": 7, "relation": "negation"}
>>> twin = VisualSample(images=[], question="Is blue left of red?", task="t", meta=negation)
>>> split_groups([x, x, twin, twin])
[slice(0, 2, None), slice(2, 4, None)]
>>> pair_groups([x, x, twin, twin])
[(slice(0, 2, None), slice(2, 4, None), 'negation')]
"""

from __future__ import annotations

from collections.abc import Sequence

from app.types import PAIR_RELATIONS, VisualSample

RELATIONS = PAIR_RELATIONS
"""Answer effects of a transform: ``identity`` (the twin's answer equals the original's) or ``negation`` (it is the
opposite; only for boolean answers). Composed transforms multiply: an odd number of negations gives ``negation``."""


def split_groups(samples: Sequence[VisualSample], group_size: int | None = None) -> list[slice]:
    """The groups of ``samples`` in order, one ``slice`` of rows per group (``[]`` for no rows).

    With ``group_size`` (K, which the trainer passes) the groups are the consecutive runs of K rows. Without it (a
    direct call on a hand-made batch) they are the maximal runs of consecutive rows whose sample is the same object.

    >>> split_groups(["a", "a", "b", "b"], group_size=2)
    [slice(0, 2, None), slice(2, 4, None)]
    """
    if group_size is not None:
        if group_size < 1 or len(samples) % group_size:
            raise ValueError(f"{len(samples)} rows do not split into groups of group_size={group_size}")
        return [slice(start, start + group_size) for start in range(0, len(samples), group_size)]
    groups: list[slice] = []
    start = 0
    for i in range(1, len(samples) + 1):
        if i == len(samples) or samples[i] is not samples[start]:
            groups.append(slice(start, i))
            start = i
    return groups


def _describe(samples: Sequence[VisualSample], group: slice) -> str:
    sample = samples[group.start]
    return f"rows {group.start}:{group.stop} (task {getattr(sample, 'task', '?')!r})"


def pair_groups(samples: Sequence[VisualSample], group_size: int | None = None) -> list[tuple[slice, slice, str]]:
    """Pair consecutive groups ``(2j, 2j + 1)`` as ``(rows of x, rows of x', relation)``; the groups are those of
    :func:`split_groups` (runs of ``group_size`` rows when it is given).

    Raises:
        ValueError: the number of groups is odd (a group without its twin), the two samples of a pair lack
            ``meta["pair_id"]`` or carry different ones, the groups have different sizes, or the twin's
            ``meta["relation"]`` is missing or not one of :data:`RELATIONS`. Each is a data-layout bug, not bad model
            output, so it raises instead of scoring 0.
    """
    groups = split_groups(samples, group_size)
    if len(groups) % 2:
        raise ValueError(
            f"consistency rewards need groups in pairs (a prompt, then its augmented twin), but the batch has "
            f"{len(groups)} groups; the last one, {_describe(samples, groups[-1])}, is unpaired. Use a paired task "
            "(e.g. dots_left_of_pairs) so the collate function keeps each pair adjacent"
        )
    pairs = []
    for first, second in zip(groups[0::2], groups[1::2]):  # noqa: B905 (an even number of groups)
        x, twin = samples[first.start], samples[second.start]
        pair_id, twin_id = (getattr(s, "meta", {}).get("pair_id") for s in (x, twin))
        if pair_id is None or twin_id is None:
            raise ValueError(
                f"groups {_describe(samples, first)} and {_describe(samples, second)} should form a pair, but "
                f"meta['pair_id'] is missing ({pair_id!r}, {twin_id!r}); consistency rewards need paired samples"
            )
        if pair_id != twin_id:
            raise ValueError(
                f"groups {_describe(samples, first)} and {_describe(samples, second)} should form a pair, but their "
                f"pair ids differ ({pair_id!r} != {twin_id!r}): a group is unpaired or the pairs were reordered"
            )
        if first.stop - first.start != second.stop - second.start:
            raise ValueError(
                f"paired groups must have the same size, got {first.stop - first.start} rows for pair "
                f"{pair_id!r}'s original and {second.stop - second.start} for its twin"
            )
        relation = twin.meta.get("relation")
        if relation not in RELATIONS:
            raise ValueError(
                f"unknown relation {relation!r} in meta['relation'] of pair {pair_id!r}'s twin "
                f"({_describe(samples, second)}); expected one of {RELATIONS}"
            )
        pairs.append((first, second, relation))
    return pairs
