"""Running exported programs: a local torchrun launcher, and the report of measured against
predicted times that `synth bench` writes. The emulated cluster's launcher (synth.emulate)
has the same signature as `torchrun`."""

from synth._lazy import lazy_exports

_EXPORTS = {
    "LaunchError": "synth.execute.launch", "LaunchResult": "synth.execute.launch", "torchrun": "synth.execute.launch",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
