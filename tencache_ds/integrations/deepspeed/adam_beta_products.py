"""DeepSpeedCPUAdam's running beta products, as its C++ side holds them. Owns: a model of the C++ optimizer's
``IncrementStep`` (csrc/includes/cpu_adam.h) fed with every update call the Python side makes, what a checkpoint keeps
of it (a key of stage 3's state dict, the ZeRO file's), and the calls that give a resumed run's C++ optimizer the
same products.

Why: the C++ side keeps beta1^t and beta2^t as running products, multiplied by the betas once a step while the
betas stay, and recomputed with ``pow`` where they change or the step jumps; ``pow`` and the running product differ
in the last bits. A fresh process recomputes them with ``pow`` at its first update: every loss from the second
resumed step on differs from the uninterrupted run's. What the uninterrupted run holds depends on the step the
products were last recomputed at, which no optimizer state records: a scheduler that cycles the betas (DeepSpeed's
OneCycle and torch's OneCycleLR/CyclicLR do by default) recomputes them every step, and the replay of the saved
betas from step 1 gave other bits than the uninterrupted run, where stock CPU offload's ``pow`` gave the right ones
(helper-222). This records that step; a checkpoint without it (saved before 2026-12-07, or by stock) is replayed
from the step counts with the saved betas (``step_product_calls``), right where the betas never changed.
"""
import dataclasses
import struct
from typing import List, Optional, Sequence, Tuple

import torch

SAVED_KEY = "tencache_adam_beta_products"  # in stage 3's state dict (stock's load reads its own keys by name)
_SCRATCH_NUMEL = 64  # what the C++ step is given while its products are replayed (any size would do)
_RESET = (float("nan"), float("nan"))  # differs from any betas: the branch that sets the step as given


def _as_float32(value: float) -> float:
    """``value`` as the C++ side holds it (pybind's ``float`` argument)."""
    return struct.unpack("f", struct.pack("f", value))[0]


@dataclasses.dataclass
class BetaProducts:
    """The C++ optimizer's state that its products follow from: at ``step``, with ``betas``, the products recomputed
    with ``pow`` at step ``since`` and multiplied once a step after it."""
    step: int
    betas: Tuple[float, float]
    since: int

    @classmethod
    def created(cls, betas: Sequence[float]) -> "BetaProducts":
        """As ``create_adam`` leaves it: step 0, products 1 (``pow(b, 0)``)."""
        return cls(0, (_as_float32(betas[0]), _as_float32(betas[1])), 0)

    def increment(self, step: int, beta1: float, beta2: float) -> None:
        """``IncrementStep(step, beta1, beta2)``, line for line."""
        beta1, beta2 = _as_float32(beta1), _as_float32(beta2)
        if beta1 != self.betas[0] or beta2 != self.betas[1]:  # (NaN differs from itself, as in C++)
            self.step, self.betas, self.since = step, (beta1, beta2), step
        elif step == self.step + 1:
            self.step = step
        elif step != self.step:
            self.step, self.since = step, step

    def replay_calls(self) -> List[Tuple[int, Tuple[float, float]]]:
        """After a reset: the calls (step, betas) that leave a C++ optimizer in this state, its products included."""
        return [(step, self.betas) for step in range(self.since, self.step + 1)]

    def saved(self) -> dict:
        return {"step": self.step, "betas": list(self.betas), "since": self.since}

    @classmethod
    def from_saved(cls, saved) -> Optional["BetaProducts"]:
        """None where ``saved`` is not what ``saved()`` wrote."""
        try:
            step, since, (beta1, beta2) = int(saved["step"]), int(saved["since"]), saved["betas"]
            return cls(step, (float(beta1), float(beta2)), since) if 0 <= since <= step else None
        except (KeyError, TypeError, ValueError):
            return None


class RecordingAdamOps:
    """DeepSpeedCPUAdam's C++ op module (``ds_opt_adam``) for one optimizer, noting its update calls in ``products``.
    A rollback (SuperOffload's) changes the C++ state otherwise: the model is then unknown (None)."""

    def __init__(self, ops, opt_id: int, products: BetaProducts):
        self._ops, self._opt_id, self.products = ops, opt_id, products

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def adam_update(self, opt_id, step, lr, beta1, beta2, *args):
        if opt_id == self._opt_id and self.products is not None:  # (IncrementStep comes first in the C++ step)
            self.products.increment(step, beta1, beta2)
        return self._ops.adam_update(opt_id, step, lr, beta1, beta2, *args)

    def adam_rollback(self, opt_id, *args):
        if opt_id == self._opt_id:
            self.products = None
        return self._ops.adam_rollback(opt_id, *args)


def record_beta_products(base) -> None:
    """From now on, note ``base``'s (a DeepSpeedCPUAdam's) C++ update calls. Called once its C++ optimizer exists."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # here: importing deepspeed.ops runs tencache's install hook

    if isinstance(base, DeepSpeedCPUAdam) and not isinstance(base.ds_opt_adam, RecordingAdamOps):
        base.ds_opt_adam = RecordingAdamOps(base.ds_opt_adam, base.opt_id,
                                            BetaProducts.created(base.defaults["betas"]))


def recorded_products(base) -> Optional[BetaProducts]:
    ops = getattr(base, "ds_opt_adam", None)
    return ops.products if isinstance(ops, RecordingAdamOps) else None


def with_products_saved(state_dict: dict, base) -> dict:
    """Stage 3's state dict with the products' state beside the optimizer's (where they were recorded)."""
    products = recorded_products(base)
    if products is not None:
        state_dict[SAVED_KEY] = products.saved()
    return state_dict


def replay_beta_products(base, zero_state: dict, sub_groups) -> int:
    """Give ``base``'s (a DeepSpeedCPUAdam's) C++ optimizer the products an uninterrupted run has after the loaded
    steps: reset (a step 0 with NaN betas: ``pow(x, 0)`` is exactly 1), then the calls of the saved state
    (``SAVED_KEY`` in the checkpoint's ``zero_state``), or, without it, of the saved step counts and betas of
    ``sub_groups`` ((step count, betas, eps) in the order stage 3 steps them: ``step_product_calls``). Returns the
    number of calls made."""
    products = BetaProducts.from_saved(zero_state.get(SAVED_KEY) or {})
    if products is not None:
        calls = [(step, betas, 1e-8) for step, betas in products.replay_calls()]
    else:
        calls = step_product_calls(sub_groups)
    scratch = [torch.zeros(_SCRATCH_NUMEL) for _ in range(4)]  # params, grads, exp_avg, exp_avg_sq
    for step, (beta1, beta2), eps in [(0, _RESET, 1e-8)] + calls:
        base.ds_opt_adam.adam_update(base.opt_id, step, 0.0, beta1, beta2, eps, 0.0, False, *scratch)
    if isinstance(base.ds_opt_adam, RecordingAdamOps) and base.ds_opt_adam.products is None:
        model = BetaProducts(0, _RESET, 0)  # (a rollback made it unknown: known again from the reset on)
        for step, (beta1, beta2), _eps in [(0, _RESET, 1e-8)] + calls:
            model.increment(step, beta1, beta2)
        base.ds_opt_adam.products = model
    return len(calls)


def step_product_calls(sub_groups) -> list:
    """The C++ optimizer's calls (step, betas, eps) that leave its beta products as an uninterrupted run's, after a
    reset, for sub-groups given as (step count, betas, eps) in the order stage 3 steps them, where the betas never
    changed: each step number from 1 to the largest, for every sub-group updated that many times or more, in order;
    less the calls the C++ side returns from unchanged (``IncrementStep``: the step it is at, with the betas it has),
    which are all but the first of each step where the sub-groups share their betas. A resume after 100 000 steps of
    70 sub-groups made 7 million calls, about 10 s of a silent stall on this VM (1.4 us a call, measured;
    helper-172 guessed minutes); it makes 100 000."""
    last = max((step for step, _betas, _eps in sub_groups), default=0)
    calls, at_step, at_betas = [], 0, None  # where the C++ side is (after the reset: other betas than any)
    for step in range(1, last + 1):
        for saved_step, betas, eps in sub_groups:
            if saved_step >= step and (step, betas) != (at_step, at_betas):
                calls.append((step, betas, eps))
                at_step, at_betas = step, betas
    return calls
