"""The ranking's "how sure": the NCCL model's held-out error per size band and transport
(synth/model/heldout.py, written by benchmarks.fidelity), and wins within it marked as such."""

from __future__ import annotations

import json
from types import SimpleNamespace

from synth.commands.simulation import within_error
from synth.model import heldout
from synth.model.heldout import HeldOutError, band_of, held_out_error, held_out_for_group
from synth.topology_file import load_topology


def test_bands_and_classes():
    assert band_of(512 * 1024) == "< 1 MiB" and band_of(2 ** 20) == "1-64 MiB" and band_of(2 ** 26) == ">= 64 MiB"
    assert heldout.transport_class(1, "ib") == "one node" and heldout.transport_class(4, "socket") == \
        "across nodes, socket"


def test_every_class_of_the_table_has_both_figures_from_published_logs():
    assert heldout.HELD_OUT, "benchmarks.fidelity --write-model writes the table"
    for key, kinds in heldout.HELD_OUT.items():
        klass, band = key.split(" | ")
        assert band in {name for name, _, _ in heldout.BANDS}
        for kind in ("uncalibrated", "calibrated"):
            median, worst, logs, sizes = kinds[kind]
            assert 0 <= median <= worst and logs >= 1 and sizes >= logs


def test_a_group_reads_its_class_from_the_topology():
    topology = load_topology("hgx-h100-ib-4x8")
    across = held_out_for_group(topology, list(range(16)), 2 ** 30)
    inside = held_out_for_group(topology, list(range(8)), 2 ** 30)
    assert across.klass == "across nodes, ib" and inside.klass == "one node"
    assert not across.calibrated
    assert held_out_error(2, "ib", 2 ** 30, False) == across


def test_a_win_inside_the_median_error_is_not_a_win():
    error = HeldOutError("one node", ">= 64 MiB", 0.07, 0.3, 3, 13, False)
    assert within_error(SimpleNamespace(baseline=False, speedup=1.05), error)
    assert not within_error(SimpleNamespace(baseline=False, speedup=1.10), error)
    assert not within_error(SimpleNamespace(baseline=True, speedup=1.0), error)
    assert not within_error(SimpleNamespace(baseline=False, speedup=1.05), None)


def test_rank_states_the_held_out_error(capsys):
    from synth.cli import main

    main(["rank", "--topology", "hgx-h100-ib-4x8", "--axes", "data=8,model=4", "--reduce", "data", "--bytes", "256MiB",
          "--top", "2", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert all("held_out_error" in row and "within_model_error" in row for row in rows)
