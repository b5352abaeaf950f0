"""torch's compiler (``torch._dynamo``) imported only when something compiles: the one adapter of
torch's private ``_disable_dynamo`` mechanism.

torch.optim imports ``torch._dynamo`` the first time an optimizer is built or stepped, only to
tell dynamo what not to trace: about 1-1.5 s of a sweep's start on a 2-core CPU
(docs/speed.md#start-up), in every process that builds an optimizer, though no trial asks for
``train.compile``. Two wrappers do it:

- ``torch._disable_dynamo`` on ``Optimizer.add_param_group`` (so ``__init__``), ``zero_grad``,
  ``state_dict`` and ``load_state_dict``: it caches ``torch._dynamo.disable(fn)`` in ``fn``'s
  ``__dynamo_disable`` attribute. ``defer`` puts a stand-in there that calls ``fn`` as it is
  while dynamo is not imported (nothing can be tracing it then) and, once it is, makes and keeps
  what the wrapper would have made;
- ``_use_grad_for_differentiable`` on each optimizer's ``step``: it imports dynamo to call
  ``graph_break()`` around the step (a no-op outside a compile). ``defer`` puts a ``step`` in front
  of it that does the same without the import while dynamo is not imported, and is torch's own
  wrapper once it is.

What does not look as expected (another torch) is left as it is: dynamo is then imported as
before. Tested in tests/test_speed.py: no import, the same steps, torch's wrappers once dynamo is in.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

CACHE = "__dynamo_disable"  # the attribute torch/_compile.py's wrapper caches its result in
_deferred = False


def defer() -> None:
    """Keep torch.optim's methods from importing torch._dynamo until something else imports it
    (idempotent; nothing to do when dynamo is already imported)."""
    global _deferred
    if _deferred or "torch._dynamo" in sys.modules:
        return
    _deferred = True
    marker = torch._disable_dynamo(lambda: None).__code__  # the wrapper's own code object
    for cls in _optimizer_classes():
        for attr in vars(cls).values():
            if getattr(attr, "__code__", None) is not marker:
                continue
            closed = dict(zip(attr.__code__.co_freevars, (c.cell_contents for c in attr.__closure__)))
            fn = closed["fn"]
            if not hasattr(fn, CACHE):
                setattr(fn, CACHE, _Lazy(fn, bool(closed.get("recursive", True))))
        _defer_step(cls)


def _defer_step(cls: type) -> None:
    """``cls.step``, when it is torch's ``_use_grad_for_differentiable`` wrapper not yet hooked by
    an instance (``Optimizer._patch_step_function``), behind one that imports no dynamo."""
    from torch.optim import optimizer

    step: Callable[..., Any] | None = vars(cls).get("step")
    marker = optimizer._use_grad_for_differentiable(lambda: None).__code__
    if step is None or getattr(step, "__code__", None) is not marker or getattr(step, "hooked", False):
        return
    func = step.__wrapped__  # type: ignore[attr-defined]

    def use_grad(*args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" in sys.modules:  # dynamo is in: torch's own wrapper, graph breaks and all
            return step(*args, **kwargs)
        previous = torch.is_grad_enabled()
        try:  # what torch's wrapper does, less its graph breaks (no-ops outside a compile)
            torch.set_grad_enabled(args[0].defaults["differentiable"])
            return func(*args, **kwargs)
        finally:
            torch.set_grad_enabled(previous)

    cls.step = functools.update_wrapper(use_grad, func)  # type: ignore[attr-defined]


def _optimizer_classes() -> list[type]:
    """torch.optim.Optimizer and every optimizer class torch defines (the methods are on the base)."""
    seen: list[type] = []
    todo: list[type] = [torch.optim.Optimizer]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        subclasses: list[type] = cls.__subclasses__()
        todo += [sub for sub in subclasses if sub.__module__.startswith("torch.") and sub not in seen]
    return seen


class _Lazy:
    """Stands where torch caches ``torch._dynamo.disable(fn)``: calls ``fn`` directly while dynamo
    is not (fully) imported, else makes the real disabled function and puts it in its place."""

    def __init__(self, fn: Callable[..., Any], recursive: bool) -> None:
        self.fn, self.recursive = fn, recursive

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dynamo = sys.modules.get("torch._dynamo")
        disable = getattr(dynamo, "disable", None)
        if disable is None:  # not imported, or importing on another thread: nothing traces yet
            return self.fn(*args, **kwargs)
        real = disable(self.fn, self.recursive, wrapping=False)  # what torch/_compile.py would have cached
        setattr(self.fn, CACHE, real)
        return real(*args, **kwargs)
