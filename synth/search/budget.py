"""What a program search costs before it starts, so that one which cannot finish is refused.

The enumerator's work is the (state, steps left) pairs it expands. Over the quotient state
(synth/semantics.py) that number depends on the hierarchy's depth (its levels of size > 1)
and on the length, not on the level sizes: larger sizes only add uneven splits, which end
branches. So it was measured once, for hierarchies of 2-member levels, by
`python -m benchmarks.synthesis --calibrate` (results/synthesis-speed/synthesis-calibration.md), and is
kept here: EXPANSIONS[depth][length - 1]. Beyond the measured lengths, each extra step
multiplies by the last measured ratio at that depth; the ratios shrink as the length grows
(at depth 4: 5.7, 4.5, 3.5, 2.8), so the estimate errs high, towards refusing.

Time is expansions x the measured seconds per expansion at that depth (it grows with the
2^depth members of 4^depth bits a state holds), on the machine the calibration names. The
budget is in those seconds: a search estimated above it is refused with the length that fits.
Hierarchies deeper than the table are refused at any length: nothing was measured there and
a single state already holds 2^depth members of 4^depth bits.
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.errors import SearchTooLargeError
from synth.goals import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BROADCAST, REDUCE, REDUCE_SCATTER, Goal, parse_goal

# Expanded (state, steps left) pairs of a complete search over 2-member levels, by depth and
# length 1, 2, ... (results/synthesis-speed/synthesis-calibration.json).
EXPANSIONS: dict[int, tuple[int, ...]] = {
    1: (1, 4, 7, 10, 13, 16, 19, 22),
    2: (1, 7, 30, 65, 103, 141, 179, 217),
    3: (1, 10, 54, 245, 654, 1306, 2126, 3015),
    4: (1, 13, 87, 533, 2512, 8507, 22869, 51061),
    5: (1, 16, 129, 1023, 6634, 35603, 154129, 561491),
    6: (1, 19, 180, 1770, 14938, 109593),
    7: (1, 22, 240, 2829, 29630),
    8: (1, 25, 309, 4255),
}
# CPU seconds per expansion at each depth, from the largest search of that depth (never less
# than at a smaller depth: small searches are dominated by fixed costs).
SECONDS_PER_EXPANSION: dict[int, float] = {1: 4.7e-05, 2: 4.7e-05, 3: 4.7e-05, 4: 4.7e-05, 5: 0.00011, 6: 0.00034, 7: 0.0013, 8: 0.012}
# The same for the other goals (synth/goals.py), measured the same way (2-member levels, every
# length until a search took more than 8 s: `python -m benchmarks.goals --calibrate`,
# results/synthesis-goals/goals-calibration.json), and
# their seconds per expansion (block tags and Permute steps make some states dearer). A depth
# not measured for a goal scales its deepest measured row by the all-reduce table's growth.
GOAL_EXPANSIONS: dict[Goal, dict[int, tuple[int, ...]]] = {
    REDUCE_SCATTER: {
        1: (1, 2, 3, 4, 5, 6, 7, 8),
        2: (1, 5, 10, 16, 22, 28, 34, 40),
        3: (1, 9, 28, 56, 88, 120, 152, 184),
        4: (1, 27, 98, 221, 389, 577, 765, 953),
        5: (1, 14, 48, 106, 189, 295, 408, 521),
        6: (1, 19, 68, 152, 272, 428, 618, 817),
    },
    ALL_GATHER: {
        1: (1, 2, 3, 4, 5, 6, 7, 8),
        2: (1, 4, 11, 20, 29, 38, 47, 56),
        3: (1, 9, 31, 79, 158, 250, 346, 443),
        4: (1, 28, 106, 317, 805, 1664, 2923, 4471),
        5: (1, 16, 63, 245, 869, 2653, 6824, 14939),
        6: (1, 22, 93, 427, 1913, 7651, 26610, 80583),
    },
    ALL_TO_ALL: {
        1: (1, 2, 3, 4, 5, 6, 7, 8),
        2: (1, 5, 15, 35, 68, 113, 168, 229),
        3: (1, 9, 39, 133, 368, 841, 1702, 3204),
        4: (1, 27, 145, 597, 1980, 5624, 14170, 33715),
        5: (1, 14, 69, 262, 861, 2676, 7400, 19481),
        6: (1, 19, 99, 411, 1460, 4976, 15008),
    },
    BROADCAST: {
        1: (1, 2, 3, 4, 5, 6, 7, 8),
        2: (1, 3, 5, 7, 9, 11, 13, 15),
        3: (1, 3, 6, 9, 12, 15, 18, 21),
        4: (1, 3, 6, 10, 14, 18, 22, 26),
        5: (1, 3, 6, 10, 15, 20, 25, 30),
        6: (1, 3, 6, 10, 15, 21, 27, 33),
    },
    REDUCE: {
        1: (1, 3, 5, 7, 9, 11, 13, 15),
        2: (1, 12, 35, 63, 92, 121, 150, 179),
        3: (1, 21, 127, 407, 893, 1557, 2315, 3105),
        4: (1, 30, 277, 1524, 5751, 16488, 38603, 76081),
        5: (1, 39, 485, 3867, 22955, 106764, 405829),
        6: (1, 48, 751, 7902, 65626),
    },
}
GOAL_SECONDS_PER_EXPANSION: dict[Goal, dict[int, float]] = {
    ALL_GATHER: {5: 6e-05, 6: 0.00012},
    ALL_TO_ALL: {4: 0.00012, 5: 0.00018, 6: 0.00066},
    REDUCE: {4: 4.4e-05, 5: 7e-05, 6: 0.00017},
}
CALIBRATION_MACHINE = "a 2-core machine like the one it was measured on"
# A search estimated above this is refused: it would not finish within a minute.
DEFAULT_BUDGET_S = 60.0
MAX_DEPTH = max(EXPANSIONS)


@dataclass(frozen=True)
class SearchEstimate:
    depth: int
    max_len: int
    expansions: int
    seconds: float


def search_depth(sizes) -> int:
    """Levels that count: a level of size 1 offers no group and adds nothing to the state."""
    return sum(1 for size in sizes if size > 1)


def _row(measured: tuple[int, ...], max_len: int) -> float:
    if max_len <= len(measured):
        return float(measured[max_len - 1])
    ratio = measured[-1] / measured[-2] if len(measured) > 1 else 1.0
    return measured[-1] * ratio ** (max_len - len(measured))


def estimate(depth: int, max_len: int, goal: Goal | str = ALL_REDUCE) -> SearchEstimate:
    """The expansions and seconds of a complete search up to `max_len` steps (depth <= MAX_DEPTH)."""
    if depth == 0:
        return SearchEstimate(0, max_len, 1, 0.0)
    goal = parse_goal(goal)
    seconds = SECONDS_PER_EXPANSION[depth]
    if goal not in GOAL_EXPANSIONS:  # the all-reduce's (the table every goal is measured against)
        expansions = _row(EXPANSIONS[depth], max_len)
    else:
        rows = GOAL_EXPANSIONS[goal]
        if depth in rows:
            expansions = _row(rows[depth], max_len)
        else:  # deeper than measured: the deepest row, grown as the all-reduce table grows
            deepest = max(rows)
            expansions = _row(rows[deepest], max_len) * _row(EXPANSIONS[depth], max_len) / _row(EXPANSIONS[deepest], max_len)
        measured = GOAL_SECONDS_PER_EXPANSION.get(goal, {})
        own = measured.get(depth, measured[max(measured)] if measured and depth > max(measured) else 0.0)
        seconds = max(seconds, own)
    return SearchEstimate(depth, max_len, round(expansions), expansions * seconds)


def total(depths, max_len: int, goal: Goal | str = ALL_REDUCE) -> SearchEstimate:
    """The estimate of several searches run one after another (the deepest depth reported)."""
    found = [estimate(depth, max_len, goal) for depth in depths]
    return SearchEstimate(max(depths, default=0), max_len, sum(f.expansions for f in found), sum(f.seconds for f in found))


def largest_length(depths, budget_s: float, up_to: int, goal: Goal | str = ALL_REDUCE) -> int:
    """The longest length up to `up_to` whose searches together fit the budget (0: none)."""
    depths = list(depths)
    if any(depth > MAX_DEPTH for depth in depths):
        return 0
    longest = 0
    for length in range(1, up_to + 1):
        if total(depths, length, goal).seconds > budget_s:
            break
        longest = length
    return longest


def check_budget(hierarchies, max_len: int, budget_s: float | None = DEFAULT_BUDGET_S,
                 goal: Goal | str = ALL_REDUCE) -> SearchEstimate:
    """Refuse (SearchTooLargeError, describing values only) searches up to `max_len` steps over
    these hierarchies, given as (level names, sizes) and run one after another, when they are
    estimated beyond the budget together; None budget: only the depth limit. Returns the estimate."""
    hierarchies = [(tuple(names), tuple(sizes)) for names, sizes in hierarchies]
    depths = [search_depth(sizes) for _, sizes in hierarchies]
    for depth, (names, sizes) in zip(depths, hierarchies):
        if depth > MAX_DEPTH:
            raise SearchTooLargeError(
                f"the synthesis hierarchy {_text(names, sizes)} has {depth} levels of more than one member; its search "
                f"state holds 2^{depth} members of 4^{depth} bits and cannot be searched beyond {MAX_DEPTH} levels: a "
                f"hierarchy with fewer levels is needed (the merged one, or fewer system levels)",
                depth=depth, max_len=max_len, largest_length=0, expansions=0, seconds=float("inf"),
            )
    goal = parse_goal(goal)
    found = total(depths, max_len, goal)
    if budget_s is None or found.seconds <= budget_s:
        return found
    longest = largest_length(depths, budget_s, max_len - 1, goal)
    advice = (f"programs of at most {longest} steps finish within {_duration(budget_s)}" if longest
              else "no length finishes in that time")
    if len(hierarchies) == 1:
        article = "an" if depths[0] in (8, 11, 18) else "a"
        what = f"{article} {depths[0]}-level synthesis hierarchy ({_text(*hierarchies[0])}) at length {max_len} needs"
    else:
        what = (f"{len(hierarchies)} synthesis hierarchies (the deepest with {found.depth} levels) at length {max_len} "
                f"need together")
    raise SearchTooLargeError(
        f"{what} about {found.expansions:,} search states (~{_duration(found.seconds)} on {CALIBRATION_MACHINE}); {advice}",
        depth=found.depth, max_len=max_len, largest_length=longest, expansions=found.expansions, seconds=found.seconds,
    )


def _text(names, sizes) -> str:
    return ",".join(f"{name}={size}" for name, size in zip(names, sizes))


def _duration(seconds: float) -> str:
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    if seconds < 600:
        minutes = round(seconds / 60, 1)
        return "a minute" if minutes == 1 else f"{minutes:g} minutes"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} minutes"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} hours"
    return f"{seconds / 86400:.0f} days"
