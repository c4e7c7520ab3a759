"""synth.jax for the reduce-scatter, all-gather and all-to-all goals: every expressible program
of up to 4 steps of every 8-device case, run in shard_map on 8 forced host CPU devices, equals
JAX's own psum_scatter / all_gather / all_to_all (tiled, over the group's axes outermost
first), element for element; where a caller's call would lay blocks out otherwise (axis
order, tiled=False, another dimension), collective_body refuses. JAX runs in a subprocess,
since the device count is fixed when it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from export_cases import CASES
from synth.errors import UsageError
from synth.language import parse_program
from synth.search import Enumerator, SearchOptions, semantics_for

GOALS = ("reducescatter", "allgather", "alltoall")
PROGRAMS = {
    "reducescatter": "Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))",
    "allgather": "Permute(gpu,node); AllGather(Parallel(node)); AllGather(InsideGroup(gpu)); Permute(node,gpu)",
    "alltoall": "AllToAll(Parallel(node)); Permute(gpu,node); AllToAll(InsideGroup(gpu)); Permute(node,gpu)",
}

CHECK = r"""
import json
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh
from export_cases import CASES
from synth.jax import expressible, program_body, reference_call, shard_map_function
from synth.search import Enumerator, SearchOptions, semantics_for

assert len(jax.devices()) == 8, jax.devices()
results = []
for case in CASES:
    hierarchy = case.built
    n = hierarchy.group_size
    names = ("rest",) + hierarchy.level_names
    mesh = Mesh(np.array(jax.devices()).reshape((8 // n,) + hierarchy.sizes), names)
    rng = np.random.default_rng(0)
    for goal in %(goals)r:
        block = 3 if goal == "allgather" else n * 3  # an all-gather's input is one block per device
        x = jnp.asarray(rng.integers(-50, 50, size=(8 * block, 2)).astype(np.float32))
        expected = shard_map_function(mesh, reference_call(hierarchy, goal), names)(x)
        for program in Enumerator(semantics_for(hierarchy, goal=goal), SearchOptions(max_len=MAX_LEN)).programs():
            if not expressible(program):
                continue
            got = shard_map_function(mesh, program_body(program, hierarchy, collective=goal), names)(x)
            results.append({"case": case.name, "goal": goal, "program": str(program),
                            "equal": got.shape == expected.shape and bool(jnp.array_equal(got, expected))})
print(json.dumps(results))
""" % {"goals": GOALS}


def _run(code: str) -> subprocess.CompletedProcess:
    environment = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
                       PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=900)


@pytest.mark.parametrize("max_len", [3, pytest.param(4, marks=pytest.mark.slow)])
def test_every_expressible_program_of_every_goal_equals_jaxs_own_collective(max_len):
    """Programs up to length 3 by default; up to 4 with `-m slow`."""
    pytest.importorskip("jax", reason="jax is not installed (pip install jax; it is in the test extra)")
    from synth.jax import expressible

    result = _run(CHECK.replace("MAX_LEN", str(max_len)))
    assert result.returncode == 0, result.stderr[-4000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    expected = sum(1 for case in CASES for goal in GOALS
                   for program in Enumerator(semantics_for(case.built, goal=goal), SearchOptions(max_len=max_len)).programs()
                   if expressible(program))
    assert len(rows) == expected > 10
    assert {(row["case"], row["goal"]) for row in rows} == {(case.name, goal) for case in CASES for goal in GOALS}
    assert not [row for row in rows if not row["equal"]], [row for row in rows if not row["equal"]][:5]
    assert any("Permute" in row["program"] for row in rows)  # the permuting programs ran too


REORDERED = r"""
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh
from export_cases import CASES
from synth.jax import program_body, shard_map_function
hierarchy = CASES[0].built   # node=2, gpu=4
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("node", "gpu"))
x = jnp.arange(8 * 8, dtype=jnp.float32)
ours = shard_map_function(mesh, program_body(%r, hierarchy, collective="reducescatter"), ("node", "gpu"))(x)
swapped = shard_map_function(mesh, lambda v: jax.lax.psum_scatter(v, ("gpu", "node"), tiled=True), ("node", "gpu"))(x)
print(bool(jnp.array_equal(ours, swapped)))
""" % PROGRAMS["reducescatter"]


def test_the_axis_order_the_body_refuses_would_really_lay_blocks_out_otherwise():
    """Why collective_body refuses ("gpu", "node"): JAX's own call over that order differs."""
    pytest.importorskip("jax", reason="jax is not installed")
    result = _run(REORDERED)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("goal", GOALS)
def test_collective_body_takes_the_call_it_replaces(goal):
    pytest.importorskip("jax", reason="jax is not installed")
    from synth.jax import collective_body

    hierarchy = CASES[0].built
    assert callable(collective_body(PROGRAMS[goal], hierarchy, goal, ("node", "gpu")))
    with pytest.raises(UsageError, match="numbers the blocks in that axis order"):
        collective_body(PROGRAMS[goal], hierarchy, goal, ("gpu", "node"))
    with pytest.raises(UsageError, match="tiled=False"):
        collective_body(PROGRAMS[goal], hierarchy, goal, ("node", "gpu"), tiled=False)
    with pytest.raises(UsageError, match="not this hierarchy's group"):
        collective_body(PROGRAMS[goal], hierarchy, goal, "gpu")
    with pytest.raises(UsageError, match="dimension 0"):
        if goal == "alltoall":
            collective_body(PROGRAMS[goal], hierarchy, goal, ("node", "gpu"), split_axis=1, concat_axis=0)
        else:
            collective_body(PROGRAMS[goal], hierarchy, goal, ("node", "gpu"), dimension=1)


def test_goals_without_a_jax_collective_and_rooted_steps_are_refused():
    pytest.importorskip("jax", reason="jax is not installed")
    from synth.jax import program_body

    hierarchy = CASES[0].built
    for goal in ("broadcast", "reduce"):
        with pytest.raises(UsageError, match="no JAX counterpart"):
            program_body("Broadcast(InsideGroup(node))", hierarchy, collective=goal)
    with pytest.raises(UsageError, match="cannot run in shard_map.*Master"):
        program_body("AllGather(InsideGroup(gpu)); AllGather(Master(node)); Broadcast(InsideGroup(node))", hierarchy,
                     collective="allgather")


@pytest.mark.parametrize("goal", GOALS)
def test_best_expressible_is_the_goals_best_program_jax_can_run(goal):
    from synth.analysis.goal_rank import rank_goal
    from synth.hierarchy import build_hierarchy
    from synth.jax import best_expressible, expressible
    from synth.lowering import lower
    from synth.model.context import cost_context
    from synth.placement import make_placement, parse_axes
    from synth.topology_file import load_topology

    topology = load_topology("dgx-a100-x4")
    hierarchy = build_hierarchy(make_placement(topology, parse_axes("data=32"), [[4, 8]]), ("data",))
    best = best_expressible(hierarchy, topology, 2**16, max_len=4, collective=goal)
    lower(parse_program(best), hierarchy, goal)  # valid for the goal
    ranked = [str(row.program) for row in rank_goal(cost_context(hierarchy, topology, "nccl"), goal, [2**16], 4)[0]]
    assert best == next(text for text in ranked if expressible(text))
