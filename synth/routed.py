"""The meaning of dispatch and combine programs (docs/model.md section 7, "Dispatch and
combine"), for any routing: which programs deliver every token to every expert it is routed
to, and every expert output back to its token's owner.

A step `AllToAll(Form(level))` of a dispatch program moves every copy of a token that a
member holds toward the members hosting its experts, along the step's levels only: for each
distinct member it must reach, the copy goes to the member of the step's group that agrees
with that destination on the step's levels (and with the holder elsewhere), once, however
many of the token's experts sit under it. Combine runs the same steps toward each token's
owner, a member summing the partial results of one token it holds before forwarding them.

So whatever the routing, after steps over the levels R every copy agrees with its
destination on R and with the token's owner on the other levels: the state is the set R of
*resolved* levels, the same for every member and every routing, and the goal is every level
of more than one member resolved. The concrete executor over real tokens
(synth/routed_interpreter.py) runs the same steps copy by copy and the tests hold the two
equal on random and adversarial routings.

Rules (each refusal names the step and why):
* only `AllToAll` steps, no `Permute` (a copy carries its token's id, not a place);
* a step's form must put every member in a group: a `Master` step idles members that hold
  copies, which would never move;
* a step's levels must all be unresolved: over a resolved level every copy already agrees
  with its destination, so the members there would exchange nothing (the same movement is
  the step over the remaining levels), and a step over resolved levels only is a no-op;
* no step after the goal; the program must end at the goal.
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.errors import InvalidProgramError, UsageError
from synth.goals import DELIVERED, Goal, parse_goal
from synth.language import Program, Step, form_names
from synth.semantics import FORMS, QUOTIENT_CAP

ROUTED_COLLECTIVE = "AllToAll"


@dataclass(frozen=True)
class RoutedTrace:
    """One step and the resolved levels (indices) before and after it."""

    step: Step
    before: frozenset[int]
    after: frozenset[int]


class RoutedSemantics:
    """The resolved-levels machine of a dispatch or combine goal on one synthesis hierarchy."""

    def __init__(self, level_names: tuple[str, ...], sizes: tuple[int, ...], goal: Goal | str):
        self.level_names = tuple(level_names)
        self.sizes = tuple(sizes)
        self.goal = parse_goal(goal)
        if not self.goal.routed:
            raise ValueError(f"{self.goal.name} is not a routed goal")
        self.levels = frozenset(i for i, size in enumerate(self.sizes) if size > 1)
        self._capped = tuple(min(size, QUOTIENT_CAP) for size in self.sizes)

    def step_levels(self, step: Step) -> tuple[frozenset[int], bool]:
        """(levels of more than one member the step's groups vary on, whether its groups hold
        every member); UsageError for a level not in the hierarchy."""
        if step.level not in self.level_names:
            known = ", ".join(self.level_names) or "none (the group has one member)"
            raise UsageError(f"unknown level {step.level!r} in step {step}: the synthesis hierarchy's levels are {known}")
        groups, varying = FORMS[step.form](self._capped, self.level_names.index(step.level))
        covered = sum(len(group) for group in groups)
        members = 1
        for size in self._capped:
            members *= size
        return frozenset(level for level in varying if self.sizes[level] > 1), covered == members

    def _names(self, levels) -> str:
        return ",".join(self.level_names[level] for level in sorted(levels))

    def apply(self, resolved: frozenset[int], step: Step, index: int = 0) -> frozenset[int]:
        """The resolved levels after `step`; InvalidProgramError (naming the step) when a rule fails."""
        title, where = self.goal.title, f"step {index + 1} {step}"
        if step.is_permute:
            raise InvalidProgramError(f"{where}: {title} programs have no Permute step (a copy carries its token's id)", index)
        if step.collective != ROUTED_COLLECTIVE:
            raise InvalidProgramError(f"{where}: {step.collective} takes no part in {title} programs; their steps are "
                                      f"{ROUTED_COLLECTIVE}", index)
        if resolved == self.levels:
            raise InvalidProgramError(f"{where}: the goal was already reached after step {index}; drop the remaining "
                                      f"steps", index)
        levels, covering = self.step_levels(step)
        if not covering:
            raise InvalidProgramError(f"{where} is invalid: {step.form} idles members that hold copies, which would "
                                      f"never move", index)
        if not levels:
            raise InvalidProgramError(f"{where} is invalid: every group of this form has one member, so the step does "
                                      f"nothing", index)
        if levels <= resolved:
            raise InvalidProgramError(f"{where} is invalid: every copy already agrees with its destination on "
                                      f"({self._names(levels)}), so the step changes nothing (a no-op)", index)
        if levels & resolved:
            rest = levels - resolved
            raise InvalidProgramError(
                f"{where} is invalid: the copies already agree with their destinations on ({self._names(levels & resolved)}), "
                f"so the members there would exchange nothing; the same movement is the step over ({self._names(rest)})",
                index)
        return resolved | levels

    def run(self, program: Program) -> list[RoutedTrace]:
        """Check a program; InvalidProgramError names the failing step or what is missing."""
        resolved, trace = frozenset(), []
        for index, step in enumerate(program.steps):
            after = self.apply(resolved, step, index)
            trace.append(RoutedTrace(step, resolved, after))
            resolved = after
        if resolved != self.levels:
            missing = self._names(self.levels - resolved)
            where = "the members hosting their experts" if self.goal.end == DELIVERED else "their owners"
            raise InvalidProgramError(
                f"the program ends before the goal: copies have not yet been moved to {where} across ({missing}); "
                f"a step over ({missing}) is missing", len(program.steps))
        return trace

    def alphabet(self) -> list[tuple[Step, frozenset[int]]]:
        """One spelling per distinct step (the first in grammar order, levels outermost
        first) whose groups hold every member and vary on some level of more than one member."""
        seen, result = set(), []
        for form in form_names():
            for name in self.level_names:
                step = Step(ROUTED_COLLECTIVE, form, name)
                levels, covering = self.step_levels(step)
                if covering and levels and levels not in seen:
                    seen.add(levels)
                    result.append((step, levels))
        return result

    def programs(self, max_len: int) -> list[Program]:
        """Every valid program of at most `max_len` steps, shortest first (then in the
        alphabet's order)."""
        alphabet = self.alphabet()
        found, frontier = [], [((), frozenset())]
        for _ in range(max_len):
            extended = []
            for steps, resolved in frontier:
                for step, levels in alphabet:
                    if levels & resolved:
                        continue
                    after = resolved | levels
                    if after == self.levels:
                        found.append(Program(steps + (step,)))
                    else:
                        extended.append((steps + (step,), after))
            frontier = extended
        return found

    def describe(self, resolved: frozenset[int]) -> str:
        """What every member holds once the levels `resolved` are resolved (docs/model.md)."""
        if not resolved:
            return ("every member holds its own tokens" if self.goal.end == DELIVERED
                    else "every member holds, per token, the sum of its weighted outputs of the experts it hosts")
        agree, rest = self._names(resolved), self._names(self.levels - resolved) or "none"
        if self.goal.end == DELIVERED:
            return (f"member m holds one copy of each token whose owner agrees with m on ({rest}) and which has an "
                    f"expert on a member agreeing with m on ({agree})")
        return (f"member m holds, for each token whose owner agrees with m on ({agree}), one partial sum: the weighted "
                f"outputs of its experts on members agreeing with m on ({rest})")
