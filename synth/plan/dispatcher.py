"""Which token dispatcher a MoE plan runs: one decision, read by the launch (Megatron-LM's
`--moe-token-dispatcher-type`, synth/plan/launch.py) and by the price (the expert term,
synth/plan/terms/expert.py), so that the plan prices the exchange its launch line runs.

Megatron-LM's dispatchers (megatron-core's TransformerConfig: moe_token_dispatcher_type,
moe_flex_dispatcher_backend): `alltoall` is one NCCL all-to-all over the expert-parallel group,
one copy per (token, expert): the flat form. The `flex` dispatcher's backends, DeepEP and
HybridEP, send a token once per destination host, to the member with the sender's own index
there, and forward it over NVLink to its experts (combine reversed, the partial outputs summed
on the forwarding member before they cross back): the two-stage form. It is chosen when:

* the expert-parallel groups span hosts (inside one host the two forms move the same bytes
  over the same NVLink and the flat call is Megatron's default);
* top-k > 1 (with one expert per token there is no copy to deduplicate);
* the system fits a backend: HybridEP on a multi-host NVLink domain (megatron-core: "only
  hybridep supports the MNNVL case"; NVIDIA's first choice on GB200 NVL72), DeepEP over a
  network; DeepEP takes no padded capacity (megatron-core refuses
  `--moe-pad-expert-input-to-capacity` with it), so a model with a capacity factor keeps
  `alltoall` there.

A "host" is the unit NVLink does not leave: the node, or with a multi-host NVLink domain its
hosts (the domain level's units). Without a topology every level above the innermost is taken
for a network between hosts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

FLAT, HIERARCHICAL = "flat", "hierarchical"
ALLTOALL = ("--moe-token-dispatcher-type", "alltoall")
PRICED_FLAT = "priced so: the flat all-to-all of the tokens' copies"
PRICED_TWO_STAGE = ("priced so: the fastest two-stage dispatch and combine programs of the model's routing "
                    "(the dispatch and combine goals)")
NO_EQUIVALENT = ("a synthesized dispatch or combine program other than the flat all-to-all and the two-stage form "
                 "(across nodes once per destination node, then inside it) has no equivalent among Megatron's "
                 "dispatchers; synth.torch.moe runs both forms in torch")


@dataclass(frozen=True)
class MoeDispatcher:
    """The token dispatcher Megatron-LM runs for the plan's expert-parallel groups."""

    arguments: tuple[str, ...]  # --moe-token-dispatcher-type alltoall|flex [--moe-flex-dispatcher-backend ...]
    form: str  # the synth.torch.moe form it runs and the expert term prices: "flat" or "hierarchical"
    statement: str
    host: int = -1  # hierarchical: the system level whose units are hosts; its stage 1 crosses levels 0..host


@dataclass(frozen=True)
class Hosts:
    """Where NVLink ends on a system: levels 0..`level` join hosts; `domain` when that is a
    multi-host NVLink domain's hosts (HybridEP) rather than a network (DeepEP)."""

    level: int | None
    domain: bool


@lru_cache(maxsize=64)
def system_hosts(topology) -> Hosts:
    """The host level of `topology` (module docstring); None: the system is one host."""
    from synth.model.nccl.hardware import nccl_view

    view = nccl_view(topology)
    if view.domain_level is not None:
        return Hosts(view.domain_level, True)
    return Hosts(view.node_level, False)


def choose_dispatcher(model, factors: tuple[int, ...], hosts: Hosts) -> MoeDispatcher | None:
    """The dispatcher for expert-parallel groups spanning `factors` units per system level
    (synth.plan.equivalent.span) on a system with `hosts`; None for a dense model. A pure
    function of its arguments, so the price may cache it."""
    if not model.is_moe:
        return None
    if all(factor == 1 for factor in factors):
        return MoeDispatcher(ALLTOALL, FLAT, "no expert parallelism: alltoall (the experts are local, nothing to price)")
    host = hosts.level
    if host is None or host < 0 or all(factor == 1 for factor in factors[:host + 1]):
        return MoeDispatcher(ALLTOALL, FLAT, "the expert-parallel groups stay inside one host: alltoall (one NCCL "
                             f"all-to-all over NVLink, the flat form, {PRICED_FLAT}); {NO_EQUIVALENT}")
    if model.top_k < 2:
        return MoeDispatcher(ALLTOALL, FLAT, "the expert-parallel groups span hosts, but each token goes to one "
                             "expert (top-1): no copy for a two-stage dispatch to deduplicate, alltoall (the flat "
                             f"form, {PRICED_FLAT}); {NO_EQUIVALENT}")
    if hosts.domain:
        return MoeDispatcher(("--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep"),
                             HIERARCHICAL, "the expert-parallel groups span hosts of a multi-host NVLink domain: "
                             f"flex with HybridEP (the two-stage form, {PRICED_TWO_STAGE}); {NO_EQUIVALENT}", host)
    if model.capacity_factor:
        return MoeDispatcher(ALLTOALL, FLAT, "the expert-parallel groups span nodes, where DeepEP's two-stage "
                             "dispatch would fit, but the plan pads to a capacity, which megatron-core refuses with "
                             f"DeepEP: alltoall (the flat form, {PRICED_FLAT}); {NO_EQUIVALENT}")
    return MoeDispatcher(("--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"),
                         HIERARCHICAL, "the expert-parallel groups span nodes: flex with DeepEP (across nodes to the "
                         f"same-index GPU once per node, then NVLink: the two-stage form, {PRICED_TWO_STAGE}); {NO_EQUIVALENT}", host)


def megatron_dispatcher(model, placement, topology=None, group=("ep",)) -> MoeDispatcher | None:
    """The dispatcher for the expert-parallel groups of `placement` on `topology` (module
    docstring); None for a dense model. `group`: the expert-parallel groups, the `ep` axis or
    a folded digit group (Degrees.expert_group, synth/plan/folding.py)."""
    if not model.is_moe:
        return None
    from synth.plan.equivalent import span

    if group == ("ep",) and "ep" not in placement.axis_names:
        factors = (1,) * len(placement.level_sizes)
    else:
        factors = span(placement, group)
    if all(factor == 1 for factor in factors):
        return choose_dispatcher(model, factors, Hosts(None, False))
    hosts = system_hosts(topology) if topology is not None else Hosts(len(factors) - 2, False)
    return choose_dispatcher(model, factors, hosts)
