"""One call that puts a reducer into a model's gradient reduction, and a check after every
backward that it did all of it.

`attach(reducer, model)`:
- DistributedDataParallel (the model itself or a submodule): `register_comm_hook` with the
  reducer's DDP hook, after checking DDP's process group is this rank's reduction group;
- FSDP2 (`fully_shard`): the reducer's hook on every sharded module (each layer and the root
  when sharded per layer: FSDP reduces each module's gradients separately and calls that
  module's own hook, so a hook on the root alone leaves every layer unreduced across the
  replicas), after checking each module is sharded on a 1-D mesh whose group has no rank of
  the reduction group but this one (on a 2-D mesh FSDP would all-reduce natively, and the
  hook again).

After every backward through the model (an autograd callback queued behind FSDP's own final
callback, so after its last reduction), every sharded module of the model, including those
sharded after `attach`, must still carry this reducer's hook: otherwise `MissingReductionError`
names them. FSDP calls a module's hook whenever it reduces that module's gradients, so a
module with the hook cannot be left unreduced; a backward that should not reduce (gradient
accumulation with `set_requires_gradient_sync(False)`) calls no hook and is not an error.

The hook cannot be set by hand: a module that owns no parameter (a root whose parameters are
all in its layers) has no parameter group, and FSDP drops a hook set on it without a word, so
the hook on such a root alone reduces nothing and nothing of the reducer ever runs to notice.
So `attach` is the one way in. Once a reducer exists, `FSDPModule.set_all_reduce_hook` given
the reducer, one of its methods, or a function or partial that refers to it (in its closure
or its globals) raises `ReducerSetupError` naming `reducer.attach(model)`, whatever the module
(`guard_fsdp_hooks` wraps FSDP's setter once; other hooks pass through unchanged);
`reducer.fsdp_all_reduce_hook` raises it too; and a reducer called from FSDP's reduction
other than through `attach`'s hook (set some way the setter did not see) raises it there.

What FSDP exposes publicly is `set_all_reduce_hook`, not a getter: the check reads the hook
back from FSDP's parameter groups (`_get_fsdp_state()._fsdp_param_groups[i]._all_reduce_hook`,
torch 2.6 to 2.13); where that is missing, `attach` refuses rather than run unchecked.
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.distributed as dist

from synth.torch.errors import HandSetHookError, MissingReductionError, ReducerSetupError

SHOWN = 6  # names listed in a message before "and N more"


def _names(names) -> str:
    names = list(names)
    shown = ", ".join(repr(name) for name in names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _fsdp_module_class():
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return None
    return FSDPModule


def fsdp_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every `fully_shard` module of the model, the root named '' ."""
    cls = _fsdp_module_class()
    return [] if cls is None else [(name, module) for name, module in model.named_modules() if isinstance(module, cls)]


def ddp_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    from torch.nn.parallel import DistributedDataParallel

    return [(name, module) for name, module in model.named_modules() if isinstance(module, DistributedDataParallel)]


def param_group_hooks(module) -> list:
    """The all-reduce hook of each of the module's FSDP parameter groups (None where unset)."""
    try:
        groups = module._get_fsdp_state()._fsdp_param_groups
        return [group._all_reduce_hook for group in groups]
    except AttributeError:
        raise ReducerSetupError(f"this torch ({torch.__version__}) keeps FSDP2's all-reduce hook where synth "
                                "cannot check it: use torch 2.6 to 2.13, or set the hooks yourself with "
                                "module.set_all_reduce_hook(reducer.fsdp_all_reduce_hook) on every fully_shard "
                                "module (unchecked)") from None


class ModuleHook:
    """The reducer's FSDP hook for one module: reduces, and notes which module it reduced."""

    __slots__ = ("reducer", "module")

    def __init__(self, reducer, module: torch.nn.Module):
        self.reducer = reducer
        self.module = module

    def __call__(self, tensor: torch.Tensor) -> None:
        self.reducer.reduced_modules.append(id(self.module))
        self.reducer._reduce_async(tensor).wait()


# --- the hook set by hand: refused --------------------------------------------------------------


def hand_set_hook_error(what: str) -> HandSetHookError:
    return HandSetHookError(
        f"{what} set by hand as an FSDP2 all-reduce hook: FSDP calls a module's own hook only, and drops one set on a "
        "module without parameters (a root whose parameters are all in its layers), so some sharded modules would "
        "go unreduced across the replicas without a word. Call reducer.attach(model) after the last fully_shard: "
        "it hooks every sharded module and checks each backward")


def _is_reducer(value) -> bool:
    return bool(getattr(type(value), "FSDP_HOOK_THROUGH_ATTACH", False)) or \
        bool(getattr(type(getattr(value, "__self__", None)), "FSDP_HOOK_THROUGH_ATTACH", False))


def refers_to_reducer(hook, depth: int = 2) -> bool:
    """The hook is a reducer, a method of one, or a partial or function that refers to one (in
    its arguments, closure or the globals its code names), `depth` wrappers deep."""
    if _is_reducer(hook):
        return True
    if depth == 0:
        return False
    if isinstance(hook, functools.partial):
        return any(refers_to_reducer(value, depth - 1) for value in (hook.func, *hook.args, *hook.keywords.values()))
    code = getattr(hook, "__code__", None)
    if code is None:
        return False
    values = []
    for cell in getattr(hook, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    names = getattr(hook, "__globals__", None) or {}
    values += [names[name] for name in code.co_names if name in names]
    return any(refers_to_reducer(value, depth - 1) for value in values)


def guard_fsdp_hooks() -> None:
    """Wrap FSDPModule.set_all_reduce_hook (once) so that a reducer set by hand raises."""
    cls = _fsdp_module_class()
    if cls is None or getattr(cls.set_all_reduce_hook, "synth_guard", False):
        return
    original = cls.set_all_reduce_hook

    @functools.wraps(original)
    def set_all_reduce_hook(self, hook, *args, **kwargs):
        if not isinstance(hook, ModuleHook) and refers_to_reducer(hook):
            raise hand_set_hook_error("a synth reducer")
        return original(self, hook, *args, **kwargs)

    set_all_reduce_hook.synth_guard = True
    cls.set_all_reduce_hook = set_all_reduce_hook


FSDP_REDUCE = "foreach_reduce"  # FSDP2's function that calls a module's all-reduce hook (torch 2.6-2.13)


def called_by_fsdp(frames: int = 8) -> bool:
    """Whether FSDP's reduction is among the last callers (the reducer's own frames aside)."""
    frame = sys._getframe(2)
    for _ in range(frames):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == FSDP_REDUCE and "fsdp" in code.co_filename:
            return True
        frame = frame.f_back
    return False


class Attachment:
    """What `attach` hooked (`kind`: "ddp" or "fsdp"; `modules`: their names, the root '');
    `remove()` stops the per-backward check (the hooks stay: FSDP and DDP cannot take them off)."""

    def __init__(self, reducer, model: torch.nn.Module, kind: str, modules: list[str]):
        self.reducer = reducer
        self.model = model
        self.kind = kind
        self.modules = tuple(modules)
        self.backwards_checked = 0
        self._queued = False
        self._handle = model.register_forward_hook(self._arm) if kind == "fsdp" else None

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    # --- the check after each backward ---------------------------------------------------------

    def _arm(self, module, args, output) -> None:
        """After a forward with gradients: check once the backward through its output ends."""
        if not torch.is_grad_enabled():
            return
        self._queued = False  # a backward that raised before its callbacks left it set
        from torch.utils._pytree import tree_leaves

        tensors = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
        if tensors:
            torch.autograd.graph.register_multi_grad_hook(tensors, self._backward_started, mode="any")

    def _backward_started(self, grad) -> None:
        if self._queued:
            return
        self._queued = True
        self.reducer.reduced_modules.clear()
        engine = torch.autograd.Variable._execution_engine
        # FSDP queues its final callback (which may still reduce) when the backward starts; ours,
        # queued from a callback, runs after every callback queued before it.
        engine.queue_callback(lambda: engine.queue_callback(self.check))

    def sharded_tree(self) -> list[tuple[str, object]]:
        """(name, module) of every sharded module FSDP reduces with the attached ones: those of
        the model, and those of the FSDP trees the model is part of (after FSDP's lazy
        initialization, every module of one root's tree; so a reducer attached to one layer sees
        that the others are not hooked)."""
        attached = fsdp_modules(self.model)
        found: dict[int, tuple[str, object]] = {}
        for _, module in attached:
            context = getattr(module._get_fsdp_state(), "_state_ctx", None)
            for state in getattr(context, "all_states", ()):
                if getattr(state, "_is_root", False) and state._modules:
                    for name, other in fsdp_modules(state._modules[0]):
                        found.setdefault(id(other), (name or "<root>", other))
        for name, module in attached:  # sharded after FSDP's lazy initialization: not in its tree
            found.setdefault(id(module), (name or "<root>", module))
        return list(found.values())

    def check(self) -> None:
        """Raise MissingReductionError unless every sharded module carries this reducer's hook."""
        self._queued = False
        self.backwards_checked += 1
        tree = self.sharded_tree()
        names = {id(module): name for name, module in tree}
        reduced = [names.get(key, "?") for key in self.reducer.reduced_modules]
        self.reducer.reduced_modules.clear()
        unset, foreign = [], []
        for name, module in tree:
            for hook in param_group_hooks(module):
                if not (isinstance(hook, ModuleHook) and hook.reducer is self.reducer):
                    (unset if hook is None else foreign).append(name)
        if unset or foreign:
            parts = []
            if unset:
                parts.append(f"{_names(unset)} {'has' if len(unset) == 1 else 'have'} no all-reduce hook")
            if foreign:
                verb = "has" if len(foreign) == 1 else "have"
                parts.append(f"{_names(foreign)} {verb} another hook than this reducer's")
            raise MissingReductionError(
                f"a backward ended without reducing every sharded module across the replicas: {'; '.join(parts)} "
                f"(this backward reduced {len(reduced)} module(s){': ' + _names(reduced) if reduced else ''}). "
                "Their gradients would differ between replicas. Call reducer.attach(model) after the last "
                "fully_shard call, and do not set other all-reduce hooks on the model")


def attach(reducer, model: torch.nn.Module) -> Attachment:
    """Hook `reducer` into every DDP or FSDP2 module of `model` (see the module docstring)."""
    if not isinstance(model, torch.nn.Module):
        raise ReducerSetupError(f"attach takes the model (a torch.nn.Module), got {type(model).__name__}")
    ddp = ddp_modules(model)
    sharded = fsdp_modules(model)
    if ddp and sharded:
        raise ReducerSetupError("the model has both DistributedDataParallel and fully_shard modules: attach the "
                                "reducer to one kind (FSDP2's replicate/shard, or DDP around an unsharded model)")
    if ddp:
        for name, module in ddp:
            _check_ddp_group(reducer, name, module)
            module.register_comm_hook(None, reducer.ddp_hook)
        return Attachment(reducer, model, "ddp", [name for name, _ in ddp])
    if not sharded:
        raise ReducerSetupError(
            f"{type(model).__name__} has no DistributedDataParallel and no fully_shard module to attach to: wrap it "
            "first (fully_shard(layer, mesh=mesh[shard]) for each layer, then fully_shard(model, mesh=mesh[shard]); "
            "or DistributedDataParallel(model, process_group=reducer.ddp_process_group()))")
    _check_fsdp_parameters(reducer, model, sharded)
    for name, module in sharded:
        param_group_hooks(module)  # refuses a torch whose hooks cannot be checked
        try:
            module.set_all_reduce_hook(ModuleHook(reducer, module))
        except ValueError as error:  # several parameter groups (per-parameter meshes)
            raise ReducerSetupError(f"module {name or '<root>'!r}: {error}") from None
    return Attachment(reducer, model, "fsdp", [name for name, _ in sharded])


def _check_ddp_group(reducer, name: str, module) -> None:
    group = getattr(module, "process_group", None)
    if group is None:
        return
    ranks = sorted(dist.get_process_group_ranks(group))
    mine = sorted(next(g for g in reducer.plan.reduction_groups if reducer.rank in g))
    if ranks != mine:
        raise ReducerSetupError(
            f"DistributedDataParallel{' ' + repr(name) if name else ''} runs over ranks {_names(ranks)}, the plan "
            f"reduces this rank's gradients over {_names(mine)}: give DDP the reduction group, "
            "DistributedDataParallel(model, process_group=reducer.ddp_process_group())")


def _check_fsdp_parameters(reducer, model: torch.nn.Module, sharded) -> None:
    """Every trainable parameter sharded by FSDP on a 1-D mesh across other replicas than the plan's."""
    from torch.distributed.tensor import DTensor

    mine = set(next(g for g in reducer.plan.reduction_groups if reducer.rank in g))
    loose, two_d, overlapping = [], [], []
    seen_meshes = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        if not isinstance(parameter, DTensor):
            loose.append(name)
            continue
        mesh = parameter.device_mesh
        if mesh.ndim != 1:
            two_d.append(name)
            continue
        if id(mesh) not in seen_meshes:
            seen_meshes[id(mesh)] = set(dist.get_process_group_ranks(mesh.get_group()))
        if seen_meshes[id(mesh)] & mine != {reducer.rank}:
            overlapping.append(name)
    if loose:
        raise ReducerSetupError(
            f"parameter(s) {_names(loose)} are in no fully_shard module: no one would reduce their gradients. "
            "Call fully_shard on the root model too (after its layers)")
    if two_d:
        raise ReducerSetupError(
            f"parameter(s) {_names(two_d)} are sharded on a 2-D mesh: FSDP then all-reduces them natively (HSDP) "
            "and the hook would reduce them a second time. Shard on the shard dimension only, "
            "fully_shard(module, mesh=mesh['shard']), and let the reducer reduce over the other")
    if overlapping:
        raise ReducerSetupError(
            f"parameter(s) {_names(overlapping)} are sharded over ranks that the plan also reduces over: shard over "
            "the mesh dimension the plan does not reduce (the plan reduces this rank with ranks "
            f"{_names(sorted(mine))})")
