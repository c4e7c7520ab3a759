"""The Python API: every package's declared public face resolves, `import synth` stays light,
the README's example runs, and the topology generators build what the TOML files would."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import synth
from synth.errors import UsageError
from synth.topology import three_level, two_level, uniform_topology
from synth.topology_file import load_topology

PACKAGES = ("synth", "synth.analysis", "synth.calibrate", "synth.emulate", "synth.execute", "synth.export",
            "synth.model", "synth.commands", "synth.plan")

EXAMPLE = '''
from synth import build_hierarchy, cost_context, enumerate_placements, parse_axes, rank_programs, two_level

topology = two_level(nodes=4, gpus=8, nics=2, nic_bandwidth="25 GB/s")  # or load_topology("dgx-a100-x4")
for placement in enumerate_placements(topology, parse_axes("data=8,model=4")):
    hierarchy = build_hierarchy(placement, ("data",))
    best = rank_programs(cost_context(hierarchy, topology), 256 * 2**20, max_len=4, top=1)[0]
    print(placement.to_text(), best.program, f"{best.time_s * 1e3:.2f} ms", f"{best.speedup:.2f}x")
'''


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves(package):
    module = importlib.import_module(package)
    assert isinstance(module.__all__, list) and len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"
    assert set(module.__all__) <= set(dir(module))


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError):
        synth.no_such_name  # noqa: B018


def test_import_synth_imports_nothing_heavy():
    code = ("import sys, synth, synth.analysis, synth.export, synth.execute, synth.plan; "
            "print(sorted(m for m in ('numpy', 'z3', 'networkx', 'lark', 'torch', 'rich') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_readme_api_example_runs(tmp_path):
    done = subprocess.run([sys.executable, "-c", EXAMPLE], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("[[") and line.endswith("x") for line in lines)
    # the default (pipelined) estimate's first choice on the placement whose groups share each node's two NICs
    assert "[[4,2],[1,4]] AllReduce(InsideGroup(gpu)); AllReduce(Master(node)); Broadcast(InsideGroup(gpu))" in done.stdout


# --- topology generators -----------------------------------------------------------------------------


def test_two_level_is_the_file_it_stands_for():
    made = two_level(4, 8, gpu_bandwidth="300 GB/s", node_bandwidth="25 GB/s", gpu_latency="3.4 us",
                     node_latency="9.6 us", nics=8, nic_bandwidth="200 Gb/s", name="dgx-a100-x4")
    loaded = load_topology("dgx-a100-x4")
    assert made.sizes == loaded.sizes and made.level_names == loaded.level_names
    for mine, theirs in zip(made.levels, loaded.levels):
        assert mine.bandwidth.value == pytest.approx(theirs.bandwidth.value)
        assert mine.latency.value == pytest.approx(theirs.latency.value)
        assert (mine.uplinks is None) == (theirs.uplinks is None)
        if mine.uplinks:
            assert (mine.uplinks.count, mine.uplinks.bandwidth.value) == (theirs.uplinks.count,
                                                                          pytest.approx(theirs.uplinks.bandwidth.value))
    assert all(figure.source == "given in code" for level in made.levels for figure in (level.bandwidth, level.latency))


def test_three_level_and_uniform_take_numbers_text_lists_and_dicts():
    made = three_level(2, 4, 8, rack_uplinks=(4, 50e9), source="my estimate")
    assert made.level_names == ("rack", "node", "gpu") and made.device_count == 64 and made.has_link_figures
    assert made.levels[0].uplinks.count == 4 and made.levels[0].uplinks.bandwidth.source == "my estimate"
    same = uniform_topology([("node", 2), ("gpu", 4)], {"gpu": "300 GB/s", "node": 25e9}, "5 us")
    assert [level.bandwidth.value for level in same.levels] == [25e9, 300e9]
    assert [level.latency.value for level in same.levels] == pytest.approx([5e-6, 5e-6])


@pytest.mark.parametrize("call", [
    lambda: uniform_topology("a=2,b=2", ["1 GB/s"], "1 us"),
    lambda: uniform_topology("a=2", "1 GB/s", "1 us", uplinks={"b": (1, "1 GB/s")}),
    lambda: uniform_topology("a=2", {"b": "1 GB/s"}, "1 us"),
    lambda: uniform_topology("a=2", "1e308 GB/s", "1 us"),
    lambda: uniform_topology("a=2", "1 GB/s", 1e308),
    lambda: uniform_topology("a=2", "1 GB/s", "5 meters"),
    lambda: two_level(0, 8),
    lambda: two_level(2048, 1024),
])
def test_generators_refuse_what_a_file_would(call):
    with pytest.raises(UsageError) as caught:
        call()
    assert "\n" not in str(caught.value)


# The README's ```python blocks run as written in tests/test_docs_examples.py (as scripts, in a
# copy of the checkout, with the README's other examples); not again here.


def test_the_planners_api_example_runs(tmp_path):
    """synth/plan/__init__.py's example: typed values in and out, no option names."""
    import synth.plan

    example = synth.plan.__doc__.split("For example:")[1]
    code = "\n".join(line[4:] for line in example.splitlines() if line.startswith("    "))
    root = str(Path(__file__).resolve().parent.parent)  # this checkout, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr
    estimated, best = done.stdout.splitlines()
    assert float(estimated) > 0 and best.startswith("dp=")
