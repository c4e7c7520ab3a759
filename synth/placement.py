"""Placements (docs/model.md section 2): parallelism matrices of axis factors per system level.

`M[a][l]` is how many of level l's units axis a spans. Every column multiplies to the level
size and every row to the axis size. Over prime exponents products become sums: per prime, a
placement is a table of non-negative integers with the axes' and levels' exponents as row and
column sums, and user constraints fix cells. The tables are counted first (a listing too long
is refused before it starts), then listed by depth-first search, one table per prime combined.
(A Z3 formula over the same exponents listed them one model at a time, about 10 ms each.)
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from synth.errors import NoSolutionError, UsageError
from synth.names import MAX_DEVICES, Sized, echo, parse_sized_list, product
from synth.topology import Topology

Axis = Sized
# A --placement text longer than this is not a matrix anyone typed.
MAX_MATRIX_CHARS = 4096
# Past this many placements a listing cannot be read (nor priced placement by placement).
MAX_PLACEMENTS = 2000


def parse_axes(text: str) -> tuple[Axis, ...]:
    """`data=8,model=4` (or `8,4`, named a0, a1) into ordered axes."""
    return parse_sized_list(text, "axis", "a")


@dataclass(frozen=True)
class Placement:
    """One parallelism matrix on one system, with the device <-> axis-coordinate maps."""

    level_names: tuple[str, ...]
    level_sizes: tuple[int, ...]
    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    matrix: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        check_matrix(self.matrix, self.level_sizes, self.axis_sizes, self.axis_names, self.level_names)

    @classmethod
    def built(cls, level_names, level_sizes, axis_names, axis_sizes, matrix) -> Placement:
        """A placement of a matrix its maker built by the rules (`placement_matrices`), made
        without checking them again: the planner lists tens of thousands."""
        placement = object.__new__(cls)
        for name, value in (("level_names", level_names), ("level_sizes", level_sizes), ("axis_names", axis_names),
                            ("axis_sizes", axis_sizes), ("matrix", matrix)):
            object.__setattr__(placement, name, value)
        return placement

    @property
    def device_count(self) -> int:
        return product(self.level_sizes)

    def axis_index(self, name: str) -> int:
        if name not in self.axis_names:
            raise UsageError(f"unknown axis {name!r}: the axes are {', '.join(self.axis_names)}")
        return self.axis_names.index(name)

    def to_text(self) -> str:
        """The matrix as compact JSON, the form `--placement` takes."""
        return self._text

    @cached_property
    def _text(self) -> str:  # kept: the planner's ranking keys ask for it thousands of times
        return json.dumps([list(row) for row in self.matrix], separators=(",", ":"))

    @cached_property
    def spans(self) -> dict:
        """The groups' span per level by the axes grouped, filled in by the planner
        (synth/plan/costs.py `factors`), which asks a placement's spans hundreds of thousands
        of times in a plan: kept here, the lookup does not hash the matrix each time."""
        return {}

    @cached_property
    def digits(self) -> np.ndarray:
        """`digits[rank, a, l]` = d_{a,l}: the digit of level coordinate c_l that belongs to axis a."""
        ranks = np.arange(self.device_count, dtype=np.int64)
        coords = np.stack(np.unravel_index(ranks, self.level_sizes), axis=1) if self.level_sizes else ranks[:, None]
        result = np.zeros((self.device_count, len(self.axis_sizes), len(self.level_sizes)), dtype=np.int64)
        for level in range(len(self.level_sizes)):
            radices = [self.matrix[a][level] for a in range(len(self.axis_sizes))]
            split = np.stack(np.unravel_index(coords[:, level], radices), axis=1)
            result[:, :, level] = split
        return result

    @cached_property
    def axis_coordinates(self) -> np.ndarray:
        """`axis_coordinates[rank, a]` = x_a, the device's index along axis a."""
        result = np.zeros((self.device_count, len(self.axis_sizes)), dtype=np.int64)
        for a in range(len(self.axis_sizes)):
            result[:, a] = np.ravel_multi_index(tuple(self.digits[:, a, :].T), self.matrix[a])
        return result

    def rank_of(self, coordinates) -> int:
        """The global rank of the device with these axis coordinates."""
        matches = np.nonzero((self.axis_coordinates == np.asarray(coordinates)).all(axis=1))[0]
        return int(matches[0])

    def group_head(self, axis: str, index: int, length: int) -> list[int]:
        """The first `length` ranks of group `index` of `axis_groups(axis)`, without building them all."""
        a = self.axis_index(axis)
        others = [b for b in range(len(self.axis_sizes)) if b != a]
        outside = np.unravel_index(index, [self.axis_sizes[b] for b in others]) if others else ()
        coordinates = np.zeros((min(length, self.axis_sizes[a]), len(self.axis_sizes)), dtype=np.int64)
        for b, value in zip(others, outside):
            coordinates[:, b] = int(value)
        coordinates[:, a] = np.arange(len(coordinates))
        # rank_of_axis_coordinates for every row at once: each axis's digits per level, then
        # each level's coordinate from the axes' digits, then the rank from the levels'.
        digits = [np.unravel_index(coordinates[:, b], row) for b, row in enumerate(self.matrix)]
        ranks = np.zeros(len(coordinates), dtype=np.int64)
        for level, size in enumerate(self.level_sizes):
            coordinate = np.zeros(len(coordinates), dtype=np.int64)
            for b, row in enumerate(self.matrix):
                coordinate = coordinate * row[level] + digits[b][level]
            ranks = ranks * size + coordinate
        return [int(rank) for rank in ranks]

    def axis_groups(self, axis: str) -> list[list[int]]:
        """For one axis: the rank lists of devices that agree on every other axis, each ordered
        by the axis index, the lists ordered by the other axes' coordinates (row-major)."""
        return self.groups_over((axis,))

    def groups_over(self, axes: tuple[str, ...]) -> list[list[int]]:
        """Devices that agree on every axis outside `axes`, each list ordered row-major over `axes`."""
        inside = [self.axis_index(name) for name in axes]
        outside = [a for a in range(len(self.axis_sizes)) if a not in inside]
        coords = self.axis_coordinates
        key_outside = _row_major(coords[:, outside], [self.axis_sizes[a] for a in outside])
        key_inside = _row_major(coords[:, inside], [self.axis_sizes[a] for a in inside])
        order = np.lexsort((key_inside, key_outside))
        group_size = product(self.axis_sizes[a] for a in inside)
        return [list(map(int, chunk)) for chunk in order.reshape(-1, group_size)]


def _row_major(coords: np.ndarray, sizes: list[int]) -> np.ndarray:
    if not sizes:
        return np.zeros(coords.shape[0], dtype=np.int64)
    return np.ravel_multi_index(tuple(coords.T), sizes)


def check_matrix(matrix, level_sizes, axis_sizes, axis_names=None, level_names=None) -> None:
    """docs/model.md section 2's rules, each violation named with the row or column at fault."""
    if _well_formed(matrix, level_sizes, axis_sizes):  # the planner makes tens of thousands: checked at once
        return
    axis_names = axis_names or [f"a{i}" for i in range(len(axis_sizes))]
    level_names = level_names or [f"l{i}" for i in range(len(level_sizes))]
    if len(matrix) != len(axis_sizes):
        raise UsageError(f"placement has {len(matrix)} rows but there are {len(axis_sizes)} axes ({', '.join(axis_names)}): give one row per axis")
    for a, row in enumerate(matrix):
        if len(row) != len(level_sizes):
            raise UsageError(f"placement row {a} ({axis_names[a]}) has {len(row)} entries but there are {len(level_sizes)} levels ({', '.join(level_names)}): give one column per level")
        for value in row:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"placement entry {echo(value)} in row {a} ({axis_names[a]}) is not a positive integer")
        if product(row) != axis_sizes[a]:
            raise UsageError(f"placement row {a} ({axis_names[a]}) multiplies to {product(row)}, not the axis size {axis_sizes[a]}")
    for level, size in enumerate(level_sizes):
        column = product(matrix[a][level] for a in range(len(axis_sizes)))
        if column != size:
            raise UsageError(f"placement column {level} ({level_names[level]}) multiplies to {column}, not the level size {size}")


def _well_formed(matrix, level_sizes, axis_sizes) -> bool:
    """Whether `check_matrix` would pass the matrix (False: it finds what is wrong)."""
    if not matrix or len(matrix) != len(axis_sizes) or any(len(row) != len(level_sizes) for row in matrix):
        return False
    if not all(type(value) is int and value >= 1 for row in matrix for value in row):
        return False
    return (all(math.prod(row) == size for row, size in zip(matrix, axis_sizes))
            and all(math.prod(column) == size for column, size in zip(zip(*matrix), level_sizes)))


def parse_matrix(text: str) -> tuple[tuple[int, ...], ...]:
    """`[[1,2,2],[2,1,2]]` into a tuple matrix (validated against a system by Placement)."""
    problem = f"{echo(text)} is not a placement matrix: write a JSON list of rows, one per axis, e.g. '[[1,2,2],[2,1,2]]'"
    if not isinstance(text, str) or len(text) > MAX_MATRIX_CHARS:
        raise UsageError(problem)
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError):  # bad JSON, a 5000-digit integer, 5000-deep nesting
        raise UsageError(problem) from None
    if not isinstance(value, list) or not value or not all(isinstance(row, list) and row for row in value):
        raise UsageError(problem)
    for row in value:
        for entry in row:
            if not isinstance(entry, int) or isinstance(entry, bool) or not 1 <= entry <= MAX_DEVICES:
                raise UsageError(f"placement entry {echo(entry)} is not a positive integer of at most {MAX_DEVICES}")
    return tuple(tuple(row) for row in value)


def make_placement(topology: Topology, axes: tuple[Axis, ...], matrix) -> Placement:
    check_axes_fit(topology, axes)
    return Placement(topology.level_names, topology.sizes, tuple(a.name for a in axes), tuple(a.size for a in axes), tuple(tuple(row) for row in matrix))


def check_axes_fit(topology: Topology, axes: tuple[Axis, ...]) -> None:
    total = product(a.size for a in axes)
    if total != topology.device_count:
        spec = ",".join(f"{a.name}={a.size}" for a in axes)
        raise UsageError(
            f"axes {spec} multiply to {total} but {topology.name} has {topology.device_count} devices: the axis sizes must multiply to the device count"
        )


# --- user constraints -------------------------------------------------------------------------


@dataclass(frozen=True)
class Inside:
    """Keep `axis` inside one unit of `level`: the axis never crosses a boundary between two
    units of that level, so its factor is 1 at `level` and at every outer level
    (`Inside("model", "node")`: every model group sits in one node)."""

    axis: str
    level: str

    def __str__(self) -> str:
        return f"{self.axis} inside one {self.level}"


@dataclass(frozen=True)
class Factor:
    """Fix `axis`'s factor at `level` to `value`."""

    axis: str
    level: str
    value: int

    def __str__(self) -> str:
        return f"{self.axis} spans {self.value} {self.level} unit(s)"


Constraint = Inside | Factor

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_INSIDE = re.compile(rf"\s*({_IDENTIFIER})\s*=\s*({_IDENTIFIER})\s*\Z")
_FACTOR = re.compile(rf"\s*({_IDENTIFIER})\s*\.\s*({_IDENTIFIER})\s*=\s*([+-]?[0-9]+)\s*\Z")
MAX_FACTOR_DIGITS = 9


def parse_inside(text: str) -> Inside:
    """`model=node`: the model axis stays inside one node."""
    match = _INSIDE.match(text)
    if not match:
        raise UsageError(f"{echo(text)} is not AXIS=LEVEL; write e.g. model=node")
    return Inside(match[1], match[2])


def parse_factor(text: str) -> Factor:
    """`model.gpu=4`: the model axis spans 4 units of level gpu."""
    match = _FACTOR.match(text)
    if not match:
        raise UsageError(f"{echo(text)} is not AXIS.LEVEL=N; write e.g. model.gpu=4")
    digits = match[3].lstrip("+-")
    if len(digits) > MAX_FACTOR_DIGITS:
        raise UsageError(f"{echo(text)}: the factor has {len(digits)} digits; a factor divides a level size, "
                         f"so it has at most {MAX_FACTOR_DIGITS}")
    return Factor(match[1], match[2], int(match[3]))


# --- enumeration ----------------------------------------------------------------------------------


def _prime_factors(n: int) -> dict[int, int]:
    """Trial division: only ever called on level and axis sizes (at most MAX_DEVICES)."""
    factors, p = {}, 2
    while p * p <= n:
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
        p += 1
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def enumerate_placements(topology: Topology, axes: tuple[Axis, ...], constraints=()) -> list[Placement]:
    """Every parallelism matrix satisfying docs/model.md section 2 and the constraints, sorted
    (lexicographically by matrix) so every run lists them in one order."""
    return list(generate_placements(topology, axes, constraints))


def generate_placements(topology: Topology, axes: tuple[Axis, ...], constraints=()) -> Iterator[Placement]:
    """`enumerate_placements` one at a time: the matrices are found (and sorted) first, each
    Placement, with its per-device arrays, is made only when the caller gets to it."""
    axis_names = tuple(a.name for a in axes)
    axis_sizes = tuple(a.size for a in axes)
    for matrix in placement_matrices(topology, axes, constraints):
        yield Placement.built(topology.level_names, topology.sizes, axis_names, axis_sizes, matrix)


def placement_matrices(topology: Topology, axes: tuple[Axis, ...], constraints=()) -> list[tuple[tuple[int, ...], ...]]:
    """The sorted matrices of every placement satisfying the constraints, counted first (past
    MAX_PLACEMENTS refused before any is listed), then listed by `matching_matrices`."""
    if count_matching(topology, axes, constraints, MAX_PLACEMENTS) > MAX_PLACEMENTS:
        raise _too_many(topology, axes, constraints)
    results = list(sorted_matrices(topology, axes, constraints))
    if not results:
        raise _none_fit(topology, constraints)
    return results


def listed_placements(topology: Topology, axes: tuple[Axis, ...], constraints=()) -> list[Placement]:
    """The planner's listing (the name its estimate's units count): `enumerate_placements`, which
    now lists from the prime-exponent tables (`matching_matrices`) without Z3."""
    return enumerate_placements(topology, axes, constraints)


def _too_many(topology: Topology, axes: tuple[Axis, ...], constraints) -> UsageError:
    shown = "; ".join(str(c) for c in constraints)
    return UsageError(f"more than {MAX_PLACEMENTS} placements of {','.join(f'{a.name}={a.size}' for a in axes)} on "
                      f"{topology.name}{' with ' + shown if shown else ''}: too many to list; fix some factors or "
                      f"keep axes inside levels to narrow them")


def _none_fit(topology: Topology, constraints) -> NoSolutionError:
    described = "; ".join(str(c) for c in constraints)
    return NoSolutionError(f"no placement of these axes on {topology.name} satisfies the constraints ({described}): "
                           f"relax one")


def count_placements(level_sizes, axis_sizes, fixed: dict[tuple[int, int, int], int], limit: int) -> int:
    """How many placements there are (at most limit + 1: counting stops there), without Z3:
    per prime, the tables of exponents with the axes' and levels' sums and the `fixed`
    entries ((prime, axis, level) -> exponent); placements are one table per prime."""
    primes = sorted(set().union(*(_prime_factors(n) for n in tuple(level_sizes) + tuple(axis_sizes))))
    total = 1
    for p in primes:
        rows = [_prime_factors(size).get(p, 0) for size in axis_sizes]
        columns = [_prime_factors(size).get(p, 0) for size in level_sizes]
        cells = {(a, l): value for (q, a, l), value in fixed.items() if q == p}
        total *= _count_tables(rows, columns, cells, limit // total + 1)
        if total == 0 or total > limit:
            return total
    return total


def _count_tables(rows: list[int], columns: list[int], fixed: dict[tuple[int, int], int], limit: int) -> int:
    """Non-negative integer tables with these row and column sums and fixed cells (`_tables`'
    count), up to limit + 1: the same depth-first choices, each (cell, what the row and the
    columns still need) counted once, not every table walked."""
    n_rows, n_columns = len(rows), len(columns)

    @lru_cache(maxsize=None)
    def count(a: int, l: int, left_in_row: int, left_in_column: tuple[int, ...]) -> int:
        if l == n_columns:
            if left_in_row:
                return 0
            if a + 1 == n_rows:
                return 0 if any(left_in_column) else 1
            return count(a + 1, 0, rows[a + 1], left_in_column)
        total = 0
        for value in _cell_values(a, l, left_in_row, left_in_column[l], fixed, a + 1 == n_rows):
            after = left_in_column[:l] + (left_in_column[l] - value,) + left_in_column[l + 1:]
            total += count(a, l + 1, left_in_row - value, after)
        return total

    return min(count(0, 0, rows[0], tuple(columns)), limit + 1) if n_rows else 0


def _cell_values(a: int, l: int, left_in_row: int, left_in_column: int, fixed: dict[tuple[int, int], int],
                 last_row: bool):
    """What cell (a, l) of a table may hold, in the walk's order: its fixed value, what the
    column still needs in the last row, else anything up to what the row and column still need."""
    if (a, l) in fixed:
        value = fixed[a, l]
    elif last_row:
        value = left_in_column  # the last row takes what the column still needs
    else:
        return range(min(left_in_row, left_in_column) + 1)
    return (value,) if 0 <= value <= left_in_row and value <= left_in_column else ()


def _tables(rows: list[int], columns: list[int], fixed: dict[tuple[int, int], int]) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Every non-negative integer table with these row and column sums and fixed cells, by
    depth-first search (the last row takes what each column still needs)."""
    n_rows, n_columns = len(rows), len(columns)
    left_in_column = list(columns)
    table = [[0] * n_columns for _ in rows]

    def fill(a: int, l: int, left_in_row: int):
        if l == n_columns:
            if left_in_row:
                return
            if a + 1 == n_rows:
                if not any(left_in_column):
                    yield tuple(tuple(row) for row in table)
                return
            yield from fill(a + 1, 0, rows[a + 1])
            return
        for value in _cell_values(a, l, left_in_row, left_in_column[l], fixed, a + 1 == n_rows):
            left_in_column[l] -= value
            table[a][l] = value
            yield from fill(a, l + 1, left_in_row - value)
            left_in_column[l] += value

    if n_rows:
        yield from fill(0, 0, rows[0])


def matching_matrices(topology: Topology, axes: tuple[Axis, ...], constraints=()) -> Iterator[tuple[tuple[int, ...], ...]]:
    """The matrices of every placement satisfying the constraints, without Z3 (unsorted; for
    counting what placements share, e.g. the planner's estimate): one exponent table per
    prime, combined. Check the count first (count_matching): this lists them all."""
    check_axes_fit(topology, axes)
    fixed = constraint_cells(topology, axes, constraints)
    return _matching(topology.sizes, tuple(a.size for a in axes), fixed)


def sorted_matrices(topology: Topology, axes: tuple[Axis, ...], constraints=()) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """`matching_matrices` sorted and without repeats, kept for the last 1,024 (sizes, constraint
    cells): the planner's estimate and its search list the same placements, once."""
    check_axes_fit(topology, axes)
    fixed = constraint_cells(topology, axes, constraints)
    return _sorted_matching(topology.sizes, tuple(a.size for a in axes), tuple(sorted(fixed.items())))


@lru_cache(maxsize=1024)
def _sorted_matching(level_sizes: tuple[int, ...], axis_sizes: tuple[int, ...], fixed: tuple) -> tuple:
    return tuple(sorted(set(_matching(level_sizes, axis_sizes, dict(fixed)))))


def _matching(level_sizes: tuple[int, ...], axis_sizes: tuple[int, ...], fixed: dict
              ) -> Iterator[tuple[tuple[int, ...], ...]]:
    primes = sorted(set().union(*(_prime_factors(n) for n in level_sizes + axis_sizes)))
    per_prime = []
    for p in primes:
        rows = [_prime_factors(size).get(p, 0) for size in axis_sizes]
        columns = [_prime_factors(size).get(p, 0) for size in level_sizes]
        per_prime.append(list(_tables(rows, columns, {(a, l): v for (q, a, l), v in fixed.items() if q == p})))
    # each table's cells as powers of its prime, once; a placement's cell multiplies them
    powered = [[tuple(tuple(p ** exponent for exponent in row) for row in table) for table in tables]
               for p, tables in zip(primes, per_prime)]
    if len(powered) == 1:
        yield from powered[0]
        return
    for choice in itertools.product(*powered):
        yield tuple(tuple(product(table[a][l] for table in choice) for l in range(len(level_sizes)))
                    for a in range(len(axis_sizes)))


def constraint_cells(topology: Topology, axes: tuple[Axis, ...], constraints) -> dict[tuple[int, int, int], int]:
    """What the constraints fix: (prime, axis, level) -> the exponent of that prime in the
    axis's factor at that level (-1 where two constraints disagree, so nothing fits)."""
    primes = sorted(set().union(*(_prime_factors(n) for n in topology.sizes + tuple(a.size for a in axes))))
    fixed: dict[tuple[int, int, int], int] = {}
    for constraint in constraints:
        for key, value in _constraint_cells(constraint, topology, axes, primes).items():
            fixed[key] = value if fixed.get(key, value) == value else -1
    return fixed


def count_matching(topology: Topology, axes: tuple[Axis, ...], constraints=(), limit: int = MAX_PLACEMENTS) -> int:
    """How many placements satisfy the constraints (counting stops past `limit`)."""
    check_axes_fit(topology, axes)
    fixed = constraint_cells(topology, axes, constraints)
    return _counted(topology.sizes, tuple(a.size for a in axes), tuple(sorted(fixed.items())), limit)


@lru_cache(maxsize=1024)
def _counted(level_sizes: tuple[int, ...], axis_sizes: tuple[int, ...], fixed: tuple, limit: int) -> int:
    """`count_placements`, kept: the planner's estimate and its search count the same choices."""
    return count_placements(level_sizes, axis_sizes, dict(fixed), limit)


def _constraint_cells(constraint, topology: Topology, axes: tuple[Axis, ...], primes) -> dict[tuple[int, int, int], int]:
    axis_names = tuple(axis.name for axis in axes)
    if constraint.axis not in axis_names:
        raise UsageError(f"{constraint}: unknown axis {constraint.axis!r}; the axes are {', '.join(axis_names)}")
    a = axis_names.index(constraint.axis)
    l = topology.level_index(constraint.level)
    if isinstance(constraint, Inside):
        room = product(topology.sizes[l + 1:])
        if room % axes[a].size:
            raise NoSolutionError(f"{constraint}: one {constraint.level} holds {room} device(s) and "
                                  f"{constraint.axis}={axes[a].size} does not divide that, so it cannot stay inside "
                                  f"one; name an outer level")
        return {(p, a, level): 0 for level in range(l + 1) for p in primes}
    if constraint.value < 1:
        raise UsageError(f"{constraint}: a factor must be a positive integer")
    # Before any factoring: a factor that does not divide both sizes has no placement (and a
    # 31-digit one would take trial division forever).
    level_size, axis_size = topology.sizes[l], axes[a].size
    if level_size % constraint.value or axis_size % constraint.value:
        raise NoSolutionError(f"{constraint}: {constraint.value} does not divide both the {constraint.level} size "
                              f"{level_size} and the {constraint.axis} size {axis_size}, so no placement has it")
    wanted = _prime_factors(constraint.value)
    return {(p, a, l): wanted.get(p, 0) for p in primes}


def enumerate_placements_direct(level_sizes, axis_sizes) -> list[tuple[tuple[int, ...], ...]]:
    """Every parallelism matrix by direct search over divisors: the test oracle for the
    exponent-table enumeration."""
    n_axes, n_levels = len(axis_sizes), len(level_sizes)
    results = []

    def fill(a: int, l: int, remaining_levels, remaining_axes, rows):
        if l == n_levels:
            if a == n_axes - 1:
                if all(r == 1 for r in remaining_levels):
                    results.append(tuple(tuple(row) for row in rows))
                return
            if remaining_axes[a] != 1:
                return
            fill(a + 1, 0, remaining_levels, remaining_axes, rows)
            return
        # The last axis takes whatever the column needs; earlier axes try each divisor.
        if a == n_axes - 1:
            candidates = [remaining_levels[l]]
        else:
            candidates = [d for d in range(1, remaining_levels[l] + 1) if remaining_levels[l] % d == 0]
        for d in candidates:
            if remaining_axes[a] % d:
                continue
            rows[a][l] = d
            new_levels = list(remaining_levels)
            new_levels[l] //= d
            new_axes = list(remaining_axes)
            new_axes[a] //= d
            fill(a, l + 1, new_levels, new_axes, rows)
        rows[a][l] = 0

    if product(level_sizes) == product(axis_sizes):
        fill(0, 0, list(level_sizes), list(axis_sizes), [[0] * n_levels for _ in range(n_axes)])
    return sorted(results)
