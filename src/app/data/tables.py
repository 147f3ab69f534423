"""A data file's rows, read with the ``datasets`` library: :func:`load_table` opens JSON, JSONL, parquet, CSV, text
files and saved tables (local files only, memory-mapped), :class:`TableRows` hands their rows out as plain values with
images left undecoded, so that :mod:`app.data.files` checks each image's header before anything decodes it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from app.errors import ConfigError

_BATCH_ROWS = 256  # rows taken from the Arrow table at a time while streaming


def load_table(path: str | Path):
    """The rows of ``path`` as a ``datasets.Dataset`` (memory-mapped), chosen by its suffix: ``.json`` / ``.jsonl``,
    ``.parquet``, ``.csv``, ``.txt`` (one prompt a line, blank lines dropped, column ``prompt``), or a folder written by
    ``Dataset.save_to_disk``. Local files only.

    Raises:
        FileNotFoundError: naming the path, when it does not exist.
        ConfigError: naming the file and, as the parser reports it, the row, when the file cannot be parsed.
        ValueError: for an unknown suffix or a folder that holds no single saved table.
    """
    import datasets

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    if path.is_dir():
        if not (path / "dataset_info.json").exists():
            raise ValueError(f"{str(path)!r} is a folder but no saved datasets table (no dataset_info.json)")
        table = datasets.load_from_disk(str(path))
        if isinstance(table, datasets.DatasetDict):
            raise ValueError(f"{str(path)!r} holds several splits {list(table)}; name one split's folder")
        return table
    suffix = path.suffix.lower()
    readers = {
        ".json": datasets.Dataset.from_json,
        ".jsonl": datasets.Dataset.from_json,
        ".parquet": datasets.Dataset.from_parquet,
        ".csv": datasets.Dataset.from_csv,
        ".txt": datasets.Dataset.from_text,
    }
    if suffix not in readers:
        raise ValueError(f"{str(path)!r}: unknown data file type {suffix!r}; known: {sorted(readers)} or a folder")
    try:
        table = readers[suffix](str(path))
    except datasets.exceptions.DatasetGenerationError as err:  # the parser's own message names the row
        raise ConfigError(f"{str(path)!r}: cannot read it: {err.__cause__ or err}") from None
    if suffix == ".txt":
        table = table.filter(lambda row: bool(row["text"].strip())).flatten_indices().rename_column("text", "prompt")
    return table


def _undecoded(feature: Any) -> Any:
    """``feature`` with every ``Image`` in it left undecoded (``{"bytes", "path"}``): the reader checks headers
    first."""
    import datasets

    if isinstance(feature, datasets.Image):
        return datasets.Image(decode=False)
    if isinstance(feature, dict):
        return {name: _undecoded(inner) for name, inner in feature.items()}
    if dataclasses.is_dataclass(feature) and hasattr(feature, "feature"):  # List, LargeList
        return dataclasses.replace(feature, feature=_undecoded(feature.feature))
    return feature


class TableRows:
    """A table's rows as plain Python values, by index or in order: ``Json`` columns (the ``datasets`` type of a JSON
    column whose rows hold different types) decoded, ``Image`` values left as ``{"bytes": ..., "path": ...}``."""

    def __init__(self, table) -> None:
        import datasets

        self.table = table
        self.features = datasets.Features({name: _undecoded(f) for name, f in table.features.items()})

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.features.decode_example(self.table.data.slice(index, 1).to_pylist()[0])

    def iter(self, indices: Sequence[int] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(row index, row)`` in order (only ``indices``, if given), ``_BATCH_ROWS`` rows read at a time."""
        if indices is not None:
            for index in indices:
                yield index, self[index]
            return
        start = 0
        for batch in self.table.data.to_batches(max_chunksize=_BATCH_ROWS):
            for offset, row in enumerate(batch.to_pylist()):
                yield start + offset, self.features.decode_example(row)
            start += batch.num_rows
