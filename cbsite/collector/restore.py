"""The caller's model is left as it was found: `preserved(model)` around profiling.

Profiling runs the model's own modules: every forward updates what a module keeps per call (BatchNorm's
running statistics and `num_batches_tracked`, any buffer a module writes), dropout draws from the global
random generators, and a collection converts the model to the asked dtype and device in place. On exit
(also on an error or Ctrl-C) this puts back, bit for bit:

* every parameter and buffer: the same tensor objects, with their original values, dtype and device
  (values are kept as a CPU copy while profiling, so a GPU model costs host memory, not device memory;
  past `SPILL_BYTES` the copy goes to a temporary file and is read back memory-mapped, so a large model
  is not held twice in memory: at GPT-2 small the copy alone was 0.5 GB of the collection's peak);
* `requires_grad` and `.grad` of every parameter;
* the training flag of every module;
* the random states of torch (CPU, and CUDA when it was initialised), Python's `random` and numpy.

Parameters or buffers a module adds while profiling (lazy modules materialising) are kept: there was
nothing before to restore.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from cbsite.collector.memory import trim_heap


@dataclass
class _Tensor:
    """One parameter or buffer as found: the object, a tensor on its original storage, and its values."""

    obj: torch.Tensor
    data: torch.Tensor  # the original storage, dtype and device (kept alive: a conversion leaves it untouched)
    values: torch.Tensor | None  # a CPU copy of the original values (None: spilled to the file, under `key`)
    requires_grad: bool
    grad: torch.Tensor | None
    grad_values: torch.Tensor | None
    key: str = ""
    grad_data: torch.Tensor | None = None  # the gradient's original storage (a conversion swaps it in place)


def _cpu_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


SPILL_BYTES = 64 * 2**20  # values and gradients above this go to a temporary file instead of memory


def _keep(t: torch.Tensor, key: str, spill: bool) -> _Tensor:
    grad = t.grad if isinstance(t, nn.Parameter) else None
    return _Tensor(
        obj=t, data=t.data, values=None if spill else _cpu_copy(t), requires_grad=t.requires_grad,
        grad=grad, grad_values=None if grad is None or spill else _cpu_copy(grad), key=key,
        grad_data=None if grad is None else grad.data,
    )


def _nbytes(t: torch.Tensor) -> int:
    grad = t.grad if isinstance(t, nn.Parameter) else None
    return t.numel() * t.element_size() + (0 if grad is None else grad.numel() * grad.element_size())


def _spill(kept: dict[int, _Tensor], folder: Path) -> Path:
    """Write every kept value (and gradient) to one file; torch.save writes storages without copying them."""
    path = folder / "values.pt"
    torch.save({**{k.key: k.obj.detach() for k in kept.values()},
                **{k.key + ".grad": k.grad.detach() for k in kept.values() if k.grad is not None}}, path)
    return path


def _put_back(kept: _Tensor, spilled: dict[str, torch.Tensor] | None = None) -> None:
    if kept.values is not None:
        values = kept.values
    else:
        assert spilled is not None, "values are None only when spilled, and then the file's tensors are given"
        values = spilled[kept.key]
    grad_values = kept.grad_values if spilled is None else spilled.get(kept.key + ".grad")
    with torch.no_grad():
        kept.data.copy_(values)  # same dtype: a bitwise copy
        if kept.grad is not None and kept.grad_data is not None:
            if kept.grad.data.data_ptr() != kept.grad_data.data_ptr() or kept.grad.dtype != kept.grad_data.dtype:
                kept.grad.data = kept.grad_data
            if grad_values is not None:
                kept.grad.copy_(grad_values)
    t = kept.obj
    if t.data.data_ptr() != kept.data.data_ptr() or t.dtype != kept.data.dtype or t.device != kept.data.device:
        t.data = kept.data
    if isinstance(t, nn.Parameter):
        t.requires_grad_(kept.requires_grad)
        t.grad = kept.grad


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # never initialise CUDA just to save it
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with polars' and torch's stack
        pass
    else:
        state["numpy"] = numpy.random.get_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["random"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])


@contextlib.contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Profile `model` inside this block; on exit it is as it was found (see the module docstring)."""
    rng = _rng_state()
    modules = list(model.modules())
    training = [m.training for m in modules]
    slots: list[tuple[dict[str, Any], str, Any]] = []  # (module._parameters or ._buffers, name, object or None)
    unique: dict[int, torch.Tensor] = {}
    for m in modules:
        for table in (m._parameters, m._buffers):
            for name, t in table.items():
                slots.append((table, name, t))
                if t is not None:
                    unique.setdefault(id(t), t)  # a tied weight is kept once
    spill = sum(_nbytes(t) for t in unique.values()) > SPILL_BYTES
    kept = {i: _keep(t, str(n), spill) for n, (i, t) in enumerate(unique.items())}
    with tempfile.TemporaryDirectory(prefix="cbsite-preserved-") if spill else contextlib.nullcontext() as folder:
        path = _spill(kept, Path(folder)) if folder is not None else None  # a folder only when spilling
        try:
            yield
        finally:
            for table, name, t in slots:
                table[name] = t  # a conversion may have put new objects in (buffers always, parameters sometimes)
            # Gradients the profiling left (the whole-model step's last backward) go before the values are read back,
            # and the heap hands their pages back (tensors below glibc's mmap threshold are freed into its heap): both
            # at once raised dlrm medium's peak above the step's own.
            dropped = False
            for k in kept.values():
                if isinstance(k.obj, nn.Parameter) and k.obj.grad is not None and k.obj.grad is not k.grad:
                    k.obj.grad, dropped = None, True
            if dropped and path:
                trim_heap()
            spilled = torch.load(path, mmap=True, weights_only=True, map_location="cpu") if path else None
            for k in kept.values():
                _put_back(k, spilled)
            del spilled
            for m, flag in zip(modules, training):
                m.training = flag
            _set_rng_state(rng)
