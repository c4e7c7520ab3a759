"""Where an MoE layer's experts live and which ranks share a node, as a value without torch.

An `ExpertLayout` is what the token dispatcher (synth.torch.moe) needs to route: the
expert-parallel groups (global ranks, each in EP-rank order), the nodes (global ranks per
node), and the number of experts of the layer. Expert e of a group lives on its EP rank
e // (experts per rank), as Megatron places them (contiguous local experts).

The two-stage (hierarchical) dispatch sends a token once to each destination node, to the
member there with the sender's own index inside its node, so it needs every node of an EP
group to hold the same number of its members: `node_split` checks that and says why not.

Three ways to build one, so that a plan can build it as well as a script can: `uniform`
(consecutive ranks per node and per group, Megatron's order with tp = cp = 1),
`from_groups` (the groups themselves, e.g. a plan's expert-parallel groups and its node
groups) and `from_hierarchy` (a synthesis hierarchy's groups, nodes by its innermost level).
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.errors import UsageError


@dataclass(frozen=True)
class NodeSplit:
    """One EP group cut by node: `members[n][l]` is the EP rank of the l-th member on node n."""

    members: tuple[tuple[int, ...], ...]

    @property
    def nodes(self) -> int:
        return len(self.members)

    @property
    def per_node(self) -> int:
        return len(self.members[0])

    def place(self, ep_rank: int) -> tuple[int, int]:
        """(node, index inside the node) of an EP rank."""
        for node, members in enumerate(self.members):
            if ep_rank in members:
                return node, members.index(ep_rank)
        raise UsageError(f"EP rank {ep_rank} is on no node of the split")


@dataclass(frozen=True)
class ExpertLayout:
    num_experts: int
    ep_groups: tuple[tuple[int, ...], ...]  # global ranks, each group in EP-rank order
    nodes: tuple[tuple[int, ...], ...]  # global ranks per node; together, the world

    def __post_init__(self):
        if type(self.num_experts) is not int or self.num_experts < 1:
            raise UsageError(f"num_experts={self.num_experts!r}: give a positive whole number of experts")
        world = self.world_size
        _partition(self.ep_groups, world, "the expert-parallel groups")
        _partition(self.nodes, world, "the node groups")
        sizes = {len(group) for group in self.ep_groups}
        if len(sizes) != 1:
            raise UsageError(f"expert-parallel groups of sizes {sorted(sizes)}: every group must have as many ranks")
        if self.num_experts % self.ep_size:
            raise UsageError(f"{self.num_experts} experts over expert-parallel groups of {self.ep_size} ranks: give a "
                             f"number of experts that is a multiple of {self.ep_size}, or another group size")

    @property
    def world_size(self) -> int:
        return sum(len(group) for group in self.ep_groups)

    @property
    def ep_size(self) -> int:
        return len(self.ep_groups[0])

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.ep_size

    def group_of(self, rank: int) -> tuple[int, ...]:
        return next(group for group in self.ep_groups if rank in group)

    def node_of(self, rank: int) -> int:
        return next(index for index, node in enumerate(self.nodes) if rank in node)

    def node_split(self, group: tuple[int, ...]) -> NodeSplit:
        """The group's members by node (nodes in order of their first member, members in EP
        order); UsageError when the nodes hold different numbers of the group's members."""
        by_node: dict[int, list[int]] = {}
        for ep_rank, rank in enumerate(group):
            by_node.setdefault(self.node_of(rank), []).append(ep_rank)
        counts = sorted({len(members) for members in by_node.values()})
        if len(counts) > 1:
            raise UsageError(f"expert-parallel group {list(group)[:16]} has {counts[0]} to {counts[-1]} ranks per "
                             "node: "
                             "a two-stage dispatch needs the same number on every node (use the flat form, or "
                             "place the group evenly over its nodes)")
        return NodeSplit(tuple(tuple(members) for members in by_node.values()))

    def split_groups(self) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
        """(the inside-node groups, the across-node groups) of every EP group, in global ranks:
        the communicators of the two-stage form, in one order on every rank."""
        inside, across = [], []
        for group in self.ep_groups:
            split = self.node_split(group)
            inside += [tuple(group[m] for m in members) for members in split.members]
            across += [tuple(group[members[index]] for members in split.members) for index in range(split.per_node)]
        return tuple(inside), tuple(across)

    def to_json(self) -> dict:
        return {"num_experts": self.num_experts, "ep_groups": [list(g) for g in self.ep_groups],
                "nodes": [list(n) for n in self.nodes]}

    # --- constructors -------------------------------------------------------------------------

    @staticmethod
    def uniform(world_size: int, num_experts: int, ranks_per_node: int, ep_size: int | None = None) -> ExpertLayout:
        """Consecutive ranks per node and per EP group (`ep_size`, the world by default)."""
        ep_size = world_size if ep_size is None else ep_size
        for name, value in (("world_size", world_size), ("ranks_per_node", ranks_per_node), ("ep_size", ep_size)):
            if type(value) is not int or value < 1:
                raise UsageError(f"{name}={value!r}: give a positive whole number")
        for name, value in (("ranks_per_node", ranks_per_node), ("ep_size", ep_size)):
            if world_size % value:
                raise UsageError(f"{name}={value} does not divide the {world_size} ranks: give a divisor of "
                                 f"{world_size}")
        return ExpertLayout(num_experts, _blocks(world_size, ep_size), _blocks(world_size, ranks_per_node))

    @staticmethod
    def from_groups(num_experts: int, ep_groups, node_groups) -> ExpertLayout:
        """From the groups themselves (lists of global ranks): what a plan hands over."""
        return ExpertLayout(num_experts, _ranks(ep_groups, "ep_groups"), _ranks(node_groups, "node_groups"))

    @staticmethod
    def from_hierarchy(hierarchy, num_experts: int) -> ExpertLayout:
        """A synthesis hierarchy's groups as the EP groups (synth.hierarchy), ranks numbered
        node-major by its placement, a node being its system's innermost level."""
        nodes = _blocks(hierarchy.placement.device_count, hierarchy.placement.level_sizes[-1])
        return ExpertLayout(num_experts, tuple(tuple(map(int, g)) for g in hierarchy.groups), nodes)


def _blocks(world_size: int, size: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(range(start, start + size)) for start in range(0, world_size, size))


def _ranks(groups, name: str) -> tuple[tuple[int, ...], ...]:
    try:
        result = tuple(tuple(int(r) for r in group) for group in groups)
    except (TypeError, ValueError):
        raise UsageError(f"{name}: give a list of lists of global ranks") from None
    if not result or not all(result):
        raise UsageError(f"{name}: give at least one non-empty group")
    return result


def _partition(groups, world: int, what: str) -> None:
    ranks = sorted(rank for group in groups for rank in group)
    if ranks != list(range(world)):
        raise UsageError(f"{what} cover ranks {ranks[:16]}{'...' if len(ranks) > 16 else ''}: they must name every "
                         f"rank 0..{world - 1} exactly once")
