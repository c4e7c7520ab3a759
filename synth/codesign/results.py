"""The sweep's results file: CSV, one row per point, appended as points finish.

Append-only, so an interrupted sweep loses at most the chunks in flight; a sweep started again
on the same file reads the keys already there and skips those points (failed ones included:
their error is their result). Floats are written with repr, so a row read back is the row
written, bit for bit. Parquet (pyarrow, the codesign-parquet extra) is written from the CSV at the
end, sorted by the grid's order.
"""

from __future__ import annotations

import csv
from pathlib import Path

from synth.codesign.errors import MissingExtraError
from synth.codesign.run import RESULT_COLUMNS
from synth.errors import UsageError

FLOATS = ("step_s", "memory_bytes", "mfu", "tokens_per_s", "price_per_device_hour", "cost_per_token",
          "time_to_train_s", "cost_to_train", "cpu_s")
INTEGERS = ("index", "devices", "memo_hits", "memo_misses")


def columns_for(axis_names: tuple[str, ...]) -> tuple[str, ...]:
    return ("key", "index", *axis_names, *RESULT_COLUMNS)


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def finished_keys(path: Path, columns: tuple[str, ...]) -> set[str]:
    """The keys of the complete rows of a results file (none if it does not exist); a file with
    other columns is another grid's, refused."""
    finished: set[str] = set()
    if not path.exists() or path.stat().st_size == 0:
        return finished
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = tuple(next(reader, ()))
        if header != columns:
            raise UsageError(f"results file {path} holds another grid's columns; give the grid that wrote it, or "
                             f"another results file")
        for row in reader:
            if len(row) == len(columns):  # a row cut short by an interruption is planned again
                finished.add(row[0])
    return finished


class ResultsFile:
    """The CSV results file of one grid: `finished` holds the keys already in it."""

    def __init__(self, path: str | Path, columns: tuple[str, ...]):
        self.path = Path(path)
        self.columns = columns
        self.finished = finished_keys(self.path, columns)
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as raw:
                raw.seek(-1, 2)
                cut = raw.read(1) != b"\n"
            self._handle = open(self.path, "a", newline="", encoding="utf-8")
            if cut:  # the last row was cut short: it stays incomplete on a line of its own
                self._handle.write("\r\n")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "w", newline="", encoding="utf-8")
            csv.writer(self._handle).writerow(columns)
            self._handle.flush()
        self._writer = csv.writer(self._handle)

    def append(self, rows: list[dict]) -> None:
        for row in rows:
            self._writer.writerow([_text(row.get(column)) for column in self.columns])
            self.finished.add(row["key"])
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_rows(path: str | Path) -> list[dict]:
    """Every complete row of a results file, typed (numbers as numbers, empty as None), in the
    grid's order; the last row of a key wins."""
    rows: dict[str, dict] = {}
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        for raw in reader:
            if None in raw or any(value is None for value in raw.values()):
                continue  # cut short
            rows[raw["key"]] = {name: _typed(name, value) for name, value in raw.items()}
    return sorted(rows.values(), key=lambda row: row["index"])


def _typed(name: str, value: str):
    if value == "":
        return None
    if name in FLOATS:
        return float(value)
    if name in INTEGERS:
        return int(value)
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        return float(value) if any(c in value for c in ".e") and value[0].isdigit() else value
    except ValueError:
        return value


def write_parquet(rows: list[dict], columns: tuple[str, ...], path: str | Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtraError("Parquet output needs pyarrow, which is not installed: install the codesign-parquet "
                                "extra (pip install 'hierarchical-collectives-synth[codesign-parquet]')",
                                extra="codesign-parquet") from None
    table = {column: [row.get(column) for row in rows] for column in columns}
    for column, values in table.items():  # a column of mixed numbers and text is kept as text
        kinds = {type(value) for value in values if value is not None}
        if len(kinds) > 1 and str in kinds:
            table[column] = [None if value is None else str(value) for value in values]
    pq.write_table(pa.table(table), str(path))
