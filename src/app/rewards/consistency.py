"""Label-free consistency rewards (OT-GRPO, docs/algorithms.md#papers): verifiers, pairing strategies, and the reward.

A prompt ``x`` and its augmented twin ``x'`` (a transform with a known answer effect, ``identity`` or ``negation``) are
each sampled K times. The verifier scores every cross pair, ``V_ij = verif(y_i, y'_j)`` in {0, 1}, and a pairing
strategy turns the ``[K, K]`` matrix into one reward per completion (docs/algorithms.md#consistency-verifiers and
docs/algorithms.md#consistency-pairing). Every strategy is written as a coupling ``gamma`` ``[n0, n1]`` of the valid
completions, with marginals ``1/n0`` and ``1/n1``; a completion's reward is its transport-weighted verifier value,
``r_i = n0 sum_j gamma_ij V_ij`` and ``r'_j = n1 sum_i gamma_ij V_ij`` (for a permutation, simply ``V_{i, sigma(i)}``):

- ``minimal`` (OT-GRPO): the coupling of least total consistency, ``argmin_gamma sum gamma_ij V_ij``. With
  ``n0 == n1`` it is a permutation (Birkhoff-von Neumann) found by ``scipy.optimize.linear_sum_assignment``, the same
  optimum as POT's network simplex at a tenth of the cost; with ``n0 != n1``, POT's ``ot.emd`` (as in the paper).
- ``one_to_all``: the independent coupling, so ``r_i = mean_j V_ij`` over the valid j (and ``r'_j`` likewise).
- ``random``: ``r_i = V_{i, pi(i)}``. Without a generator ``pi`` is the identity, ``r_i = V_ii`` as in
  docs/algorithms.md#consistency-pairing and the paper's "by generation order" (the K samples are exchangeable, so
  that is already a uniformly random pairing); with a ``torch.Generator`` ``pi`` is drawn from it for every pair of
  groups.

Unparseable completions (no ``<answer>`` block, or an answer the answer type cannot read) get reward 0 and are left out
of the coupling (paper, Appendix B.2-B.3); when one side has no valid completion, every reward of the pair is 0.

Departures, where the paper says nothing: with ``n0 != n1`` the ``random`` strategy uses the north-west-corner coupling
of the valid completions in (permuted) order, which is the permutation above when ``n0 == n1``; the twin group's
rewards are defined symmetrically for every strategy; counts must be non-negative integers and distances non-negative
numbers, anything else is unparseable.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from app.rewards.base import RewardComponent
from app.rewards.groups import RELATIONS, pair_groups
from app.rewards.parsing import extract_answer, parse_bool, parse_number
from app.types import VisualSample

AnswerType = Literal["bool", "count", "distance", "from_meta"]
FROM_META = "from_meta"  # each pair's answer type read from its prompt's meta["answer_type"]
Pairing = Literal["random", "one_to_all", "minimal"]
Answer = Hashable  # a parsed answer: bool (bool answers) or float (count, distance)
Verifier = Callable[[Answer, Answer, str], float]
PAIRINGS = ("random", "one_to_all", "minimal")


# ------------------------------------------------------------------------------------------------------- verifiers
def bool_verifier(y: bool, y_twin: bool, relation: str) -> float:
    """``1[y_twin == phi(y)]``: 1.0 when the twin's answer is the original's (``identity``) or its opposite
    (``negation``), else 0.0.

    >>> bool_verifier(True, True, "identity"), bool_verifier(True, True, "negation")
    (1.0, 0.0)
    >>> bool_verifier(True, False, "negation")
    1.0
    """
    if relation == "identity":
        return float(y == y_twin)
    if relation == "negation":
        return float(y != y_twin)
    raise ValueError(f"unknown relation {relation!r}; expected one of {RELATIONS}")


def _identity_only(kind: str, relation: str) -> None:
    if relation != "identity":
        raise ValueError(f"{kind} answers only support invariant transforms (relation 'identity'), got {relation!r}")


def count_verifier(y: float, y_twin: float, relation: str) -> float:
    """Exact equality of two counts; only invariant transforms (``identity``) apply to counts.

    >>> count_verifier(3.0, 3.0, "identity"), count_verifier(3.0, 4.0, "identity")
    (1.0, 0.0)
    """
    _identity_only("count", relation)
    return float(y == y_twin)


def distance_verifier(y: float, y_twin: float, relation: str, tolerance: float = 0.1) -> float:
    """1.0 when two distances agree within a relative ``tolerance``: ``|y - y'| <= tolerance * max(|y|, |y'|)``
    (symmetric, so the order of the prompts does not matter; two zeros agree). Only ``identity`` applies.

    >>> distance_verifier(2.0, 2.1, "identity"), distance_verifier(2.0, 2.5, "identity")
    (1.0, 0.0)
    """
    _identity_only("distance", relation)
    return float(abs(y - y_twin) <= tolerance * max(abs(y), abs(y_twin)))


def parse_count(answer: str) -> float | None:
    """A non-negative integer count (``"3"``, ``"3.0"``) as a float, else None.

    >>> parse_count("3"), parse_count("2.5"), parse_count("-1"), parse_count("many")
    (3.0, None, None, None)
    """
    value = parse_number(answer)
    return value if value is not None and value >= 0 and value.is_integer() else None


def parse_distance(answer: str) -> float | None:
    """A non-negative finite number, else None.

    >>> parse_distance("1.5"), parse_distance("-2"), parse_distance("1e309")
    (1.5, None, None)
    """
    value = parse_number(answer)
    return value if value is not None and value >= 0 else None


_PARSERS: dict[str, Callable[[str], Answer | None]] = {
    "bool": parse_bool,
    "count": parse_count,
    "distance": parse_distance,
}
_RELATIONS_OF = {"bool": RELATIONS, "count": ("identity",), "distance": ("identity",)}


def answer_spec(answer_type: str, distance_tolerance: float = 0.1) -> tuple[Callable[[str], Answer | None], Verifier]:
    """``(parser, verifier)`` of an answer type (``"bool"``, ``"count"`` or ``"distance"``)."""
    if answer_type not in _PARSERS:
        raise ValueError(f"unknown answer_type {answer_type!r}; expected one of {tuple(_PARSERS)}")
    if not (math.isfinite(distance_tolerance) and distance_tolerance >= 0):
        raise ValueError(f"distance_tolerance must be a finite number >= 0, got {distance_tolerance}")
    verifiers = {
        "bool": bool_verifier,
        "count": count_verifier,
        "distance": functools.partial(distance_verifier, tolerance=distance_tolerance),
    }
    return _PARSERS[answer_type], verifiers[answer_type]


def parse_answers(completions: Sequence[str], answer_type: AnswerType = "bool") -> list[Answer | None]:
    """The answer of each completion's first ``<answer>`` block, parsed for ``answer_type``; None if unparseable.

    >>> parse_answers(["<answer>Yes</answer>", "<answer>maybe</answer>", "no tags"])
    [True, None, None]
    """
    parse, _ = answer_spec(answer_type)
    return [parse(extract_answer(completion)) for completion in completions]  # the parsers map None to None


# --------------------------------------------------------------------------------------------- verification matrix
def _verification_matrix(answers_x, answers_x2, relation, verifier) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NumPy version of :func:`verification_matrix` (float64 ``V``). The verifier runs once per pair of *distinct*
    answers (at most 4 times for booleans), not once per cell."""
    valid_x = np.array([a is not None for a in answers_x], dtype=bool)  # [K0]
    valid_x2 = np.array([a is not None for a in answers_x2], dtype=bool)  # [K1]
    V = np.zeros((len(answers_x), len(answers_x2)))  # [K0, K1]
    if valid_x.any() and valid_x2.any():
        keys_x, keys_x2 = {}, {}
        code_x = [keys_x.setdefault(a, len(keys_x)) for a in answers_x if a is not None]  # [n0]
        code_x2 = [keys_x2.setdefault(a, len(keys_x2)) for a in answers_x2 if a is not None]  # [n1]
        table = np.array([[verifier(a, b, relation) for b in keys_x2] for a in keys_x])  # [u0, u1], cast into V
        V[np.ix_(valid_x, valid_x2)] = table[np.ix_(code_x, code_x2)]
    return V, valid_x, valid_x2


def verification_matrix(
    answers_x: Sequence[Answer | None],
    answers_x2: Sequence[Answer | None],
    relation: str,
    verifier: Verifier = bool_verifier,
) -> tuple[Tensor, Tensor, Tensor]:
    """Verifier scores of every cross pair of parsed answers.

    Args:
        answers_x: K0 parsed answers to the original prompt (None: unparseable).
        answers_x2: K1 parsed answers to the twin.
        relation: the twin's answer effect, ``identity`` or ``negation``.
        verifier: ``verifier(y, y_twin, relation) -> float`` in [0, 1].

    Returns:
        ``(V, valid_x, valid_x2)``: ``V`` ``[K0, K1]`` float32 with ``V_ij = verifier(y_i, y'_j, relation)`` where both
        answers are valid and 0 elsewhere; ``valid_x`` ``[K0]`` and ``valid_x2`` ``[K1]`` bool.

    >>> V, valid_x, valid_x2 = verification_matrix([True, False, None], [False, True], "negation")
    >>> V
    tensor([[1., 0.],
            [0., 1.],
            [0., 0.]])
    >>> valid_x, valid_x2
    (tensor([ True,  True, False]), tensor([True, True]))
    """
    V, valid_x, valid_x2 = _verification_matrix(answers_x, answers_x2, relation, verifier)
    return torch.from_numpy(V).float(), torch.from_numpy(valid_x), torch.from_numpy(valid_x2)


# ------------------------------------------------------------------------------------------------------- couplings
def minimal_coupling(V: np.ndarray) -> np.ndarray:
    """The coupling ``gamma`` ``[n0, n1]`` with marginals ``1/n0``, ``1/n1`` that minimises ``sum gamma_ij V_ij``.

    Square: the optimal permutation (``linear_sum_assignment``) scaled by ``1/n``. Otherwise: POT's network simplex,
    ``ot.emd``, whose optimal plan may split a completion's mass over several partners.
    """
    n0, n1 = V.shape
    if n0 == n1:
        from scipy.optimize import linear_sum_assignment  # imported on first use: it takes ~0.4 s

        rows, cols = linear_sum_assignment(V)
        gamma = np.zeros((n0, n1))
        gamma[rows, cols] = 1.0 / n0
        return gamma
    import ot  # imported on first use: it takes ~0.6 s

    return ot.emd([], [], V)  # empty weights: uniform marginals


def northwest_corner_coupling(n0: int, n1: int) -> np.ndarray:
    """The north-west-corner coupling ``[n0, n1]`` with marginals ``1/n0``, ``1/n1``: mass flows in index order;
    the identity permutation (scaled by ``1/n``) when ``n0 == n1``. Exact: built in units of ``1/(n0 n1)``."""
    gamma = np.zeros((n0, n1))
    i = j = 0
    row_left, col_left = n1, n0  # units of 1 / (n0 * n1)
    # each step empties a row, a column, or both at once (at the gcd(n0, n1) multiples of lcm(n0, n1) units of mass):
    # n0 + n1 - gcd steps in all, so the loop is bounded by construction
    for _ in range(n0 + n1 - math.gcd(n0, n1)):
        mass = min(row_left, col_left)
        gamma[i, j] = mass
        row_left, col_left = row_left - mass, col_left - mass
        if row_left == 0:
            i, row_left = i + 1, n1
        if col_left == 0:
            j, col_left = j + 1, n0
    return gamma / (n0 * n1)


def check_pairing(pairing: str) -> None:
    if pairing not in PAIRINGS:
        raise ValueError(f"unknown pairing {pairing!r}; expected one of {PAIRINGS}")


def _coupling(V: np.ndarray, pairing: str, generator: torch.Generator | None) -> np.ndarray:
    n0, n1 = V.shape
    if pairing == "minimal":
        return minimal_coupling(V)
    if pairing == "one_to_all":
        return np.full((n0, n1), 1.0 / (n0 * n1))
    gamma = northwest_corner_coupling(n0, n1)  # "random"
    if generator is None:
        return gamma
    order = torch.randperm(n1, generator=generator).numpy()  # slot j of the corner coupling -> twin completion
    permuted = np.empty_like(gamma)
    permuted[:, order] = gamma
    return permuted


def _pair(V, valid_x, valid_x2, pairing, generator=None) -> tuple[np.ndarray, np.ndarray]:
    """NumPy version of :func:`pair_rewards` (float64 ``[K0]``, ``[K1]``)."""
    check_pairing(pairing)
    r, r2 = np.zeros(V.shape[0]), np.zeros(V.shape[1])
    n0, n1 = int(valid_x.sum()), int(valid_x2.sum())
    if n0 == 0 or n1 == 0:
        return r, r2
    V_valid = V[np.ix_(valid_x, valid_x2)]  # [n0, n1]
    weighted = _coupling(V_valid, pairing, generator) * V_valid  # [n0, n1]
    r[valid_x] = np.clip(n0 * weighted.sum(axis=1), 0.0, 1.0)  # transport-weighted mean over partners
    r2[valid_x2] = np.clip(n1 * weighted.sum(axis=0), 0.0, 1.0)
    return r, r2


def _mask(valid: Tensor | None, size: int) -> np.ndarray:
    return np.ones(size, dtype=bool) if valid is None else torch.as_tensor(valid).cpu().numpy().astype(bool)


def pair_rewards(
    V: Tensor,
    valid_x: Tensor | None = None,
    valid_x2: Tensor | None = None,
    pairing: Pairing = "minimal",
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-completion rewards of two paired groups from their verification matrix (see the module docstring).

    Args:
        V: ``[K0, K1]`` verifier scores in [0, 1].
        valid_x: ``[K0]`` bool, the parseable completions of ``x`` (default: all); the others get 0.
        valid_x2: ``[K1]`` bool, likewise for the twin.
        pairing: ``minimal`` (OT-GRPO), ``one_to_all`` or ``random``.
        generator: for ``random`` only: draws the permutation; None pairs in generation order (``r_i = V_ii``).

    Returns:
        ``(r, r2)``: ``[K0]`` and ``[K1]`` float32 rewards in [0, 1].

    >>> V = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    >>> pair_rewards(V, pairing="minimal")  # sigma* = (1, 0): total 1 instead of 2
    (tensor([0., 1.]), tensor([1., 0.]))
    >>> pair_rewards(V, pairing="random")  # generation order: r_i = V_ii
    (tensor([1., 1.]), tensor([1., 1.]))
    >>> pair_rewards(V, pairing="one_to_all")
    (tensor([0.5000, 1.0000]), tensor([1.0000, 0.5000]))
    """
    V_np = torch.as_tensor(V, dtype=torch.float64).cpu().numpy()
    r, r2 = _pair(V_np, _mask(valid_x, V_np.shape[0]), _mask(valid_x2, V_np.shape[1]), pairing, generator)
    return torch.from_numpy(r).float(), torch.from_numpy(r2).float()


def random_pairing(V, valid_x=None, valid_x2=None, generator=None) -> tuple[Tensor, Tensor]:
    """:func:`pair_rewards` with ``pairing="random"``: ``r_i = V_{i, pi(i)}``, ``pi`` the identity without a
    generator."""
    return pair_rewards(V, valid_x, valid_x2, "random", generator)


def one_to_all_pairing(V, valid_x=None, valid_x2=None) -> tuple[Tensor, Tensor]:
    """:func:`pair_rewards` with ``pairing="one_to_all"``: ``r_i = mean_j V_ij`` over the valid j."""
    return pair_rewards(V, valid_x, valid_x2, "one_to_all")


def minimal_pairing(V, valid_x=None, valid_x2=None) -> tuple[Tensor, Tensor]:
    """:func:`pair_rewards` with ``pairing="minimal"`` (OT-GRPO): ``r_i = V_{i, sigma*(i)}``, ``sigma*`` minimising the
    total consistency; transport-weighted when the valid counts differ."""
    return pair_rewards(V, valid_x, valid_x2)  # pairing="minimal" is the default


# ---------------------------------------------------------------------------------------------- batched reward
def consistency_rewards(
    completions: Sequence[str],
    samples: Sequence[VisualSample],
    answer_type: AnswerType = "bool",
    pairing: Pairing = "minimal",
    distance_tolerance: float = 0.1,
    generator: torch.Generator | None = None,
    group_size: int | None = None,
) -> Tensor:
    """``[N]`` float32 consistency rewards of a whole step's batch (the functional twin of :class:`ConsistencyReward`).

    ``samples`` is laid out as the trainer lays it out: each prompt's sample repeated K times (``group_size``; without
    it the groups are found as runs of the same sample object), a prompt's group followed by its twin's (see
    :func:`~app.rewards.groups.pair_groups`, which raises ``ValueError`` on any other layout). Labels
    (``sample.answer``) are never read.

    >>> from app.types import VisualSample
    >>> x = VisualSample(images=[], question="Is red left of blue?", task="t", meta={"pair_id": 0})
    >>> negation = {"pair_id": 0, "relation": "negation"}
    >>> twin = VisualSample(images=[], question="Is blue left of red?", task="t", meta=negation)
    >>> answers = ["<answer>yes</answer>", "<answer>no</answer>", "<answer>no</answer>", "<answer>no</answer>"]
    >>> consistency_rewards(answers, [x, x, twin, twin])  # the lone "yes" of x is matched with a "no": consistent
    tensor([1., 0., 1., 0.])
    """
    if len(completions) != len(samples):
        raise ValueError(f"got {len(completions)} completions but {len(samples)} samples")
    check_pairing(pairing)
    if answer_type != FROM_META:
        answer_spec(answer_type, distance_tolerance)
    pairs = pair_groups(samples, group_size)
    out = np.zeros(len(completions))  # [N]
    for rows_x, rows_x2, relation in pairs:
        kind = _pair_answer_type(samples, rows_x) if answer_type == FROM_META else answer_type
        parse, verifier = answer_spec(kind, distance_tolerance)
        if relation not in _RELATIONS_OF[kind]:
            raise ValueError(
                f"answer_type {kind!r} supports relations {_RELATIONS_OF[kind]}, but the twin at rows "
                f"{rows_x2.start}:{rows_x2.stop} has relation {relation!r}"
            )
        answers_x = parse_answers(completions[rows_x], kind)
        answers_x2 = parse_answers(completions[rows_x2], kind)
        V, valid_x, valid_x2 = _verification_matrix(answers_x, answers_x2, relation, verifier)
        out[rows_x], out[rows_x2] = _pair(V, valid_x, valid_x2, pairing, generator)
    return torch.from_numpy(out).float()


def _pair_answer_type(samples: Sequence[VisualSample], rows: slice) -> str:
    kind = samples[rows.start].meta.get("answer_type")
    if kind not in _PARSERS:
        raise ValueError(
            f"answer_type {FROM_META!r} needs meta['answer_type'] in {tuple(_PARSERS)} on every prompt; rows "
            f"{rows.start}:{rows.stop} (task {samples[rows.start].task!r}) have {kind!r}"
        )
    return kind


def batch_generator(seed: int, completions: Sequence[str], samples: Sequence[VisualSample]) -> torch.Generator:
    """A generator seeded with ``seed`` and a digest (BLAKE2b, stable across processes and runs) of the batch's
    completions and questions: the random pairing of a batch depends on the batch alone, not on what was scored
    before it or where."""
    digest = hashlib.blake2b(str(seed).encode(), digest_size=8)
    for text in [*completions, *(sample.question for sample in samples)]:
        text = text if isinstance(text, str) else repr(text)  # completions are untrusted: anything may arrive
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return torch.Generator().manual_seed(int.from_bytes(digest.digest(), "little") & (2**63 - 1))


class ConsistencyReward(RewardComponent):
    """Label-free consistency of a prompt's completions with its augmented twin's (see :func:`consistency_rewards`);
    name ``"consistency"``, scope ``"group_pair"``.

    Never reads ``sample.answer``: it trains on unlabeled data. Raises ``ValueError`` when the batch is not laid out in
    pairs of groups (a data bug); malformed completions score 0.

    Args:
        answer_type: ``bool`` (identity and negation transforms), ``count`` (exact equality) or ``distance``
            (relative tolerance); the last two accept only invariant (``identity``) transforms. ``from_meta``: each
            pair's type is its prompt's ``meta["answer_type"]`` (mixed-task data such as ``app.tasks.spatial``).
        pairing: ``minimal`` (OT-GRPO, the paper's choice), ``one_to_all`` or ``random``.
        distance_tolerance: relative tolerance of ``distance`` answers.
        seed: for ``random`` pairing: the permutations of a batch are drawn from a generator seeded with this seed
            and a digest of the batch (:func:`batch_generator`), so a batch gets the same pairing whichever worker
            scores it (inline, thread or process), in whatever order, and after a resume: there is no generator state
            to carry back or checkpoint. None pairs in generation order.
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"consistency"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).

    Example:
        >>> from app.types import VisualSample
        >>> x = VisualSample(images=[], question="Is red left of blue?", task="t", meta={"pair_id": 0})
        >>> twin = VisualSample(images=[], question="Is red left of blue?", task="t",
        ...                     meta={"pair_id": 0, "relation": "identity"})
        >>> reward = ConsistencyReward()
        >>> reward.score(["<answer>yes</answer>", "<answer>no</answer>", "<answer>no</answer>", "garbage"],
        ...              [x, x, twin, twin])  # the twin's one valid "no" is split between "yes" and "no"
        tensor([0.0000, 1.0000, 0.5000, 0.0000])
    """

    completion_kinds = ("text",)

    scope = "group_pair"
    value_range = (0.0, 1.0)

    def __init__(
        self,
        answer_type: AnswerType = "bool",
        pairing: Pairing = "minimal",
        distance_tolerance: float = 0.1,
        seed: int | None = None,
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        if answer_type != FROM_META:
            answer_spec(answer_type, distance_tolerance)  # validates both
        elif not (math.isfinite(distance_tolerance) and distance_tolerance >= 0):
            raise ValueError(f"distance_tolerance must be a finite number >= 0, got {distance_tolerance}")
        check_pairing(pairing)
        self.answer_type = answer_type
        self.pairing = pairing
        self.distance_tolerance = distance_tolerance
        self.seed = seed

    def score(
        self, completions: Sequence[str], samples: Sequence[VisualSample], group_size: int | None = None
    ) -> Tensor:
        generator = None if self.seed is None else batch_generator(self.seed, completions, samples)
        return consistency_rewards(
            completions, samples, self.answer_type, self.pairing, self.distance_tolerance, generator, group_size
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, answer_type={self.answer_type!r}, pairing={self.pairing!r}"
