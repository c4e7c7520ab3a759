"""An MoE layer's token dispatch and combine over expert parallelism, flat or in two stages
(docs/training.md, section 6).

    layout = ExpertLayout.uniform(world_size=8, num_experts=16, ranks_per_node=4)
    dispatcher = TokenDispatcher(layout, top_k=2, form="hierarchical")   # after init_process_group
    routed = dispatcher.dispatch(tokens, indices, weights)    # [n, h], [n, k] expert ids, [n, k]
    outputs = run_experts(routed.expert_input, routed.tokens_per_expert)   # grouped by local expert
    mixed = dispatcher.combine(outputs, routed)                # [n, h]: sum_j weights[t, j] * y_j(t)

Each token goes to the rank hosting each of its k experts (expert e on EP rank e // (experts per
rank)); that rank receives its tokens grouped by local expert, in order of the sending EP rank,
then of the sender's token order, as Megatron's alltoall dispatcher hands them to its grouped
experts. Combine returns the expert outputs to each token's owner and sums them weighted by the
router weights. Splits are uneven: the real token counts are exchanged first (all_to_all_single
of the counts, as Megatron's dispatcher does), then the tokens.

- `form="flat"`: one all_to_all_single over the EP group, one copy per (token, expert).
- `form="hierarchical"`: across nodes first, to the member with the sender's own index inside
  its node on each destination node, once per node however many of the token's experts live
  there (the deduplication DeepEP and HybridEP make), carrying the token's expert ids and
  weights for that node; then inside the node, from that forwarding member to each expert.
  Combine runs in reverse, and the forwarding member sums its node's weighted outputs before
  the result crosses back: one row per (token, node) crosses the network each way.
  `Routed.rows_across_nodes` counts the rows this rank sent to other nodes (both forms).

Both are differentiable: every exchange is an autograd Function whose backward is the reverse
exchange (the backward of dispatch is a combine without weights, that of combine a dispatch),
and the permutations and the weighted sum are torch's own indexing ops, so gradients reach the
tokens, the router weights and the experts' parameters.

Bad input never hangs: a rank whose routing is wrong (an expert index out of range, top-k or
shapes that do not match, an expert twice in one token's top-k) still takes part in the counts
exchange, with a problem code in place of counts, and every rank of the group raises
`RoutingError` naming the rank and the problem; the counts exchange also carries each rank's
type, width and top-k, so ranks that disagree fail together. Combine compares the same (one
all_gather of four integers over the EP group) before it exchanges.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from synth.errors import UsageError
from synth.torch import agreement
from synth.torch.errors import RankDisagreementError, RoutingError
from synth.torch.moe_layout import ExpertLayout

FORMS = ("flat", "hierarchical")
# problem codes carried in the counts exchange: (code, value, origin rank)
OUT_OF_RANGE, TOP_K, REPEATED, SHAPE, DTYPE, WIDTH, OTHER_K, ROWS = range(1, 9)
HEADER = 6  # code, value, origin, dtype code, hidden, k


class _Exchange(torch.autograd.Function):
    """all_to_all_single with uneven splits; its backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _all_to_all(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad.contiguous(), ctx.recv, ctx.send, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    if group is None:  # a group of one: the rows stay
        return x.clone()
    out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    return out


def _regroup(counts: torch.Tensor) -> torch.Tensor:
    """Rows received as [source][local expert] chunks of `counts` [S, E], reordered to
    [local expert][source]: the row index of each, in the new order."""
    sizes = counts.reshape(-1)
    starts = torch.cumsum(sizes, 0) - sizes
    new_sizes, new_starts = counts.t().reshape(-1), starts.view(counts.shape).t().reshape(-1)
    total = int(sizes.sum())
    shift = torch.repeat_interleave(new_starts - (torch.cumsum(new_sizes, 0) - new_sizes), new_sizes,
                                    output_size=total)
    return shift + torch.arange(total, device=counts.device)


@dataclass(frozen=True)
class Routed:
    """What dispatch hands to the experts and keeps for combine.

    `expert_input` [m, h]: the rows for this rank's experts, grouped by local expert
    (`tokens_per_expert[i]` rows for local expert i), each group in order of the sending EP rank.
    The other fields are combine's: the permutations and splits of each stage."""

    expert_input: torch.Tensor
    tokens_per_expert: tuple[int, ...]
    rows_across_nodes: int  # rows this rank sent to other nodes (forwarded copies not counted)
    form: str
    tokens: int  # n, the owner's token count
    restore: torch.Tensor  # grouped order -> received order (combine's first step)
    stages: tuple  # per stage: (send splits, recv splits, group, row index at the sender, pair weights
    #                            applied at the sender in combine or None, rows at the sender)


class TokenDispatcher:
    """Dispatch and combine for one MoE layer's routing over `layout` (synth.torch.moe_layout).

    Build it on every rank, after init_process_group, with the same arguments: it makes the
    process groups its form needs (every rank takes part in each group's creation) and checks
    that the ranks agree on the layout, top-k and form."""

    def __init__(self, layout: ExpertLayout, top_k: int, form: str = "flat", device=None):
        if not dist.is_initialized():
            raise RuntimeError("TokenDispatcher needs torch.distributed: call init_process_group first")
        if form not in FORMS:
            raise UsageError(f"form {form!r}: choose 'flat' or 'hierarchical'")
        if type(top_k) is not int or not 1 <= top_k <= layout.num_experts:
            raise UsageError(f"top_k={top_k!r}: give a whole number from 1 to the {layout.num_experts} experts")
        if layout.world_size != dist.get_world_size():
            raise UsageError(f"the layout covers {layout.world_size} ranks, the job has {dist.get_world_size()}: "
                             "build the layout for the job's world")
        self.layout, self.top_k, self.form = layout, top_k, form
        self.rank = dist.get_rank()
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu"))
        signature = [agreement.digest({"layout": layout.to_json(), "top_k": top_k, "form": form})]
        held = {values for values in agreement.gather(signature, None, self.device)}
        if len(held) > 1:
            raise RankDisagreementError("ranks built their TokenDispatcher from different layouts, top-k or forms: "
                                        "build it with the same arguments on every rank")
        self.members = layout.group_of(self.rank)
        self.ep_rank = self.members.index(self.rank)
        groups = [_group(g) for g in layout.ep_groups] if len(layout.ep_groups) > 1 else [_world(layout.ep_groups[0])]
        self.group = groups[layout.ep_groups.index(self.members)]
        experts = torch.arange(layout.num_experts)
        self.member_of_expert = experts // layout.experts_per_rank
        self.inside = self.across = None
        self.split = None
        node_of_member = torch.tensor([layout.node_of(rank) for rank in self.members])
        if form == "hierarchical":
            self.split = layout.node_split(self.members)
            inside, across = layout.split_groups()
            inside_groups = [_group(g) for g in inside]
            across_groups = [_group(g) for g in across]
            self.inside_members = next(g for g in inside if self.rank in g)
            self.across_members = next(g for g in across if self.rank in g)
            self.inside = inside_groups[inside.index(self.inside_members)]
            self.across = across_groups[across.index(self.across_members)]
            self.node, self.local = self.split.place(self.ep_rank)
            place = [self.split.place(m) for m in range(layout.ep_size)]
            node_of_member = torch.tensor([node for node, _ in place])
        self.node_of_expert = node_of_member[self.member_of_expert]
        self.other_node = node_of_member != node_of_member[self.ep_rank]  # per EP rank: on another node

    @classmethod
    def from_plan(cls, plan, device=None) -> TokenDispatcher:
        """From a dispatch or combine plan (synth.torch.moe_plan.DispatchPlan, as
        load_dispatch_plan reads `synth export --collective dispatch|combine --format json`):
        its groups as the layout, its program's form, its routing's top-k."""
        return cls(plan.layout, plan.top_k, plan.form, device)

    # --- dispatch -------------------------------------------------------------------------------

    def dispatch(self, tokens: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> Routed:
        """Send every token to the ranks hosting its experts; `indices` [n, k] are expert ids of
        the layer (0..num_experts-1), `weights` [n, k] the router's (kept for combine)."""
        problem = self._check(tokens, indices, weights)
        header = self._header(tokens, weights, problem)
        if self.form == "flat":
            return self._dispatch_flat(tokens, indices, weights, header)
        return self._dispatch_two_stage(tokens, indices, weights, header)

    def _check(self, tokens, indices, weights) -> tuple[int, int]:
        """This rank's own problem with its input, as (code, value), (0, 0) when none."""
        if not all(isinstance(value, torch.Tensor) for value in (tokens, indices, weights)):
            return SHAPE, 2
        if tokens.dim() != 2:
            return SHAPE, tokens.dim()
        if indices.dim() != 2 or indices.shape[0] != tokens.shape[0] or weights.shape != indices.shape:
            return SHAPE, 0
        if indices.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            return SHAPE, 1
        if indices.shape[1] != self.top_k:
            return TOP_K, indices.shape[1]
        if indices.numel():
            low, high = int(indices.min()), int(indices.max())
            if low < 0 or high >= self.layout.num_experts:
                return OUT_OF_RANGE, low if low < 0 else high
            ordered = indices.sort(dim=1).values
            same = ordered[:, 1:] == ordered[:, :-1]
            if bool(same.any()):
                return REPEATED, int(ordered[:, 1:][same][0])
        return 0, 0

    def _header(self, tokens, weights, problem) -> list[int]:
        if problem[0] == SHAPE:  # nothing more to compare: the ranks raise on the shape
            return [*problem, self.rank, 0, 0, self.top_k]
        return [problem[0], problem[1], self.rank, _types(tokens.dtype, weights.dtype), tokens.shape[-1], self.top_k]

    def _counts(self, counts: torch.Tensor, header: list[int], group, members) -> tuple[torch.Tensor, list[int]]:
        """Exchange per-destination counts [S, C] with each rank's header; returns the received
        counts [S, C] and the first problem any member reported or that their headers show
        (code, value, origin rank; all zero when none)."""
        size = len(members)
        head = torch.tensor(header, dtype=torch.int64).expand(size, HEADER)
        send = torch.cat([head, counts.to(torch.int64).view(size, -1)], 1).to(self.device)
        received = send.clone() if group is None else torch.empty_like(send)
        if group is not None:
            dist.all_to_all_single(received, send, group=group)
        received = received.cpu()
        headers = received[:, :HEADER].tolist()
        return received[:, HEADER:], _first_problem(headers)

    def _raise(self, problem: list[int], what: str, shape: str) -> None:
        """RoutingError for the first rank's problem in `what` (the call: dispatch or combine),
        `shape` saying what that call's arguments must be."""
        code, value, origin = problem[:3]
        if code:
            raise RoutingError(_describe(code, value, origin, self.layout.num_experts, self.top_k, what, shape))

    def _dispatch_flat(self, tokens, indices, weights, header) -> Routed:
        layout = self.layout
        n, k = indices.shape if indices.dim() == 2 else (0, self.top_k)
        if header[0]:
            counts = torch.zeros(layout.ep_size, layout.experts_per_rank, dtype=torch.int64)
        else:
            flat = indices.reshape(-1).to(torch.int64).cpu()
            counts = torch.bincount(flat, minlength=layout.num_experts).view(layout.ep_size, -1)
        received, problem = self._counts(counts, header, self.group_or_none, self.members)
        self._raise(problem, "dispatch", DISPATCH_SHAPE)
        order = torch.argsort(flat, stable=True)
        send, recv = counts.sum(1).tolist(), received.sum(1).tolist()
        rows = (order // k).to(tokens.device)
        pair_weights = weights.reshape(-1).index_select(0, order.to(weights.device))
        moved = _Exchange.apply(tokens.index_select(0, rows), send, recv, self.group_or_none)
        regroup = _regroup(received).to(tokens.device)
        across = int(counts.sum(1)[self.other_node].sum())
        return Routed(moved.index_select(0, regroup), tuple(received.sum(0).tolist()), across, "flat", n,
                      torch.argsort(regroup), ((send, recv, self.group_or_none, rows, pair_weights, n),))

    def _dispatch_two_stage(self, tokens, indices, weights, header) -> Routed:
        layout, split = self.layout, self.split
        nodes, k = split.nodes, self.top_k
        # stage 1: across nodes, one row per (token, destination node)
        if header[0]:
            rows1 = torch.zeros(0, dtype=torch.int64)
            counts1 = torch.zeros(nodes, dtype=torch.int64)
        else:
            experts = indices.to(torch.int64).cpu()
            dest = self.node_of_expert[experts]  # [n, k]
            on_node = dest.unsqueeze(1) == torch.arange(nodes).view(1, nodes, 1)  # [n, nodes, k]
            wanted = on_node.any(2)  # [n, nodes]
            pairs = wanted.t().nonzero()  # (node, token), by node then token
            node1, rows1 = pairs[:, 0], pairs[:, 1]
            counts1 = torch.bincount(node1, minlength=nodes)
        received1, problem = self._counts(counts1.view(nodes, 1), header, self.across_group_or_none,
                                          self.across_members)
        # stage 2's counts exchange tells the rest of the node about a problem seen in stage 1
        if problem[0]:
            header = [*problem[:3], *header[3:]]
        send1, recv1 = counts1.tolist(), received1.view(-1).tolist()
        if not header[0]:
            mask = on_node[rows1, node1]  # [rows, k]: which of the token's slots are on that node
            ids = torch.where(mask, experts[rows1], torch.full_like(experts[rows1], -1))
            device_rows = rows1.to(tokens.device)
            slot_weights = weights.index_select(0, device_rows) * mask.to(weights.device, weights.dtype)
            moved1 = _Exchange.apply(tokens.index_select(0, device_rows), send1, recv1, self.across_group_or_none)
            ids1 = _all_to_all(ids.to(self.device), send1, recv1, self.across_group_or_none).cpu()
            weights1 = _Exchange.apply(slot_weights, send1, recv1, self.across_group_or_none)
            # stage 2: inside the node, from the forwarding member to each expert
            flat = ids1.reshape(-1)
            slots = torch.nonzero(flat >= 0).view(-1)
            slots = slots[torch.argsort(flat[slots], stable=True)]
            rows2 = slots // k
            per_expert = torch.bincount(flat[slots], minlength=layout.num_experts).view(layout.ep_size, -1)
            counts2 = per_expert[list(split.members[self.node])]
        else:
            counts2 = torch.zeros(split.per_node, layout.experts_per_rank, dtype=torch.int64)
        received2, problem = self._counts(counts2, header, self.inside_group_or_none, self.inside_members)
        self._raise(problem, "dispatch", DISPATCH_SHAPE)
        send2, recv2 = counts2.sum(1).tolist(), received2.sum(1).tolist()
        device_rows2 = rows2.to(tokens.device)
        moved2 = _Exchange.apply(moved1.index_select(0, device_rows2), send2, recv2, self.inside_group_or_none)
        regroup = _regroup(received2).to(tokens.device)
        forward_weights = weights1.reshape(-1).index_select(0, slots.to(weights1.device))
        across = sum(count for node, count in enumerate(send1) if node != self.node)
        return Routed(moved2.index_select(0, regroup), tuple(received2.sum(0).tolist()), across, "hierarchical",
                      tokens.shape[0], torch.argsort(regroup),
                      ((send1, recv1, self.across_group_or_none, device_rows, None, tokens.shape[0]),
                       (send2, recv2, self.inside_group_or_none, device_rows2, forward_weights, sum(recv1))))

    # --- combine --------------------------------------------------------------------------------

    def combine(self, expert_output: torch.Tensor, routed: Routed) -> torch.Tensor:
        """Every token's weighted sum of its experts' outputs, back on its owner: [n, h'].
        `expert_output` [m, h'] in `routed.expert_input`'s row order."""
        self._check_combine(expert_output, routed)
        back = expert_output.index_select(0, routed.restore)
        for send, recv, group, rows, pair_weights, size in reversed(routed.stages):
            back = _Exchange.apply(back, recv, send, group)
            if pair_weights is not None:  # the owner (flat) or the forwarding member (two-stage) weighs
                back = back * pair_weights.to(back.dtype).unsqueeze(1)
            back = back.new_zeros((size,) + tuple(back.shape[1:])).index_add(0, rows, back)
        return back

    def _check_combine(self, expert_output, routed) -> None:
        """The ranks agree on the outputs' type and width, and each gives one row per routed row."""
        problem = [0, 0]
        if not isinstance(expert_output, torch.Tensor):
            header = [SHAPE, 3, self.rank, 0, 0, self.top_k]
        else:
            if expert_output.dim() != 2 or expert_output.shape[0] != routed.expert_input.shape[0]:
                problem = [ROWS, expert_output.shape[0] if expert_output.dim() else 0]
            header = [*problem, self.rank, _types(expert_output.dtype),
                      expert_output.shape[-1] if expert_output.dim() == 2 else 0, self.top_k]
        group = self.group_or_none
        gathered = [header] if group is None else [list(h) for h in agreement.gather(header, group, self.device)]
        self._raise(_first_problem(gathered), "combine", COMBINE_SHAPE)

    # --- groups ---------------------------------------------------------------------------------

    @property
    def group_or_none(self):
        return self.group if self.layout.ep_size > 1 else None

    @property
    def across_group_or_none(self):
        return self.across if self.split.nodes > 1 else None

    @property
    def inside_group_or_none(self):
        return self.inside if self.split.per_node > 1 else None


def _first_problem(headers: list[list[int]]) -> list[int]:
    """The first reported problem, else the first disagreement with the first member."""
    for header in headers:
        if header[0]:
            return header[:3]
    first = headers[0]
    for header in headers[1:]:
        for code, at in ((DTYPE, 3), (WIDTH, 4), (OTHER_K, 5)):
            if header[at] != first[at]:
                return [code, (first[2] << 42) | (header[at] << 21) | first[at], header[2]]
    return [0, 0, 0]


# What each call's arguments must be, said when a rank's are not.
DISPATCH_SHAPE = ("tokens must be a tensor [n, hidden], indices and weights tensors [n, top_k] of one shape, "
                  "indices of an integer type")
COMBINE_SHAPE = "expert_output must be a tensor [rows, width], one row per routed.expert_input row"


def _describe(code: int, value: int, origin: int, experts: int, top_k: int, what: str, shape: str) -> str:
    at = f"{what} on rank {origin}"
    if code == OUT_OF_RANGE:
        return f"{at}: expert index {value} is outside 0..{experts - 1} (the layer's {experts} experts): route to those"
    if code == TOP_K:
        return f"{at}: indices have {value} experts per token, the dispatcher's top_k is {top_k}: give [n, {top_k}]"
    if code == REPEATED:
        return f"{at}: expert {value} appears twice in one token's top-k: route each token to {top_k} distinct experts"
    if code == SHAPE:
        return f"{at}: {shape}"
    if code == ROWS:
        return f"{at}: expert_output has {value} rows, not the dispatched rows: give one output row per input row"
    if code in (DTYPE, WIDTH, OTHER_K):
        other, mine, theirs = value >> 42, (value >> 21) & (2**21 - 1), value & (2**21 - 1)
        if code == DTYPE:
            return f"{at}: {_type_names(mine)}, rank {other} {_type_names(theirs)}: every rank must {what} one type"
        if code == WIDTH:
            return f"{at}: rows of width {mine}, rank {other} {theirs}: every rank must {what} rows of one width"
        return f"{at}: top_k {mine}, rank {other} {theirs}: build every rank's dispatcher with one top_k"
    return f"{at}: problem code {code} ({value})"


def _types(*dtypes) -> int:
    """The types of a call's tensors (tokens, router weights) as one number compared across ranks."""
    return sum((1 + min(agreement.dtype_code(dtype), 30)) << (5 * index) for index, dtype in enumerate(dtypes))


def _type_names(code: int) -> str:
    names = [agreement.dtype_name((code & 31) - 1), agreement.dtype_name((code >> 5) - 1)]
    return f"{names[0]} tokens with {names[1]} weights" if code >> 5 else f"{names[0]} outputs"


_GROUPS: dict[tuple, object] = {}


def _group(ranks: tuple[int, ...]):
    """A process group of `ranks`, made once per default group (every rank builds the same
    dispatchers in the same order, so every rank makes the same groups in one order)."""
    key = (id(dist.group.WORLD), tuple(ranks))
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(ranks=list(ranks))
    return _GROUPS[key]


def _world(ranks: tuple[int, ...]):
    return dist.group.WORLD if list(ranks) == list(range(dist.get_world_size())) else _group(ranks)
