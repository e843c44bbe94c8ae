"""Hugging Face ``Trainer``, Lightning and DeepSpeed: the metrics they already compute, with no line in the script.

``init_tracing()`` attaches a callback to every ``transformers.Trainer`` and every Lightning
``Trainer`` made afterwards (``JOBTRACE_INTEGRATIONS=0`` turns this off; the modules are patched when
the script imports them, never imported by jobtrace). Steps and phases come from the optimizer and
module hooks (:mod:`._autostep`) like any loop's; the callbacks add what only the framework knows:

* Hugging Face: every ``on_log`` (``logging_steps``): ``loss``, ``learning_rate`` as ``lr``,
  ``grad_norm``, ``epoch`` and any other number it logs (``eval_loss``…), at the optimizer step it
  belongs to; the run's shape (world size, batch, accumulation, model class) once at the start.
* Lightning: at each optimizer step, the training step's ``loss``, the first optimizer's ``lr``, and
  the scalars logged with ``self.log`` (``trainer.callback_metrics``).
* DeepSpeed (``DeepSpeedEngine``, patched the same way): at each gradient-accumulation boundary, the
  last ``backward``'s loss, ``lr``, the global grad norm, the fp16 ``loss_scale``, ``overflow`` with the
  ``attempted_loss_scale`` when the update was skipped, and ``skipped_steps``.

``hf_callback()`` and ``lightning_callback()`` give the callbacks for a script that adds its own.
Tensors are handed over as they are: a GPU value is read on the export thread, never with a sync
on the training thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ._post_import import when_imported

__all__ = ["bind", "hf_callback", "install", "lightning_callback"]

log = logging.getLogger("jobtrace.integrations")

_HF_NAMES = {"learning_rate": "lr"}
_HF_SKIP = frozenset({"total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second",
                      "train_loss", "step"})
"""End-of-training summaries: not a step's values."""


def _no_metrics(step: int | None = None, **values: Any) -> None:
    """Where the callbacks' values go before ``init_tracing`` binds them (nowhere)."""


_sink: Callable[..., None] = _no_metrics


def bind(log_metrics: Callable[..., None]) -> None:
    """Where the callbacks' values go: ``init_tracing`` passes the package's ``log_metrics``."""
    global _sink
    _sink = log_metrics


def _metrics() -> Callable[..., None]:
    return _sink


# ---- Hugging Face ------------------------------------------------------------------------------------------
_hf_class: type | None = None


def hf_callback() -> Any:
    """A ``transformers.TrainerCallback`` that records what the Trainer logs (see the module docstring)."""
    global _hf_class
    if _hf_class is None:
        from transformers import TrainerCallback

        class JobtraceCallback(TrainerCallback):
            """jobtrace's: the Trainer's logs as metrics of the optimizer step they belong to."""

            def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
                log.info("transformers Trainer: world %s, per-device batch %s, gradient accumulation %s, max steps "
                         "%s, model %s", getattr(args, "world_size", "?"), getattr(args, "per_device_train_batch_size",
                         "?"), getattr(args, "gradient_accumulation_steps", "?"), getattr(state, "max_steps", "?"),
                         type(model).__name__ if model is not None else "?")

            def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                       **kw: Any) -> None:
                values = {}
                for key, value in (logs or {}).items():
                    if key in _HF_SKIP:
                        continue
                    number = _number(value)
                    if number is not None:
                        values[_HF_NAMES.get(key, key)] = number
                if values:
                    step = state.global_step - 1 if state.global_step else None  # logged after its optimizer step
                    _metrics()(step, **values)

        _hf_class = JobtraceCallback
    return _hf_class()


def _patch_hf(module: ModuleType) -> None:
    trainer = module.Trainer
    original = getattr(trainer.__init__, "__jobtrace_wrapped__", trainer.__init__)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        ours = type(hf_callback())
        if not any(isinstance(cb, ours) for cb in self.callback_handler.callbacks):
            self.add_callback(ours)

    __init__.__jobtrace_wrapped__ = original  # type: ignore[attr-defined]
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    trainer.__init__ = __init__


# ---- Lightning ---------------------------------------------------------------------------------------------
_lightning_classes: dict[str, type] = {}


def lightning_callback(package: str = "lightning.pytorch") -> Any:
    """A Lightning ``Callback`` (of ``lightning.pytorch`` or ``pytorch_lightning``) that records the loss, the
    learning rate and the logged scalars at each optimizer step."""
    cls = _lightning_classes.get(package)
    if cls is None:
        import importlib

        base = importlib.import_module(package).Callback

        class JobtraceLightningCallback(base):  # type: ignore[misc, valid-type]
            """jobtrace's: a Lightning training step's values as metrics of its optimizer step."""

            def __init__(self) -> None:
                super().__init__()
                self._seen = -1

            def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                                   batch_idx: int) -> None:
                step = trainer.global_step - 1
                if step < 0 or step == self._seen:  # no optimizer step since the last (accumulation)
                    return
                self._seen = step
                values: dict[str, Any] = {}
                loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
                if loss is not None and hasattr(loss, "detach"):
                    values["loss"] = loss.detach()
                optimizers = getattr(trainer, "optimizers", None) or []
                if optimizers and optimizers[0].param_groups:
                    values["lr"] = optimizers[0].param_groups[0].get("lr")
                for key, value in getattr(trainer, "callback_metrics", {}).items():
                    if key not in values and getattr(value, "numel", lambda: 1)() == 1:
                        values[key] = value.detach() if hasattr(value, "detach") else value
                if values:
                    _metrics()(step, **values)

        cls = _lightning_classes[package] = JobtraceLightningCallback
    return cls()


def _patch_lightning(package: str) -> Any:
    def patch(module: ModuleType) -> None:
        trainer = module.Trainer
        original = getattr(trainer.__init__, "__jobtrace_wrapped__", trainer.__init__)

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            ours = type(lightning_callback(package))
            if not any(isinstance(cb, ours) for cb in self.callbacks):
                self.callbacks.append(ours())

        __init__.__jobtrace_wrapped__ = original  # type: ignore[attr-defined]
        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        trainer.__init__ = __init__

    return patch


# ---- DeepSpeed ---------------------------------------------------------------------------------------------
def _patch_deepspeed(module: ModuleType) -> None:
    """``DeepSpeedEngine.backward`` keeps the loss; ``step`` records, at each accumulation boundary, the loss, the
    learning rate, the global grad norm, the loss scale, whether the update was skipped (fp16 overflow) and the
    engine's count of skipped steps."""
    engine = module.DeepSpeedEngine
    original_backward = getattr(engine.backward, "__jobtrace_wrapped__", engine.backward)
    original_step = getattr(engine.step, "__jobtrace_wrapped__", engine.step)

    def backward(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
        self._jobtrace_loss = loss.detach() if hasattr(loss, "detach") else loss
        return original_backward(self, loss, *args, **kwargs)

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = (getattr(self, "global_steps", None), getattr(self, "skipped_steps", None))
        scale_before = _ds_loss_scale(self)
        out = original_step(self, *args, **kwargs)
        if (getattr(self, "global_steps", None), getattr(self, "skipped_steps", None)) != before:
            _metrics()(self.global_steps - 1, **_ds_values(self, scale_before))
        return out

    for wrapper, original in ((backward, original_backward), (step, original_step)):
        wrapper.__jobtrace_wrapped__ = original  # type: ignore[attr-defined]
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    engine.backward = backward
    engine.step = step


def _ds_loss_scale(engine: Any) -> float | None:
    try:
        scale = engine._get_optimizer_loss_scale()  # noqa: SLF001 - the engine's own reading of it
    except Exception:  # noqa: BLE001 - an optimizer without one (fp32, bf16)
        return None
    return _number(scale)


def _ds_values(engine: Any, scale_before: float | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    loss = getattr(engine, "_jobtrace_loss", None)
    if loss is not None:
        values["loss"] = loss
    try:
        lrs = engine.get_lr()
        if lrs:
            values["lr"] = _number(lrs[0])
    except Exception:  # noqa: BLE001, S110 - no scheduler or optimizer to ask
        pass
    try:
        norm = engine.get_global_grad_norm()
        if norm is not None:
            values["grad_norm"] = norm
    except Exception:  # noqa: BLE001, S110
        pass
    scale = _ds_loss_scale(engine)
    if scale is not None:
        values["loss_scale"] = scale
    applied = getattr(engine, "was_step_applied", None)
    if callable(applied) and not applied():  # an fp16 overflow: the update was skipped
        values["overflow"] = 1.0
        if scale_before is not None:
            values["attempted_loss_scale"] = scale_before
    values["skipped_steps"] = getattr(engine, "skipped_steps", None)
    return {k: v for k, v in values.items() if v is not None}


def _number(value: Any) -> float | None:
    """A logged value as a float (a NaN loss included: it is the evidence), or None for text."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _failed(name: str, exc: BaseException) -> None:
    log.warning("jobtrace: could not attach to %s (%s: %s); it runs untraced by its callback", name,
                type(exc).__name__, exc)


def install() -> None:
    """Attach the callbacks to every Trainer made from now on (the modules are patched when imported)."""
    when_imported("transformers.trainer", _patch_hf, _failed)
    when_imported("lightning.pytorch.trainer.trainer", _patch_lightning("lightning.pytorch"), _failed)
    when_imported("pytorch_lightning.trainer.trainer", _patch_lightning("pytorch_lightning"), _failed)
    when_imported("deepspeed.runtime.engine", _patch_deepspeed, _failed)
