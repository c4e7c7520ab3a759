"""A regime's `link_s` stored compactly (synth.model.engine.StepRegime.of): sparse where few
links carry load, a `Palette` where few distinct values fill it; either way the same array, bit
for bit, and the same program times as the dense array gives."""

from __future__ import annotations

import numpy as np
import pytest

from synth.goals import BY_COLLECTIVE
from synth.model.engine import CostEngine, Palette, StepRegime, canonical_devices
from synth.model.estimate import LOCKSTEP, PIPELINED
from synth.plan.costs import CommunicationCosts
from synth.search.rank import Ranker
from tests.test_translated_groups import _resized

FIELDS = dict(algorithm="ring", latency_s=1e-5, drain_s=(1e-9,), links=(0,), chain_latency_s=1e-5,
              chain_drain_s=(1e-9,), extra_memory=0.0)


def test_a_palette_gives_back_the_array_bit_for_bit():
    generator = np.random.default_rng(3)
    alike = np.array([0.0, -0.0, 1e-9, 1e-9 * (1 + 2**-52), 3.5e-10, np.inf])
    array = alike[generator.integers(0, len(alike), 10_000)]
    palette = Palette.of(array)
    assert palette is not None and palette.codes.dtype == np.uint8 and len(palette.values) == len(alike)
    assert np.array_equal(palette.values[palette.codes].view(np.int64), array.view(np.int64))  # -0.0 kept
    assert Palette.of(np.arange(Palette.LARGEST, dtype=float)) is not None
    assert Palette.of(np.arange(Palette.LARGEST + 1, dtype=float)) is None
    assert Palette.of(np.array([], dtype=float)) is None  # an empty array stays as it is
    one = Palette.of(np.array([2.5]))
    assert one is not None and np.array_equal(one.values[one.codes], [2.5])


@pytest.mark.parametrize("values, kind", [((0.0, 0.0, 0.0, 2e-9), tuple), ((1e-9, 2e-9, 0.0, 1e-9), Palette),
                                          (tuple(np.arange(1.0, 41.0)), np.ndarray)])
def test_a_regime_stores_its_links_compactly_and_gives_them_back(values, kind):
    link_s = np.resize(np.array(values), 400)
    regime = StepRegime.of(link_s.copy(), **FIELDS)
    assert isinstance(regime.stored, kind)
    assert np.array_equal(regime.link_s, link_s) and regime.columns == len(link_s)
    assert (regime.busy_links is None) == (kind is not tuple)
    engine = CostEngine.__new__(CostEngine)
    engine.regimes = [regime, StepRegime.of(link_s[::-1].copy(), **FIELDS)]
    assert np.array_equal(engine.link_rows(), np.stack([link_s, link_s[::-1]]))


def _answers(context, engine, sizes):
    """Every program's time and the top 3 of two goals under both estimates."""
    found = []
    for goal in ("AllReduce", "AllGather"):
        for estimate in (PIPELINED, LOCKSTEP):
            ranker = Ranker(context, 3, estimate, engine=engine, goal=BY_COLLECTIVE[goal])
            found.append(ranker.times(ranker.every_program(), sizes).tolist())
            found += [[(row.program, row.time_s) for row in ranker.top(size, 3)] for size in sizes]
    return found


def test_palette_regimes_give_the_dense_regimes_program_times(monkeypatch):
    context = CommunicationCosts(_resized("dgx-h100-2x8x8", rack=4))._context((4, 2, 1))
    devices = canonical_devices(context)
    sizes = [1 << 10, 3 << 20, 1 << 30]
    compact = CostEngine(context, devices)
    compact_answers = _answers(context, compact, sizes)
    monkeypatch.setattr(Palette, "of", classmethod(lambda cls, array: None))
    dense = CostEngine(context, devices)
    assert _answers(context, dense, sizes) == compact_answers
    assert any(isinstance(regime.stored, Palette) for regime in compact.regimes)
    assert not any(isinstance(regime.stored, Palette) for regime in dense.regimes)
    assert len(compact.regimes) == len(dense.regimes)
    for x, y in zip(compact.regimes, dense.regimes):
        assert np.array_equal(x.link_s, y.link_s)
