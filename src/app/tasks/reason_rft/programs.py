"""The programs behind the Reason-RFT questions (Reason-RFT, docs/algorithms.md#papers): counting's operations on a
scene and their execution, and transformation's atomic steps.

The generators (:mod:`~app.tasks.reason_rft.counting`, :mod:`~app.tasks.reason_rft.transformation`) draw them and the
chains of thought (:mod:`~app.tasks.reason_rft.cot`) narrate them; both import them from here, so neither suite and
the chain-of-thought writer import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

_PLURAL = {"cube": "cubes", "sphere": "spheres", "cylinder": "cylinders", "cone": "cones", "pyramid": "pyramids"}


@dataclass(frozen=True)
class Filter:
    """A set of objects by attribute values; an attribute left None matches anything."""

    size: str | None = None
    color: str | None = None
    material: str | None = None
    shape: str | None = None

    def items(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def matches(self, item: Mapping[str, str]) -> bool | None:
        """Whether an object with attributes ``item`` is in the set; None when ``item`` leaves a needed one unsaid."""
        unknown = False
        for name, value in self.items().items():
            if name not in item:
                unknown = True
            elif item[name] != value:
                return False
        return None if unknown else True

    def words(self, plural: bool = True) -> str:
        """``"large red cubes"``, ``"small sphere"``, ``"objects"``."""
        noun = self.shape or "object"
        adjectives = [v for n, v in self.items().items() if n != "shape"]
        return " ".join([*adjectives, _PLURAL.get(noun, noun + "s") if plural else noun])

    def phrase(self, count: int | None = None) -> str:
        """:meth:`words` after ``count`` when given: ``"2 red cylinders"``, ``"1 small sphere"``."""
        return self.words() if count is None else f"{count} {self.words(count != 1)}"


@dataclass(frozen=True)
class Operation:
    """``subtract`` every object in ``target``, or ``add`` ``count`` objects described by ``target``."""

    kind: str
    target: Filter
    count: int = 0

    def sentence(self) -> str:
        if self.kind == "subtract":
            return f"Subtract all {self.target.phrase()}."
        return f"Add {self.target.phrase(self.count)}."


@dataclass(frozen=True)
class CountingProgram:
    """Operations applied in order, then how many objects of ``query`` there are."""

    operations: tuple[Operation, ...]
    query: Filter
    question_type: str

    def question(self) -> str:
        verb = "are left" if self.operations[-1].kind == "subtract" else "are there"
        return " ".join(op.sentence() for op in self.operations) + f" How many {self.query.phrase()} {verb}?"


@dataclass(frozen=True)
class StepResult:
    """One operation's effect: objects it removed (or added) and how many objects there are after it."""

    operation: Operation
    affected: int
    total: int


@dataclass(frozen=True)
class ProgramResult:
    """The scene's object count, each step's effect and the answer, split into scene objects and added ones."""

    initial: int
    steps: tuple[StepResult, ...]
    query_from_scene: int
    query_from_added: int

    @property
    def answer(self) -> int:
        return self.query_from_scene + self.query_from_added


class AmbiguousProgram(ValueError):
    """A filter or the query cannot be decided for an added object that leaves an attribute unsaid."""


def _decide(target: Filter, item: Mapping[str, str]) -> bool:
    decided = target.matches(item)
    if decided is None:
        raise AmbiguousProgram(f"{target.phrase()} is undecided for an added object described by {dict(item)}")
    return decided


def execute(objects: list[Mapping[str, str]], program: CountingProgram) -> ProgramResult:
    """Run ``program`` on objects given by their attributes.

    Raises:
        AmbiguousProgram: when a filter or the query cannot be decided for an added object.
    """
    state = [(dict(item), False) for item in objects]  # (attributes, added?)
    steps = []
    for op in program.operations:
        if op.kind == "subtract":
            kept = [entry for entry in state if not _decide(op.target, entry[0])]
            affected, state = len(state) - len(kept), kept
        elif op.kind == "add":
            state = state + [(op.target.items(), True)] * op.count
            affected = op.count
        else:
            raise ValueError(f"unknown operation kind {op.kind!r}; known: add, subtract")
        steps.append(StepResult(op, affected, len(state)))
    in_query = [added for item, added in state if _decide(program.query, item)]
    return ProgramResult(len(objects), tuple(steps), in_query.count(False), in_query.count(True))


@dataclass(frozen=True)
class Step:
    """``function(obj_{index + 1}, value)``; ``index`` counts the initial objects in their numbered order."""

    function: str
    index: int
    value: str

    def text(self) -> str:
        return f"{self.function}(obj_{self.index + 1}, {self.value})"
