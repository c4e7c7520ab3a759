"""The backends by name: `nccl` (NCCL as measured, synth/model/nccl/backend.py, loaded on first
use) and `gloo` (synth/model/algorithms.py). A module of its own so that neither the
algorithms nor the seam (synth/model/backend.py) imports a backend."""

from __future__ import annotations

from collections.abc import Mapping

from synth.errors import UsageError
from synth.model.algorithms import GLOO


class _Backends(Mapping):
    """The backends by name (module docstring)."""

    NAMES = ("nccl", "gloo")

    def __getitem__(self, name: str):
        if name == "nccl":
            from synth.model.nccl.backend import NCCL_MEASURED

            return NCCL_MEASURED
        if name == "gloo":
            return GLOO
        raise KeyError(name)

    def __iter__(self):
        return iter(self.NAMES)

    def __len__(self) -> int:
        return len(self.NAMES)


BACKENDS = _Backends()


def resolve_backend(backend):
    """A backend by name, or the backend object given (any synth.model.backend.CallModel)."""
    if not isinstance(backend, str):
        return backend
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    return BACKENDS[backend]
