"""One rank of the MoE dispatch and combine checks (tests/test_torch_moe.py runs it under
torchrun with gloo on 8 CPU processes).

For node layouts 2x4 and 4x2, top-k 1, 2 and 4, the flat and the two-stage form: an MoE layer
of 16 experts (2 per rank, each a small Linear) with uneven routing (ranks with 0 to 11 tokens,
no token routed to rank 7's experts, tokens with several experts on one node) run by
synth.torch.moe against a reference layer built from all_to_all_single as Megatron's alltoall
dispatcher does (permute by expert, exchange the counts, all_to_all_single, local experts,
reverse), written here independently with torch.distributed.nn's differentiable
all_to_all_single. Outputs and the gradients of the tokens, the router weights and the experts'
parameters are compared (float64); so are dispatchers built from the JSON plans `synth export
--collective dispatch|combine` wrote (--plans). Then bad input, each on one rank, must raise on
every rank.

Rank 0 writes a JSON report to --json-out.
"""

import argparse
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import synth  # noqa: F401  (installed)
except ImportError:  # run from a checkout: the repository root
    sys.path.insert(0, str(HERE.parent))

from synth.errors import UsageError  # noqa: E402
from synth.torch.errors import RankDisagreementError, RoutingError  # noqa: E402
from synth.torch.moe import TokenDispatcher  # noqa: E402
from synth.torch.moe_layout import ExpertLayout  # noqa: E402
from synth.torch.moe_plan import load_dispatch_plan  # noqa: E402
from worker_report import finish  # noqa: E402

EXPERTS, HIDDEN, WORLD = 16, 6, 8
TOKENS = (5, 0, 7, 3, 11, 1, 6, 9)  # per rank: uneven, rank 1 sends nothing


def routing(rank: int, top_k: int, salt: int):
    """Uneven routing: experts 14 and 15 (rank 7's) never chosen; a skew towards node 0."""
    generator = torch.Generator().manual_seed(100 * rank + salt)
    n = TOKENS[rank]
    scores = torch.rand(n, EXPERTS - 2, generator=generator) + torch.linspace(1, 0, EXPERTS - 2)
    indices = scores.topk(top_k, dim=1).indices
    weights = torch.softmax(torch.randn(n, top_k, generator=generator, dtype=torch.float64), 1)
    tokens = torch.randn(n, HIDDEN, generator=generator, dtype=torch.float64)
    return tokens, indices, weights


def local_experts(rank: int) -> torch.nn.ModuleList:
    per_rank = EXPERTS // WORLD
    layers = []
    for expert in range(rank * per_rank, (rank + 1) * per_rank):
        torch.manual_seed(expert)
        layers.append(torch.nn.Linear(HIDDEN, HIDDEN, dtype=torch.float64))
    return torch.nn.ModuleList(layers)


def run_experts(experts, rows: torch.Tensor, counts) -> torch.Tensor:
    pieces = torch.split(rows, list(counts))
    return torch.cat([torch.tanh(expert(piece)) for expert, piece in zip(experts, pieces)])


def reference(tokens, indices, weights, experts):
    """Megatron's alltoall dispatcher in plain torch: permute, counts, all_to_all_single, sort
    by local expert, experts, unsort, all_to_all_single back, unpermute with the weights."""
    n, k = indices.shape
    per_rank = EXPERTS // WORLD
    flat = indices.reshape(-1)
    order = torch.argsort(flat, stable=True)
    permuted = tokens[order // k]
    tokens_per_expert = torch.bincount(flat, minlength=EXPERTS)
    received = torch.empty_like(tokens_per_expert)
    dist.all_to_all_single(received, tokens_per_expert)
    send = tokens_per_expert.view(WORLD, per_rank).sum(1).tolist()
    recv = received.view(WORLD, per_rank).sum(1).tolist()
    got = dist_nn.all_to_all_single(permuted.new_empty(sum(recv), HIDDEN), permuted, recv, send)
    chunks = torch.split(got, received.tolist())  # [source][local expert]
    by_expert = [torch.cat([chunks[s * per_rank + e] for s in range(WORLD)]) for e in range(per_rank)]
    outputs = [torch.tanh(expert(rows)) for expert, rows in zip(experts, by_expert)]
    pieces = [torch.split(out, [int(received[s * per_rank + e]) for s in range(WORLD)]) for e, out in enumerate(outputs)]
    back_rows = torch.cat([pieces[e][s] for s in range(WORLD) for e in range(per_rank)])
    back = dist_nn.all_to_all_single(back_rows.new_empty(n * k, HIDDEN), back_rows, send, recv)
    weighted = back * weights.reshape(-1)[order].unsqueeze(1)
    return torch.zeros(n, HIDDEN, dtype=tokens.dtype).index_add(0, order // k, weighted)


def forward_backward(rank, top_k, salt, layer):
    """(output, token grad, weight grad, expert grads) of one layer run, from the same inputs."""
    tokens, indices, weights = routing(rank, top_k, salt)
    tokens.requires_grad_(True)
    weights.requires_grad_(True)
    experts = local_experts(rank)
    output, extra = layer(tokens, indices, weights, experts)
    upstream = torch.randn(output.shape, generator=torch.Generator().manual_seed(7 + rank), dtype=output.dtype)
    (output * upstream).sum().backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in experts.parameters()]
    return output.detach(), tokens.grad.clone(), weights.grad.clone(), grads, extra


def crossings(rank, indices, per_node) -> tuple[int, int]:
    """(pairs sent to other nodes, distinct (token, other node) pairs): flat and two-stage traffic."""
    node = rank // per_node
    dest = indices // (EXPERTS // WORLD) // per_node
    pairs = int((dest != node).sum())
    distinct = sum(len({int(d) for d in row} - {node}) for row in dest)
    return pairs, distinct


def compare(rank: int, dispatcher, top_k: int, salt: int, per_node: int) -> dict:
    """The dispatcher against the reference layer on one routing: the largest differences."""

    def ours(tokens, indices, weights, experts):
        routed = dispatcher.dispatch(tokens, indices, weights)
        outputs = run_experts(experts, routed.expert_input, routed.tokens_per_expert)
        return dispatcher.combine(outputs, routed), routed

    def theirs(tokens, indices, weights, experts):
        return reference(tokens, indices, weights, experts), None

    out, dx, dw, dp, routed = forward_backward(rank, top_k, salt, ours)
    ref, rdx, rdw, rdp, _ = forward_backward(rank, top_k, salt, theirs)
    _, indices, _ = routing(rank, top_k, salt)
    pairs, distinct = crossings(rank, indices, per_node)
    difference = lambda a, b: float((a - b).abs().max()) if a.numel() else 0.0  # noqa: E731
    return {"out": difference(out, ref), "tokens": difference(dx, rdx), "weights": difference(dw, rdw),
            "experts": max(difference(a, b) for a, b in zip(dp, rdp)),
            "expert_grad_norm": float(sum(g.abs().sum() for g in dp)),
            "received": sum(routed.tokens_per_expert), "across": routed.rows_across_nodes,
            "pairs_across": pairs, "distinct_across": distinct}


def check_plans(rank: int, paths: list[str]) -> list[dict]:
    """Each exported plan's program run by the dispatcher it builds, against the reference."""
    rows = []
    for path in paths:
        plan = load_dispatch_plan(path)
        per_node = len(plan.layout.nodes[0])
        row = compare(rank, TokenDispatcher.from_plan(plan), plan.top_k, 3, per_node)
        rows.append({"collective": plan.collective, "program": plan.program, "form": plan.form,
                     "nodes": [list(node) for node in plan.layout.nodes], **row})
    return rows


def check_equal(rank: int) -> list[dict]:
    rows = []
    for per_node in (4, 2):
        layout = ExpertLayout.uniform(WORLD, EXPERTS, per_node)
        for form in ("flat", "hierarchical"):
            for top_k in (1, 2, 4):
                dispatcher = TokenDispatcher(layout, top_k, form)
                row = compare(rank, dispatcher, top_k, per_node, per_node)
                _, indices, _ = routing(rank, top_k, per_node)
                rows.append({
                    "layout": f"{WORLD // per_node}x{per_node}", "form": form, "top_k": top_k, **row,
                    "several_on_one_node": int(any(len(set((token // (EXPERTS // WORLD) // per_node).tolist())) < top_k
                                                   for token in indices)),
                })
    return rows


def expect(errors, name, call, kinds=(RoutingError,)):
    try:
        call()
    except kinds as error:
        errors[name] = f"{type(error).__name__}: {error}"
    else:
        errors[name] = "no error"


def check_errors(rank: int) -> dict:
    errors = {}
    for form in ("flat", "hierarchical"):
        layout = ExpertLayout.uniform(WORLD, EXPERTS, 4)
        dispatcher = TokenDispatcher(layout, 2, form)
        tokens, indices, weights = routing(rank, 2, 1)
        if rank == 3:
            indices = indices.clone()
            indices[0, 1] = EXPERTS
        expect(errors, f"{form}/out_of_range", lambda: dispatcher.dispatch(tokens, indices, weights))
        tokens, indices, weights = routing(rank, 2, 1)
        if rank == 5:
            indices, weights = torch.cat([indices, indices[:, :1]], 1), torch.cat([weights, weights[:, :1]], 1)
        expect(errors, f"{form}/top_k", lambda: dispatcher.dispatch(tokens, indices, weights))
        tokens, indices, weights = routing(rank, 2, 1)
        if rank == 2:
            tokens = tokens.float()
        expect(errors, f"{form}/dtype", lambda: dispatcher.dispatch(tokens, indices, weights))
        tokens, indices, weights = routing(rank, 2, 1)
        if rank == 7:
            weights = weights.float()
        expect(errors, f"{form}/weights_dtype", lambda: dispatcher.dispatch(tokens, indices, weights))
        tokens, indices, weights = routing(rank, 2, 1)
        routed = dispatcher.dispatch(tokens, indices, weights)
        outputs = routed.expert_input if rank != 1 else routed.expert_input.float()
        expect(errors, f"{form}/combine_dtype", lambda: dispatcher.combine(outputs, routed))
        tokens, indices, weights = routing(rank, 2, 1)
        if rank == 6:
            indices = indices.clone()
            indices[0, 1] = indices[0, 0]
        expect(errors, f"{form}/repeated", lambda: dispatcher.dispatch(tokens, indices, weights))
        tokens, indices, weights = routing(rank, 2, 1)
        expect(errors, f"{form}/no_weights",
               lambda: dispatcher.dispatch(tokens, indices, weights if rank != 4 else None))
        tokens, indices, weights = routing(rank, 2, 1)
        routed = dispatcher.dispatch(tokens, indices, weights)
        outputs = routed.expert_input if rank != 0 else routed.expert_input[1:]
        expect(errors, f"{form}/combine_rows", lambda: dispatcher.combine(outputs, routed))
        # after all of that, the groups still work
        back = dispatcher.combine(routed.expert_input, routed)
        errors[f"{form}/still_works"] = float((back - tokens * weights.sum(1, keepdim=True)).abs().max()) \
            if back.numel() else 0.0
    expect(errors, "layout/ranks_per_node", lambda: ExpertLayout.uniform(WORLD, EXPERTS, 3), (UsageError,))
    expect(errors, "layout/experts", lambda: ExpertLayout.uniform(WORLD, 12, 4), (UsageError,))
    uneven = ExpertLayout.from_groups(EXPERTS, [range(8)], [[0, 1, 2], [3, 4, 5, 6, 7]])
    expect(errors, "layout/uneven_nodes", lambda: TokenDispatcher(uneven, 2, "hierarchical"), (UsageError,))
    expect(errors, "layout/other_world", lambda: TokenDispatcher(ExpertLayout.uniform(4, 8, 2), 2), (UsageError,))
    other = 2 if rank == 0 else 4
    expect(errors, "layout/disagree", lambda: TokenDispatcher(ExpertLayout.uniform(WORLD, EXPERTS, other), 2),
           (RankDisagreementError,))
    return errors


def check_subgroups(rank: int) -> dict:
    """Two EP groups of 4 (ranks 0-3 and 4-7), 2 ranks per node, 8 experts per group: the two-stage
    form against the flat one, inside each group."""
    layout = ExpertLayout.uniform(WORLD, 8, 2, ep_size=4)
    results = {}
    outs = []
    for form in ("flat", "hierarchical"):
        dispatcher = TokenDispatcher(layout, 2, form)
        generator = torch.Generator().manual_seed(rank)
        tokens = torch.randn(TOKENS[rank], HIDDEN, generator=generator, dtype=torch.float64)
        indices = torch.rand(TOKENS[rank], 8, generator=generator).topk(2, dim=1).indices
        weights = torch.rand(TOKENS[rank], 2, generator=generator, dtype=torch.float64)
        routed = dispatcher.dispatch(tokens, indices, weights)
        # expert e scales by e + 1: the group's own experts (ids inside the group)
        local = dispatcher.ep_rank * 2
        scale = torch.repeat_interleave(torch.tensor([local + 1.0, local + 2.0], dtype=torch.float64),
                                        torch.tensor(routed.tokens_per_expert))
        outs.append(dispatcher.combine(routed.expert_input * scale.unsqueeze(1), routed))
        want = (tokens.unsqueeze(1) * (weights * (indices + 1)).unsqueeze(2)).sum(1)
        results[form] = float((outs[-1] - want).abs().max()) if want.numel() else 0.0
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json-out")
    parser.add_argument("--plans", nargs="*", default=[])
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.distributed.nn's all_to_all_single
    report = {"equal": check_equal(rank), "plans": check_plans(rank, args.plans), "errors": check_errors(rank), "subgroups": check_subgroups(rank)}
    return finish(report, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
