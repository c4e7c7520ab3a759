"""Export to a JSON plan: every call of every rank, for runtimes other than torch and NCCL.

A plan is meant to be replayed without synth: take a buffer of `buffer.count` float32
elements per rank, and for each program run its steps in order; at each step every rank
that is not idle makes one call on its communicator with the offsets below. After the last
step every rank holds the sum over its reduction group (or, for another goal, what its
collective leaves: docs/model.md section 7; AllToAll sends block j of the range to key j and
receives key i's block as its block i). Schema (version 1)::

    {
      "format": "synth-plan", "version": 1,
      "generated_by": "synth 0.1.0",
      "command": "synth export ...",          # the command that wrote the file
      "topology": {"name": str, "levels": [{"name": str, "size": int}, ...]},  # outermost first
      "axes": [{"name": str, "size": int}, ...],
      "placement": [[int, ...], ...],          # M[axis][level], docs/model.md section 2
      "reduce": [axis name, ...],
      "hierarchy": {"kind": "merged" | "split" | "system",
                    "levels": [{"name": str, "size": int, "system_level": str, "axes": [str]}]},
      "reduction_groups": [[global rank, ...], ...],   # each indexed by member rank
      "world_size": int,                       # global ranks 0 .. world_size-1, as torchrun numbers them
      "buffer": {"dtype": "float32", "bytes": int, "count": int,   # elements per rank
                 "chunks": int, "chunk_count": int},               # N chunks of chunk_count elements
      "communicators": [                       # one NCCL split of the world communicator each
        {"id": int, "groups": [[global rank, ...], ...]}           # color = group index, key = index in group
      ],
      "programs": [{
        "text": str,                           # canonical program text (docs/model.md section 6)
        "label": str,
        "reduction_communicator": int,         # communicator id of the reduction groups
        "collective": str,                     # only for goals other than all-reduce (--collective):
                                               # reducescatter, allgather, alltoall, broadcast, reduce
        "final_places": [int, ...],            # reduce-scatter, all-gather, all-to-all: the place
                                               # block b ends at (reduce-scatter: rank key b's result)
        "steps": [{
          "index": int, "text": str, "collective": "Permute",
          "places": [int, ...]                 # every rank moves its chunk at place p to places[p]
        } | {
          "index": int, "text": str,
          "collective": "AllReduce" | "ReduceScatter" | "AllGather" | "Reduce" | "Broadcast" | "AllToAll",
          "communicator": int,
          "ranks": [                           # one entry per global rank, in rank order
            {"rank": int, "idle": true}        # a rank outside every group of the step
            | {"rank": int, "idle": false,
               "color": int, "key": int,       # group index; rank inside the communicator
               "members": [global rank, ...],  # the group, in key order
               "offset": int, "count": int,    # elements: the range the call spans
               "send_offset": int, "send_count": int,   # in-place NCCL pointers, elements
               "recv_offset": int, "recv_count": int,
               "root": int | null}             # key of the root (Reduce, Broadcast), else null
          ]
        }]
      }]
    }

Offsets are element indices into the rank's one buffer; the calls are in place.
`offset`/`count` is the range the call covers: the input of ReduceScatter (the rank keeps
block `key` of `count / len(members)` elements: `recv_*`), the output of AllGather (the rank
contributes block `key`: `send_*`), and the data of the others (`send_* = recv_*`).
Reduce leaves the non-root ranks' range undefined; a later step overwrites it.
"""

from __future__ import annotations

from synth.errors import UsageError
from synth.export import jsonfmt
from synth.export.plan import DTYPE, ITEMSIZE, Plan, buffer_count, call_buffers
from synth.export.provenance import Provenance
from synth.goals import ALL_REDUCE

FORMAT = "synth-plan"
VERSION = 1


def plan_document(plan: Plan, provenance: Provenance, metadata: dict, nbytes: int) -> dict:
    """The plan as the JSON value documented above; `metadata` holds topology, axes,
    placement, reduce, hierarchy and reduction groups (synth.export.provenance)."""
    chunks = {program.chunks for program in plan.programs}
    if len(chunks) != 1:
        raise UsageError("a JSON plan holds programs of one reduction request (one reduction group size)")
    n = chunks.pop()
    count = buffer_count(nbytes, n)
    chunk_count = count // n
    document = {"format": FORMAT, "version": VERSION, "generated_by": provenance.version,
                "command": provenance.command}
    document.update(metadata)
    document["world_size"] = plan.world_size
    document["buffer"] = {"dtype": DTYPE, "bytes": count * ITEMSIZE, "count": count, "chunks": n,
                          "chunk_count": chunk_count}
    document["communicators"] = [{"id": index, "groups": [list(group) for group in comm.groups]}
                                 for index, comm in enumerate(plan.communicators)]
    programs = []
    for program in plan.programs:
        steps = []
        for index, step in enumerate(program.steps):
            if step.places is not None:  # a local Permute: no communicator, no call
                steps.append({"index": index, "text": step.text, "collective": "Permute", "places": list(step.places)})
                continue
            comm = plan.communicators[step.communicator]
            ranks = []
            for rank, call in enumerate(step.calls):
                if call is None:
                    ranks.append({"rank": rank, "idle": True})
                    continue
                buffers = call_buffers(step.collective, call, chunk_count)
                ranks.append({"rank": rank, "idle": False, "color": call.color, "key": call.key,
                              "members": list(comm.groups[call.color]),
                              "offset": buffers.offset, "count": buffers.count,
                              "send_offset": buffers.send_offset, "send_count": buffers.send_count,
                              "recv_offset": buffers.recv_offset, "recv_count": buffers.recv_count,
                              "root": call.root})
            steps.append({"index": index, "text": step.text, "collective": step.collective,
                          "communicator": step.communicator, "ranks": ranks})
        entry = {"text": program.text, "label": program.label, "reduction_communicator": program.reduction}
        if not program.goal.is_all_reduce:  # the file names the goal by name; the default is not spelled
            entry["collective"] = program.goal.name
            if program.final_places is not None:
                entry["final_places"] = list(program.final_places)
        entry["steps"] = steps
        programs.append(entry)
    document["programs"] = programs
    return document


# Bytes of one rank's call object as render writes it, its member list apart (measured on the
# files of 512 to 8192 ranks), and of an idle rank's.
RANK_CALL_BYTES = 330
IDLE_RANK_BYTES = 40


def estimated_bytes(hierarchy, programs, goal=ALL_REDUCE) -> int:
    """About how large the file of these programs is, from their lowering alone: every rank
    lists its group's members at every step, so the file grows with ranks x group size (a
    group of 2^20 members is terabytes). Asked before `build_plan`, which is per rank."""
    from synth.lowering import lower

    world = hierarchy.placement.device_count
    groups = world // hierarchy.group_size
    per_member = len(str(world)) + 2
    total = 0
    for program in programs:
        for step in lower(program, hierarchy, goal).steps:
            active = groups * sum(len(call.members) for call in step.calls)
            members = groups * sum(len(call.members) ** 2 for call in step.calls)
            total += active * RANK_CALL_BYTES + members * per_member + (world - active) * IDLE_RANK_BYTES
    return total


def render(plan: Plan, provenance: Provenance, metadata: dict, nbytes: int) -> str:
    return jsonfmt.dumps(plan_document(plan, provenance, metadata, nbytes)) + "\n"
