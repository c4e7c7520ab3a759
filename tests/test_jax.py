"""synth.jax: every program of ReduceScatter/AllReduce/AllGather of up to 4 steps of every
8-device case, run in shard_map on 8 forced host CPU devices, equals one psum; the others
are refused saying why. JAX runs in a subprocess, since the device count is fixed when it
starts (XLA_FLAGS=--xla_force_host_platform_device_count=8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from export_cases import CASES, programs_of
from synth.errors import UsageError
from synth.jax import expressible, why_not_expressible
from synth.language import parse_program

CHECK = r"""
import json, sys
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh
from export_cases import CASES, programs_of
from synth.jax import expressible, program_body, shard_map_function

assert len(jax.devices()) == 8, jax.devices()
results = []
for case in CASES:
    hierarchy = case.built
    n = hierarchy.group_size
    names = ("rest",) + hierarchy.level_names
    mesh = Mesh(np.array(jax.devices()).reshape((8 // n,) + hierarchy.sizes), names)
    axes = names
    levels = hierarchy.level_names
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(-50, 50, size=(8 * n * 3,)).astype(np.float32))
    expected = shard_map_function(mesh, lambda v: jax.lax.psum(v, levels), axes)(x)
    for program in programs_of(case, MAX_LEN):
        if not expressible(program):
            continue
        got = shard_map_function(mesh, program_body(program, hierarchy), axes)(x)
        results.append({"case": case.name, "program": str(program), "equal": bool(jnp.array_equal(got, expected)),
                        "changed": not bool(jnp.array_equal(got, x))})
print(json.dumps(results))
"""


def test_only_reduce_scatter_all_reduce_all_gather_over_inside_group_and_parallel_are_expressible():
    assert expressible("ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); AllGather(InsideGroup(gpu))")
    assert "no root" in why_not_expressible(parse_program("Reduce(InsideGroup(gpu)); Broadcast(InsideGroup(gpu))"))
    assert "leave some of its devices out" in why_not_expressible(parse_program("AllReduce(Master(node))"))


def test_an_inexpressible_program_is_refused():
    pytest.importorskip("jax")
    from synth.jax import program_body

    case = CASES[0]
    with pytest.raises(UsageError, match="cannot run in shard_map.*Reduce"):
        program_body("Reduce(InsideGroup(gpu)); AllReduce(Master(node)); Broadcast(InsideGroup(gpu))", case.built)


@pytest.mark.parametrize("max_len", [3, pytest.param(4, marks=pytest.mark.slow)])
def test_every_expressible_program_equals_one_psum(max_len):
    """Programs up to length 3 by default; up to 4 (three times as many) with `-m slow`."""
    pytest.importorskip("jax", reason="jax is not installed (pip install jax; it is in the test extra)")
    environment = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
                       PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", CHECK.replace("MAX_LEN", str(max_len))], capture_output=True, text=True, env=environment,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    expected = sum(1 for case in CASES for program in programs_of(case, max_len) if expressible(program))
    assert len(rows) == expected > 10
    assert {row["case"] for row in rows} == {case.name for case in CASES}
    assert not [row for row in rows if not row["equal"]], [row for row in rows if not row["equal"]][:5]
    assert all(row["changed"] for row in rows)
    assert any(row["program"].count("ReduceScatter") and row["program"].count("AllGather") for row in rows)
