"""`synth tune`: the overrides where the model's fastest (algorithm, protocol) differs from NCCL's
pick, written as NCCL's example tuner plugin's CSV and read back by that plugin's own parser
(compiled from its public source, tests/data/nccl-tuner-example)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from synth.export import nccl_tuner
from synth.topology_file import load_topology

PLUGIN = Path(__file__).parent / "data" / "nccl-tuner-example"
FUNCS = {"broadcast": 0, "reduce": 1, "allgather": 2, "reducescatter": 3, "allreduce": 4}  # nccl/tuner.h ncclFunc_t
ALGOS = {"tree": 0, "ring": 1, "nvls": 4, "nvls_tree": 5, "pat": 6}  # NCCL_ALGO_*
PROTOS = {"ll": 0, "ll128": 1, "simple": 2}  # NCCL_PROTO_*


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler: the example tuner plugin cannot be built here")
    binary = tmp_path_factory.mktemp("tuner") / "driver"
    subprocess.run([compiler, "-I", str(PLUGIN / "nccl"), str(PLUGIN / "plugin.c"), str(PLUGIN / "driver.c"), "-o",
                    str(binary)], check=True, capture_output=True)
    return binary


def _ask(driver, path: Path, ranks: int, nodes: int, queries: list[tuple[str, int]]) -> list[tuple[int, int, int]]:
    text = "".join(f"{FUNCS[collective]} {nbytes}\n" for collective, nbytes in queries)
    done = subprocess.run([str(driver), str(ranks), str(nodes)], input=text, capture_output=True, text=True,
                          check=True, env={"NCCL_TUNER_CONFIG_FILE": str(path)}, timeout=60)
    return [tuple(int(x) for x in line.split()) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("name", ["dgx-h100-x2", "gb200-nvl72"])
def test_the_example_plugin_reads_every_override_as_written(run_cli, driver, tmp_path, name):
    path = tmp_path / "tuner.conf"
    code, out, err = run_cli("tune", "--topology", name, "-o", str(path))
    assert code == 0, err
    rows = [line.split(",") for line in path.read_text().splitlines() if line and not line.startswith("#")]
    assert rows, "the model differs from NCCL's pick somewhere on these systems"
    by_shape: dict[tuple[int, int], list] = {}
    for row in rows:
        assert len(row) == 10
        by_shape.setdefault((int(row[7]), int(row[6])), []).append(row)
    for (ranks, nodes), shape_rows in by_shape.items():
        queries = []
        for row in shape_rows:
            queries += [(row[0], int(row[1])), (row[0], int(row[2]))]
        answers = _ask(driver, path, ranks, nodes, queries)
        for index, row in enumerate(shape_rows):
            expected = (ALGOS[row[3]], PROTOS[row[4]], int(row[5]))
            assert answers[2 * index] == expected and answers[2 * index + 1] == expected, row
    # a communicator the file does not name: the plugin matches nothing
    assert _ask(driver, path, 3, 3, [("allreduce", 1 << 20)])[0][:2] == (-1, -1)


def test_overrides_are_where_the_model_and_nccl_disagree_and_disjoint():
    topology = load_topology("dgx-h100-x2")
    found = nccl_tuner.overrides(topology, ("AllReduce",))
    assert found.rows
    for row in found.rows:
        assert (row.algorithm, row.protocol) != (row.nccl_algorithm, row.nccl_protocol)
        assert row.model_s < row.nccl_s and row.channels >= 1
    shapes = {}
    for row in found.rows:
        shapes.setdefault((row.collective, row.nodes, row.ranks), []).append((row.min_bytes, row.max_bytes))
    for ranges in shapes.values():
        ranges.sort()
        assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))


def test_no_override_where_nccl_already_picks_the_fastest(run_cli, tmp_path):
    code, out, err = run_cli("tune", "--topology", "gcp-a3-mega-2x8", "--format", "env")
    assert code == 0, err
    assert "nothing to set" in out and "export" not in out


def test_the_simple_case_is_one_environment_setting():
    row = nccl_tuner.Override("AllReduce", 0, 100, "tree", "LL", 2, 2, 16, "ring", "LL", 1e-6, 2e-6)
    one = nccl_tuner.TunerExport((row,), frozenset({"tree"}), frozenset({"LL", "Simple"}))
    assert nccl_tuner.environment(one) == {"NCCL_ALGO": "Tree"}
    assert nccl_tuner.environment(nccl_tuner.TunerExport((), frozenset({"tree"}), frozenset({"LL"}))) == {}


def test_bad_input_is_one_line(run_cli):
    code, out, err = run_cli("tune", "--topology", "dgx-h100-x2", "--collective", "alltoall")
    assert code == 2 and "alltoall" in err and "\n" not in err.strip()


# ncclCollConfig_t as nccl.h declares it (2.31+, struct ncclCollConfig_v23200 in 2.32), with the
# types it needs: a stand-in header so the exported function compiles without NCCL installed.
COLL_CONFIG_HEADER = """
#include <stddef.h>
#include <stdint.h>
typedef struct ncclConfigExt ncclConfigExt_t;
typedef void* cudaEvent_t;
#define NCCL_CONFIG_UNDEF_INT (-2147483647 - 1)
#define NCCL_CONFIG_UNDEF_PTR NULL
typedef struct {
  size_t size; unsigned int magic; unsigned int version; ncclConfigExt_t* ext;
  int minCTAs; int maxCTAs; int nvlsCTAs; int cgaClusterSize;
  const char* algSelection; int forceAlgSelection; int CTAPolicy;
  uint64_t userProfilerTag; cudaEvent_t launchCompletionEvent;
} ncclCollConfig_t;
#define NCCL_COLLCONFIG_INITIALIZER {sizeof(ncclCollConfig_t), 0, 0, NCCL_CONFIG_UNDEF_PTR, \\
  NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, \\
  NCCL_CONFIG_UNDEF_PTR, 1, NCCL_CONFIG_UNDEF_INT, 0, NCCL_CONFIG_UNDEF_PTR}
"""

COLL_CONFIG_DRIVER = """
#include <stdio.h>
#include "synth_coll_config.h"
int main(int argc, char** argv) {
  char collective[32]; size_t bytes; int nodes, ranks;
  while (scanf("%31s %zu %d %d", collective, &bytes, &nodes, &ranks) == 4) {
    ncclCollConfig_t config = NCCL_COLLCONFIG_INITIALIZER;
    int hit = synthCollConfig(collective, bytes, nodes, ranks, &config);
    printf("%d %s %d %d\\n", hit, hit ? config.algSelection : "-", hit ? config.forceAlgSelection : -1,
           hit ? config.maxCTAs : -1);
  }
  return 0;
}
"""


def test_coll_config_values_compile_and_pick_the_model_s_algorithm(run_cli, tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler: the exported function cannot be built here")
    header = tmp_path / "synth_coll_config.h"
    code, out, err = run_cli("tune", "--topology", "dgx-h100-x2", "--format", "coll-config", "-o", str(header))
    assert code == 0, err
    (tmp_path / "nccl.h").write_text(COLL_CONFIG_HEADER)
    (tmp_path / "driver.c").write_text(COLL_CONFIG_DRIVER)
    binary = tmp_path / "driver"
    subprocess.run([compiler, "-I", str(tmp_path), str(tmp_path / "driver.c"), "-o", str(binary)], check=True,
                   capture_output=True)
    rows = [row for row in nccl_tuner.overrides(load_topology("dgx-h100-x2")).rows
            if row.algorithm != row.nccl_algorithm]
    assert rows, "the model picks another algorithm than NCCL somewhere on this system"
    queries = "".join(f"{row.collective.lower()} {row.min_bytes} {row.nodes} {row.ranks}\n" for row in rows)
    done = subprocess.run([str(binary)], input=queries + "allreduce 1024 3 3\n", capture_output=True, text=True,
                          check=True, timeout=60)
    answers = done.stdout.splitlines()
    for row, answer in zip(rows, answers):
        hit, selection, force, ctas = answer.split()
        assert (hit, selection, force, int(ctas)) == ("1", row.algorithm.replace("_", ""), "1", row.channels)
    assert answers[-1].startswith("0 ")  # a communicator the overrides do not name: NCCL's own choice


def test_coll_config_needs_nccl_2_31(run_cli, tmp_path):
    from dataclasses import replace

    from synth.topology_file import render_topology

    topology = load_topology("dgx-h100-x2")
    path = tmp_path / "old.toml"
    path.write_text(render_topology(replace(topology, nccl=replace(topology.nccl, version="2.30"))))
    code, out, err = run_cli("tune", "--topology", str(path), "--format", "coll-config")
    assert code == 2 and "2.31" in err and "\n" not in err.strip()
