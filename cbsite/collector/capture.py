"""Capture: one forward of the whole model with a pre-hook on every submodule.

Each call of each module is recorded as a `Call` (args and kwargs cloned at hook time, because later
in-place ops change them), keyed by (path, call index), together with the grad mode and which input
tensors required grad, so a replay can reproduce exactly what the full model did.

Memory: a capture clones only the inputs of the paths asked for (the profiler captures
group by group and frees each group once measured), clones a tensor that several modules receive once,
and keeps no output and no autograd graph unless asked. Every capture also takes a census of every
module: calls, bytes of its inputs, and bytes autograd saved for backward while it ran (its graph),
which is what the profiler plans its memory with. A group's capture stops the forward as soon as every
module of the group has made its calls (`stop_after`): the rest of the model would run for nothing; and it keeps
nothing autograd saves (`census=False`), so it holds the model, its clones and what is alive at the moment, not a
whole forward's activations. The whole model's inputs need no forward: they are the batch (`root_calls`).
"""

from __future__ import annotations

import collections.abc
import contextlib
import copy
import dataclasses
import enum
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

import torch
from torch import nn
from torch._guards import detect_fake_mode
from torch.utils import _pytree as pytree

from cbsite.collector.memory import graph_size
from cbsite.errors import CbsiteError


@dataclass
class Call:
    """One captured call of one module: what it received, and under which autograd conditions."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    grad_enabled: bool
    # Per tensor leaf of (args, kwargs) in pytree order: did it require grad in the full model?
    requires_grad: list[bool]
    # Did the module write into an input during this call in the full model (an in-place activation)?
    # Seen by the capture from the inputs' version counters (tensors held in state objects too); None where it was
    # not watched.
    mutates_inputs: bool | None = None
    # Does an input hold state a call may change (a transformers cache, a list or a plain object: anything that is
    # not a tensor, an immutable value or a module)? Then args/kwargs hold a copy of it as of the call (`snapshot`),
    # and every replay gets a copy of its own.
    stateful: bool = False
    # ids of the tensors held in that state (snapshot copies) that required grad in the full model.
    state_grad: frozenset[int] = frozenset()
    # Did the call itself change that state (capture.state_signature before and after it)? None where not watched.
    state_changed: bool | None = None
    # Why the state could not be copied (`Type: error`): args/kwargs then hold the live objects, by reference, and
    # `state_signature` says what they were at the call.
    state_error: str | None = None
    state_signature: Any = None

    def replay_inputs(self, *, with_grad: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Fresh clones of the inputs; floating leaves that required grad require it again. State objects are copied
        again from the snapshot (never shared between replays); the tensors they hold are cloned where the call wrote
        into an input, else shared with the snapshot (nothing writes into them)."""
        flags = iter(self.requires_grad)
        share = self.mutates_inputs is False

        def state_tensor(t: torch.Tensor) -> torch.Tensor:
            y = t.detach() if share else t.detach().clone()
            if with_grad and id(t) in self.state_grad and (y.is_floating_point() or y.is_complex()):
                y.requires_grad_(True)
            return y

        memo: dict[int, Any] = {}

        def fresh(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                if self.state_error is None and is_state(x):
                    return copy_state(x, state_tensor, memo)
                return x
            wanted = next(flags)
            y = x.detach().clone()
            if with_grad and wanted and (y.is_floating_point() or y.is_complex()):
                y.requires_grad_(True)
            return y

        args, kwargs = pytree.tree_map(fresh, (self.args, self.kwargs))
        return args, kwargs

    def state_problem(self) -> str | None:
        """Why this call cannot be replayed as it was, or None: its state could not be copied, and the call changes
        it, or the rest of the forward changed it since (a replay would run on a state the model never had)."""
        if self.state_error is None:
            return None
        what = f"an input holds state that cannot be copied ({self.state_error})"
        if self.state_changed:
            return (f"{what}, and the call changes it: every replay would run on a state the model never had; make it "
                    "copyable (copy.deepcopy must work on it) to measure this component")
        if state_signature(self.args, self.kwargs) != self.state_signature:
            return (f"{what}, and the rest of the forward changed it after the call: a replay would run on a state the "
                    "model never had; make it copyable (copy.deepcopy must work on it) to measure this component")
        return None


# Inputs a replay may share with the capture: immutable values, and code. Anything else that is not a tensor or a
# module (a cache, a list inside an object, a plain object) is state the model may change as the forward goes on.
_ATOMIC = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout,
           torch.memory_format, torch.Size, enum.Enum, type, types.FunctionType, types.BuiltinFunctionType,
           slice, range, type(Ellipsis), frozenset)


def is_state(x: Any) -> bool:
    """Is this pytree leaf state a call may change (to be copied as of the call), not a tensor, value or module?"""
    return not isinstance(x, (torch.Tensor, nn.Module) + _ATOMIC)


def _walk(obj: Any) -> list[Any]:
    """Every object reachable from `obj` through containers, dataclass fields, `__dict__` and `__slots__`, `obj`
    included, each once; tensors and modules are reached but not entered. An explicit stack (see tensors_in)."""
    found: list[Any] = []
    seen: set[int] = set()
    todo = [obj]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        found.append(x)
        if isinstance(x, (torch.Tensor, nn.Module) + _ATOMIC):
            continue
        if isinstance(x, dict):
            todo.extend(list(x.keys()) + list(x.values()))
        elif isinstance(x, (list, tuple, set)):
            todo.extend(x)
        else:
            leaves, spec = pytree.tree_flatten(x)
            if not spec.is_leaf():
                todo.extend(leaves)
                continue
            if hasattr(x, "__dict__"):
                todo.extend(vars(x).values())
            for klass in type(x).__mro__:
                for name in getattr(klass, "__slots__", ()):
                    if isinstance(name, str) and hasattr(x, name):
                        todo.append(getattr(x, name))
    return found


def copy_state(obj: Any, tensor: Callable[[torch.Tensor], torch.Tensor], memo: dict[int, Any] | None = None) -> Any:
    """A deep copy of a state object in which every tensor it holds is `tensor(t)`, and every module and parameter is
    itself: never a copy of the model. `memo`: shared by the copies of one call's inputs, so an object two inputs
    hold stays one object. Raises what copy.deepcopy raises (an object that cannot be copied)."""
    memo = {} if memo is None else memo
    for x in _walk(obj):
        if id(x) in memo:
            continue
        if isinstance(x, (nn.Module, nn.Parameter)):
            memo[id(x)] = x
        elif isinstance(x, torch.Tensor):
            memo[id(x)] = tensor(x)
    return copy.deepcopy(obj, memo)


def state_signature(*objs: Any) -> tuple[Any, ...]:
    """What can be seen of the state objects in `objs` without copying them: each reachable object's identity and
    type, tensors' versions and shapes, values. Equal before and after a call that did not change them."""
    sig: list[Any] = []
    for leaf in pytree.tree_leaves(objs):
        if not is_state(leaf):
            continue
        for x in _walk(leaf):
            if isinstance(x, torch.Tensor):
                sig.append(("tensor", id(x), x._version, tuple(x.shape)))
            elif isinstance(x, _ATOMIC):
                sig.append(("value", type(x).__name__, repr(x)[:200]))
            else:
                size = len(x) if isinstance(x, (list, tuple, dict, set)) else None
                sig.append((type(x).__qualname__, id(x), size))
    return tuple(sig)


def refuse_iterators(batches: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]) -> None:
    """Refuse generator and iterator inputs up front: the first call uses them up, so every replay (and the
    FLOP count) would see an empty input and report nothing."""
    for i, (args, kwargs) in enumerate(batches):
        named = [(f"positional argument {k}", a) for k, a in enumerate(args)] + [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
        for where, value in named:
            bad = [x for x in pytree.tree_leaves(value) if isinstance(x, collections.abc.Iterator)]
            if bad:
                raise CbsiteError(
                    f"{where} of example batch {i} is (or holds) a {type(bad[0]).__name__}, an iterator: the first call would use "
                    "it up and every replay would see nothing; pass a list or tuple instead (e.g. list(...))"
                )


def moved(obj: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """Every tensor of a pytree on `device`; floating ones in `dtype` (ids and lengths keep theirs)."""
    def move(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        x = x.to(device)
        return x.to(dtype) if x.is_floating_point() else x

    return pytree.tree_map(move, obj)


def clone_detached(obj: Any) -> Any:
    """Deep-copy every tensor in a pytree (KeyedJaggedTensor is registered with pytree by torchrec)."""
    return pytree.tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, obj)


@dataclass
class Capture:
    """Everything one forward pass revealed: calls per module path, in call order, and a census."""

    calls: dict[str, list[Call]] = field(default_factory=dict)
    output: Any = None
    # The census covers every module, kept or not: calls per path, bytes of the distinct input tensors
    # of all its calls, bytes of the distinct storages autograd saved while it ran (its graph's size).
    counts: dict[str, int] = field(default_factory=dict)
    input_bytes: dict[str, int] = field(default_factory=dict)
    saved_bytes: dict[str, int] = field(default_factory=dict)
    output_bytes: dict[str, int] = field(default_factory=dict)  # distinct output tensors of all its calls (census)
    # False when a `keep_bytes` cap stopped the cloning: then `calls` is empty, only the census counts.
    complete: bool = True
    on_shapes: bool = False  # a census taken on fake tensors (capture_plan.census_on_shapes): no input was kept
    # Did the module write into an input in any call (seen from the inputs' version counters)? Every module's.
    mutates_inputs: dict[str, bool] = field(default_factory=dict)
    stopped_early: bool = False  # the forward stopped once the modules asked for had made their calls (`stop_after`)

    def call_count(self, path: str) -> int:
        return self.counts.get(path, len(self.calls.get(path, ())))

    def graph_bytes(self, path: str) -> int | None:
        """What one backward graph of `path` holds for one batch (memory.graph_size), or None where the census did
        not see it."""
        if path not in self.saved_bytes and path not in self.output_bytes:
            return None
        return graph_size(self.saved_bytes.get(path, 0), self.output_bytes.get(path, 0))

    def kept_bytes(self) -> int:
        """Bytes of the cloned inputs this capture holds (a tensor shared by several calls once)."""
        seen: dict[int, int] = {}
        for calls in self.calls.values():
            for call in calls:
                for t in tensors_in((call.args, call.kwargs)):
                    seen.setdefault(id(t), t.numel() * t.element_size())
        return sum(seen.values())


def module_paths(model: nn.Module) -> dict[int, str]:
    """id(module) -> FQN; a module shared by several parents keeps its first FQN."""
    return {id(m): name for name, m in model.named_modules()}


class _Cloner:
    """Clones input tensors once per forward: a tensor several modules receive (a block's input is its
    first norm's input) is stored once. Keyed by object and version, through a weak reference, so a
    freed tensor whose id is reused, or one changed in place since, gets its own clone."""

    def __init__(self) -> None:
        self.memo: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}

    def tensor(self, x: torch.Tensor) -> torch.Tensor:
        hit = self.memo.get(id(x))
        if hit is not None and hit[0]() is x and hit[1] == x._version:
            return hit[2]
        copy = x.detach().clone()
        try:
            self.memo[id(x)] = (weakref.ref(x), x._version, copy)
        except TypeError:  # a tensor subclass without weak references: cloned each time
            pass
        return copy

    def clone(self, obj: Any) -> Any:
        return pytree.tree_map(lambda x: self.tensor(x) if isinstance(x, torch.Tensor) else x, obj)

    def snapshot(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """`call`'s inputs as they are now: tensors cloned, and state objects (a cache the rest of the forward goes on
        changing) deep-copied with the tensors they hold cloned. A state that cannot be copied is kept by reference,
        with the reason and what it looked like (`Call.state_error`, `state_signature`)."""
        if not any(is_state(x) for x in pytree.tree_leaves((args, kwargs))):
            call.args, call.kwargs = self.clone(args), self.clone(kwargs)
            return
        call.stateful = True
        grad: set[int] = set()

        def held(t: torch.Tensor) -> torch.Tensor:
            y = self.tensor(t)
            if t.requires_grad:
                grad.add(id(y))
            return y

        memo: dict[int, Any] = {}

        def one(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return self.tensor(x)
            return copy_state(x, held, memo) if is_state(x) else x

        try:
            call.args, call.kwargs = pytree.tree_map(one, (args, kwargs))
            call.state_grad = frozenset(grad)
        except Exception as exc:  # noqa: BLE001 - the model's own objects: whatever deepcopy raises is the reason
            call.args, call.kwargs = self.clone(args), self.clone(kwargs)
            kinds = sorted({type(x).__name__ for x in pytree.tree_leaves((args, kwargs)) if is_state(x)})
            call.state_error = f"{', '.join(kinds)}: {type(exc).__name__}: {exc}"[:500]
            call.state_signature = state_signature(args, kwargs)


class _Enough(BaseException):
    """Raised by a post-hook once every module asked for has made its calls, or by a pre-hook where the kept inputs
    pass `keep_bytes` and the caller asked to stop there (`stop_past_keep`): the forward stops there.

    A BaseException, so a model's own `except Exception` cannot swallow it, and torch runs no other
    module's always-call hook while it unwinds (their state is thrown away with the capture)."""


def _drop_saved(t: torch.Tensor) -> None:
    return None


def _never_unpacked(packed: None) -> torch.Tensor:
    raise RuntimeError("a capture forward keeps no tensor for backward: differentiating through it is a cbsite bug")


def root_calls(args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool, mutates: bool | None) -> list[Call]:
    """The whole model's one call: its inputs are the batch itself, so no forward is needed to capture them (a
    capture's pre-hook on the root sees exactly these). `mutates`: what the census saw the model do to them."""
    leaves = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    call = Call(args=(), kwargs={}, grad_enabled=grad, requires_grad=[t.requires_grad for t in leaves], mutates_inputs=mutates)
    _Cloner().snapshot(call, args, kwargs)
    return [call]


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    # The storage itself (its C++ object), not its data pointer: a fake tensor's storage has no data (census on shapes).
    try:
        storage = t.untyped_storage()
        return storage._cdata, storage.nbytes()
    except (RuntimeError, NotImplementedError):  # sparse or wrapper tensors have no plain storage
        return id(t), t.numel() * t.element_size()


class _Hooks:
    """The hooks of one capture and what they collect into its Capture: every module's calls and input bytes, the
    kept (cloned) inputs of `keep`'s modules, and in a census what autograd saves per module (`pack`)."""

    def __init__(self, model: nn.Module, keep: set[str] | None, keep_bytes: int | None, census: bool,
                 stop_after: collections.abc.Mapping[str, int] | None, stop_past_keep: bool) -> None:
        self.result = Capture()
        self.keep, self.keep_bytes, self.census, self.stop_past_keep = keep, keep_bytes, census, stop_past_keep
        self.cloner = _Cloner()
        self.stack: list[str] = []
        self.saved_seen: dict[str, set[tuple[int, int]]] = {}
        self.kept = 0
        self.pending: dict[str, list[Any]] = {}  # per path, the calls running now (a module may call itself)
        # The model's own parameters and buffers are not the graph's: a Linear saves its weight, which exists anyway.
        own = list(model.parameters()) + list(model.buffers())
        self.static = {_storage_key(t) for t in own}
        fake_mode = detect_fake_mode()
        # A census on shapes: an op sees (and saves) the fake twin of a parameter, made once and kept alive here (a
        # freed one's storage address goes to the next).
        self.fakes = [fake_mode.from_tensor(t) for t in own] if fake_mode is not None else []
        self.static |= {_storage_key(t) for t in self.fakes}
        self.left = {p: n for p, n in (stop_after or {}).items() if n > 0}  # calls still to come per path

    def make_pre_hook(self, path: str) -> Callable[..., None]:
        def hook(module: nn.Module, hook_args: tuple[Any, ...], hook_kwargs: dict[str, Any]) -> None:
            self.before_call(path, hook_args, hook_kwargs)

        return hook

    def before_call(self, path: str, hook_args: tuple[Any, ...], hook_kwargs: dict[str, Any]) -> None:
        result, cloner = self.result, self.cloner
        flat = pytree.tree_leaves((hook_args, hook_kwargs))
        leaves = [x for x in flat if isinstance(x, torch.Tensor)]
        # Tensors held in state objects (a cache) are inputs too: kept in the snapshot, counted, watched for writes.
        held = list({id(t): t for t in leaves + [x for s in flat if is_state(s) for x in _walk(s)
                                                  if isinstance(x, torch.Tensor)]}.values())
        result.counts[path] = result.counts.get(path, 0) + 1
        distinct = {id(t): t.numel() * t.element_size() for t in held}
        result.input_bytes[path] = result.input_bytes.get(path, 0) + sum(distinct.values())
        self.stack.append(path)
        if result.complete and self.keep_bytes is not None:
            self.kept += sum(t.numel() * t.element_size() for t in held if id(t) not in cloner.memo)
            if self.kept > self.keep_bytes:
                result.complete = False
                result.calls.clear()  # a census only from here: what was cloned is let go
                cloner.memo.clear()
                if self.stop_past_keep:
                    raise _Enough
        call = None
        if result.complete and (self.keep is None or path in self.keep):
            call = Call(args=(), kwargs={}, grad_enabled=torch.is_grad_enabled(),
                        requires_grad=[t.requires_grad for t in leaves])
            cloner.snapshot(call, hook_args, hook_kwargs)  # as of now: the rest of the forward may change them
            result.calls.setdefault(path, []).append(call)
        # State the call may change: what it looked like before, to tell afterwards whether the call changed it.
        before = None
        if call is not None and call.stateful:
            before = call.state_signature if call.state_error is not None else state_signature(hook_args, hook_kwargs)
        live = (hook_args, hook_kwargs, before) if before is not None else None
        self.pending.setdefault(path, []).append((call, held, [t._version for t in held], live))

    def make_post_hook(self, path: str) -> Callable[..., None]:
        def hook(module: nn.Module, hook_args: Any, output: Any) -> None:
            self.after_call(path, output)

        return hook

    def after_call(self, path: str, output: Any) -> None:
        result = self.result
        if self.stack:
            self.stack.pop()
        if self.census:  # the plan reads it from the census; group captures skip the walk over every output
            outs = {id(t): t.numel() * t.element_size() for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)}
            result.output_bytes[path] = result.output_bytes.get(path, 0) + sum(outs.values())
        running = self.pending.get(path)
        if running:
            call, held, versions, live = running.pop()
            wrote = any(t._version != v for t, v in zip(held, versions))
            result.mutates_inputs[path] = result.mutates_inputs.get(path, False) or wrote
            if call is not None:
                call.mutates_inputs = wrote
            if live is not None:
                call.state_changed = state_signature(live[0], live[1]) != live[2]
        left = self.left
        if path in left:
            left[path] -= 1
            if left[path] <= 0:
                del left[path]
                if not left:
                    raise _Enough

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        # Attributed to every module running when autograd saves it: a module's graph includes its
        # children's. A detached alias is returned: nothing is copied, and no reference cycle is made (an
        # op that saves its own output would otherwise hold its grad_fn through the packed tensor, and the
        # whole graph would outlive the forward).
        key = _storage_key(t)
        if key in self.static:
            return t.detach()
        for path in set(self.stack):
            seen = self.saved_seen.setdefault(path, set())
            if key not in seen:
                seen.add(key)
                self.result.saved_bytes[path] = self.result.saved_bytes.get(path, 0) + key[1]
        return t.detach()

    def saved_tensors(self, grad: bool) -> contextlib.AbstractContextManager[Any]:
        """What autograd saves in the forward: counted in a census; in a capture forward that is not one, nothing is
        kept (no backward ever runs on it, and grad mode stays on, so the model takes the same path and its inputs
        require grad as in training: it holds the model, the inputs it clones and what is alive at the moment, not a
        whole forward's activations)."""
        if not grad:
            return contextlib.nullcontext()
        if self.census:
            return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        return torch.autograd.graph.saved_tensors_hooks(_drop_saved, _never_unpacked)


def capture(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    grad: bool,
    paths: Collection[str] | None = None,
    keep_output: bool = False,
    keep_bytes: int | None = None,
    census: bool = True,
    stop_after: collections.abc.Mapping[str, int] | None = None,
    stop_past_keep: bool = False,
    through: Sequence[tuple[nn.Module, Call]] | None = None,
    run: Callable[[], Any] | None = None,
) -> Capture:
    """Run one forward with pre-hooks (with kwargs) on every module; hooks are always removed.

    `paths`: whose inputs to keep (None: every module's). The census covers every module regardless.
    `keep_output`: keep the model's output, detached (no graph); off by default, since a language
    model's logits can outweigh everything else a capture holds.
    `keep_bytes`: stop cloning once the kept inputs pass this many bytes; the capture is then
    incomplete (`complete` False, no calls) and serves as a census only.
    `census`: also measure what autograd saves per module (`saved_bytes`); off where only inputs matter.
    `stop_after`: calls per path (the census's count for one forward); once every such path has made its
    calls, the forward stops and nothing after it runs (no output, no census of the rest). The collector
    already assumes a module makes the same calls in every batch (calls per batch are per-call divisors).
    `stop_past_keep`: the forward stops where the kept inputs pass `keep_bytes` (`stopped_early`, `complete`
    False): the caller takes the census on shapes instead (capture_plan.planned_captures).
    `through`: instead of the whole model's forward, these submodules' captured calls, replayed in order (each with
    fresh clones of its inputs and the grad mode it ran with): the inputs of the modules inside them, without the
    rest of the model running (capture_plan.GroupedCaptures, anchors). `args` and `kwargs` are then not used.
    `run`: instead of a forward of its own, a call that runs the model's forward anyway (`Rider`): the hooks ride on
    it, and grad mode and what autograd saves are left as that call has them. `args`, `kwargs` and `grad` are then
    not used, and a `run` that raises raises here.
    """
    hooks = _Hooks(model, None if paths is None else set(paths), keep_bytes, census, stop_after, stop_past_keep)
    result = hooks.result
    module_path = module_paths(model)
    handles = []
    try:
        # Per-module hooks: torchrec calls EmbeddingBags with keyword arguments only, and the global
        # pre-hook API cannot see kwargs.
        for module in model.modules():
            path = module_path[id(module)]
            handles.append(module.register_forward_pre_hook(hooks.make_pre_hook(path), with_kwargs=True))
            handles.append(module.register_forward_hook(hooks.make_post_hook(path), always_call=True))
        if run is not None:
            run()
            return result
        try:
            with torch.set_grad_enabled(grad), hooks.saved_tensors(grad):
                if through is None:
                    output = model(*args, **kwargs)
                else:
                    output = None
                    for module, call in through:
                        replay_args, replay_kwargs = call.replay_inputs(with_grad=call.grad_enabled)
                        with torch.set_grad_enabled(call.grad_enabled):
                            module(*replay_args, **replay_kwargs)
                        del replay_args, replay_kwargs
        except _Enough:
            result.stopped_early = True
            return result  # the partial forward's graph goes with the exception's frames
        if keep_output:
            result.output = pytree.tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, output)
        del output  # the graph of the whole forward goes with it
    finally:
        for handle in handles:
            handle.remove()
    return result


class Rider:
    """Captures `paths`' inputs of batch 0 during a forward of the whole model that runs anyway (the whole model's
    forward peak pass, measure.ComponentMeasurement `rider`), instead of a capture forward of their own.

    The clones it makes are allocations inside that pass's recording, so the peak pass leaves them out by their
    storage (`storages`, cpu_memory.peak_allocated `excluded`): the peak is the model's own. CPU only: CUDA's peak
    statistics cannot leave allocations out. The capture stands only where every path made as many calls as the
    census counted (`captured`); otherwise, or where the forward raised, there is none, and the group takes a
    forward of its own as before."""

    def __init__(self, model: nn.Module, paths: Sequence[str], counts: collections.abc.Mapping[str, int]) -> None:
        self.model = model
        self.paths = list(paths)
        self.counts = {p: counts.get(p, 0) for p in self.paths}
        self.captured: Capture | None = None

    def around(self, fn: Callable[[], Any]) -> Callable[[], None]:
        """`fn` (which runs the model's forward once) with this rider's hooks on."""

        def ridden() -> None:
            self.captured = None
            cap = capture(self.model, (), {}, grad=True, census=False, paths=self.paths, run=fn)
            if all(len(cap.calls.get(p, ())) == n for p, n in self.counts.items()):
                self.captured = cap

        return ridden

    def storages(self) -> set[int]:
        """The data pointers of the clones the ridden call made (the allocations its peak leaves out)."""
        if self.captured is None:
            return set()
        return {t.untyped_storage().data_ptr() for calls in self.captured.calls.values() for call in calls
                for t in tensors_in((call.args, call.kwargs))}


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside an output: pytree containers, dataclasses and plain objects' fields.

    An explicit stack, not a recursive closure: a nested function that calls itself is a reference
    cycle (function -> its cell -> function) that holds the found tensors, and with them a whole
    autograd graph, until the garbage collector runs.
    """
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    todo = [obj]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            found.append(x)
            continue
        leaves, spec = pytree.tree_flatten(x)
        if not spec.is_leaf():
            todo.extend(reversed(leaves))
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            todo.extend(reversed([getattr(x, f.name) for f in dataclasses.fields(x)]))
        elif hasattr(x, "__dict__") and not isinstance(x, (nn.Module, type)):
            todo.extend(reversed(list(vars(x).values())))
    return found


def describe(obj: Any) -> str:
    """A compact text of the inputs' structure, e.g. `f32[512,13], KJT(26 keys, B=512, 6412 ids)`."""
    def one(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            dtype = str(x.dtype).replace("torch.", "")
            short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "int64": "i64", "int32": "i32", "bool": "b"}
            return f"{short.get(dtype, dtype)}[{','.join(str(s) for s in x.shape)}]"
        kind = type(x).__name__
        if kind == "KeyedJaggedTensor":
            return f"KJT({len(x.keys())} keys, B={x.stride()}, {x.values().numel()} ids)"
        if kind == "KeyedTensor":
            return f"KeyedTensor({len(x.keys())} keys, {one(x.values())})"
        if isinstance(x, (list, tuple)):
            inner = ", ".join(one(v) for v in x[:8]) + (", …" if len(x) > 8 else "")
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k}: {one(v)}" for k, v in list(x.items())[:8]) + "}"
        return kind if x is not None else "None"

    args, kwargs = obj
    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)
