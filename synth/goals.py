"""What a request asks the program to compute: its goal collective (docs/model.md section 7).

A request names one collective, as a training step calls it over the reduction group:

* `allreduce` (the default): every member ends with every block summed over the group;
* `reducescatter`: member r ends with block r of the sum, blocks in member-rank order, the
  layout of torch's `reduce_scatter_tensor` and NCCL's `ncclReduceScatter`;
* `allgather`: every member ends with every member's block, member r's at block r
  (`all_gather_into_tensor`, `ncclAllGather`);
* `alltoall`: member i's block j ends at member j, as block i (`all_to_all_single` with equal
  splits);
* `broadcast`: every member ends with member 0's buffer;
* `reduce`: member 0 ends with every block summed over the group (the others end as they may);
* `dispatch` (mixture-of-experts): every token reaches each member hosting one of its experts,
  exactly once per expert; `combine`: each token's owner ends with the weighted sum of its k
  expert outputs. These two are *routed*: what they move is set by a routing
  (synth/routing.py), their programs are checked by synth/routed.py and priced by
  synth/search/routed_rank.py (the `Ranker` lists and prices them); `ROUTED_GOALS` holds them beside `GOALS`.

A goal also says which steps its programs are built of (its alphabet: the collectives that
can take part in a valid program of it, and whether local `Permute` steps can), and what the
dead-prefix pruning may assume of its final state (synth/search/pruning.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.errors import UsageError
from synth.language import Program, Step
from synth.names import echo

SUMS = ("AllReduce", "ReduceScatter", "AllGather", "Reduce", "Broadcast")

# What each member holds before the first step (docs/model.md section 7): the whole buffer, its
# own block only (at its place), nothing but on the root (member 0), or the whole buffer with
# block j addressed to member j.
WHOLE, OWN_BLOCK, ROOT_ONLY, ADDRESSED = "whole", "own block", "root only", "addressed"

# What the program must leave (docs/model.md section 7): the semantics' goal state and the
# interpreter's expected buffers are built from it.
SUM_EVERYWHERE = "the sum on every member"
SUM_BLOCKS = "block r of the sum on member r, at any place"
SUM_AT_ROOT = "the sum on the root"
GATHERED = "member r's block at place r on every member"
TRANSPOSED = "member i's block j on member j, at place i"
ROOT_EVERYWHERE = "the root's buffer on every member"
# The routed goals' (synth/routed.py): every copy of a token at its destination.
DELIVERED = "each token once at every member hosting one of its experts"
COMBINED = "each token's weighted sum of its expert outputs on its owner"
# Where a framework reads each end's result (Goal.result), where it is not the whole buffer.
_RESULTS = {SUM_BLOCKS: OWN_BLOCK, SUM_AT_ROOT: ROOT_ONLY}


@dataclass(frozen=True)
class Goal:
    """One goal collective. `collective` is its record's name (synth/collectives.py), the one
    flat call that computes it and the baseline every program is compared with."""

    name: str  # as --collective spells it
    collective: str
    title: str  # as prose spells it
    alphabet: tuple[str, ...]  # the collectives its programs are built of
    permutes: bool  # its programs may reorder a member's blocks locally (Permute steps)
    sums: bool  # every block of the result is a sum over the group
    ends_whole: bool  # every member ends holding the whole buffer
    ends_full: bool  # no member ends empty
    start: str = WHOLE  # what each member holds before the first step: WHOLE, OWN_BLOCK, ROOT_ONLY or ADDRESSED
    bound_share: float = 0.5  # its lower bound's bytes, as a share of the all-reduce bound's (synth/search/rank.py)
    jax_call: str | None = None  # the jax.lax collective it equals under shard_map (synth/jax.py); None: none
    torch_call: str = ""  # the torch.distributed call a training step makes for it (its flat call at run time)
    rooted: bool = False  # one member (the root, member 0) gives or takes the result: broadcast, reduce
    end: str = SUM_EVERYWHERE  # what the program must leave: SUM_EVERYWHERE, SUM_BLOCKS, GATHERED, ...
    routed: bool = False  # it moves tokens by a routing (dispatch, combine: synth/routed.py)
    reverses: bool = False  # its programs run the dispatch's route backwards: read them last step first (combine)

    def __str__(self) -> str:
        return self.name

    @property
    def is_all_reduce(self) -> bool:
        """The default goal: what a request without --collective asks, and the one the
        all-reduce-only studies (held-out errors, the achievable bound) are of."""
        return self == ALL_REDUCE

    @property
    def role(self) -> str:
        """How tables name its flat call: "default all-reduce", "flat ReduceScatter", ..."""
        return "default all-reduce" if self.is_all_reduce else f"flat {self.collective}"

    @property
    def result(self) -> str:
        """Where a framework reads the result after the call: WHOLE (every member's whole
        buffer), OWN_BLOCK (member r's block r, at the place the program leaves it) or
        ROOT_ONLY (the root's buffer; the others end as they may)."""
        return _RESULTS.get(self.end, WHOLE)

    def bus_factor(self, n: int) -> float:
        """nccl-tests' busbw / algbw of its flat call over n members (synth/collectives.py)."""
        from synth.collectives import collective

        return collective(self.collective).bus_factor(n)

    def flat_call(self, outermost: str) -> Program:
        """The goal's one flat call over the whole group (whose outermost level is `outermost`):
        what a framework calls, the baseline every program is compared with."""
        return Program((Step(self.collective, "InsideGroup", outermost),))


GOALS: dict[str, Goal] = {
    goal.name: goal
    for goal in (
        Goal("allreduce", "AllReduce", "all-reduce", SUMS, False, True, True, True, bound_share=1.0,
             jax_call="psum", torch_call="all_reduce"),
        Goal("reducescatter", "ReduceScatter", "reduce-scatter", SUMS, True, True, False, True,
             jax_call="psum_scatter", torch_call="reduce_scatter_tensor", end=SUM_BLOCKS),
        Goal("allgather", "AllGather", "all-gather", ("AllGather", "Broadcast"), True, False, True, True, OWN_BLOCK,
             jax_call="all_gather", torch_call="all_gather_into_tensor", end=GATHERED),
        Goal("alltoall", "AllToAll", "all-to-all", ("AllToAll",), True, False, True, True, ADDRESSED,
             jax_call="all_to_all", torch_call="all_to_all_single", end=TRANSPOSED),
        Goal("broadcast", "Broadcast", "broadcast", ("Broadcast",), False, False, True, True, ROOT_ONLY,
             torch_call="broadcast", rooted=True, end=ROOT_EVERYWHERE),
        Goal("reduce", "Reduce", "reduce", SUMS, False, True, False, False, torch_call="reduce", rooted=True,
             end=SUM_AT_ROOT),
    )
}
# Mixture-of-experts goals: AllToAll steps that carry each token once per destination they
# lead to (docs/model.md section 7, "Dispatch and combine").
ROUTED_GOALS: dict[str, Goal] = {
    goal.name: goal
    for goal in (
        Goal("dispatch", "AllToAll", "dispatch", ("AllToAll",), False, False, False, True, routed=True,
             end=DELIVERED),
        Goal("combine", "AllToAll", "combine", ("AllToAll",), False, True, False, True, routed=True, end=COMBINED,
             reverses=True),
    )
}
# Each goal by a name code can import (the names themselves are parsed at the edges only).
ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, BROADCAST, REDUCE = GOALS.values()
DISPATCH, COMBINE = ROUTED_GOALS.values()
DEFAULT_GOAL = ALL_REDUCE.name
# Each unrouted goal by its flat call's record name ("ReduceScatter": REDUCE_SCATTER): how a step's
# collective names the goal it computes alone.
BY_COLLECTIVE: dict[str, Goal] = {goal.collective: goal for goal in GOALS.values()}


def parse_goal(text) -> Goal:
    """`allreduce`, `reducescatter`, ... (dashes, underscores and case ignored) into its Goal."""
    if isinstance(text, Goal):
        return text
    key = str(text).strip().lower().replace("-", "").replace("_", "")
    goal = GOALS.get(key) or ROUTED_GOALS.get(key)
    if goal is None:
        raise UsageError(f"unknown collective {echo(text)}: choose one of {', '.join([*GOALS, *ROUTED_GOALS])}")
    return goal
