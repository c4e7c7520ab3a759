"""What the reducer raises instead of letting replicas drift apart or ranks hang (no torch).

`ReducerSetupError` is a "called it wrong" error, raised before training: nothing to attach
to, a native HSDP mesh the hook would reduce a second time, a DDP process group that is not
the plan's reduction group, a reducer set by hand as an FSDP2 hook (`HandSetHookError`). The two others are raised during training, on every rank of the
group concerned, at the end of the backward (or the reduction) that went wrong:
`MissingReductionError` when a backward ended with gradients that were not reduced by the
plan (a sharded module whose hook was never set or was replaced), `RankDisagreementError`
when the ranks of a reduction group were about to run different programs (different plans,
or tensors of different sizes or types: one rank in float32, the others in bfloat16).
"""

from __future__ import annotations

from synth.errors import SynthError, UsageError


class ReducerSetupError(UsageError):
    """The model, the mesh or the process group does not fit the plan; the message names the fix."""


class HandSetHookError(ReducerSetupError):
    """A reducer given to FSDP2's `set_all_reduce_hook` by hand instead of `reducer.attach(model)`.
    Not an AttributeError, though `reducer.fsdp_all_reduce_hook` raises it: code that probes
    with `hasattr` or catches AttributeError to skip the hook would skip it silently."""


class RoutingError(UsageError):
    """An MoE layer's routing that cannot be dispatched (synth.torch.moe): an expert index out
    of range, top-k or shapes that do not match, ranks that send tokens of different types or
    widths. Raised on every rank of the expert-parallel group at once, naming the rank at fault."""


class NoRuntimeFormError(UsageError):
    """A dispatch or combine plan whose program the token dispatcher has no form for (it runs
    the flat all-to-all and the two-stage one): the message names the program."""


class MissingReductionError(SynthError, RuntimeError):
    """A backward ended without the reductions the attached model needed."""


class RankDisagreementError(SynthError, RuntimeError):
    """The ranks of a reduction group disagree on what to reduce: they would run different programs."""
