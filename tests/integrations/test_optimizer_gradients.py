"""SubGroupGradients (integrations/deepspeed/optimizer_gradients.py) without stage 3's lookup (an optimizer swapper
made outside its initialisation, or TENCACHE_STORE_GRADIENT_FRAGMENTS): every fragment handed is stored in the
sub-group's gradient entry, zeros between them as in stock's sparse file, and the update is lent that entry; the
tier counts the gradient as its own and lends no extra slot for it. The path with the lookup (views of stage 3's
buffer, accumulation windows) runs on the real engine: tests/deepspeed/test_residency.py, skipped_branch.py."""
import types

import torch

from tencache_ds.cache.optimizer_store import OptimizerStore
from tencache_ds.integrations.deepspeed.optimizer_gradients import SubGroupGradients, gradient_path

NUMEL = 1024  # 4 KiB in fp32: whole O_DIRECT blocks


def sub_group(path: str):
    """What the gradients read of DeepSpeed's OptimizerStateSwapInfo: the gradient's one file and the numel."""
    return types.SimpleNamespace(swapped_gradients={0: types.SimpleNamespace(path=path)}, numel=lambda: NUMEL)


def test_without_stage3_the_fragments_are_stored_and_the_update_is_lent_them(io, tmp_path):
    store = OptimizerStore(torch.float32, lambda numel: numel, io, largest_numel=NUMEL, streaming_slots=8,
                           host_tier_share=lambda: 0)
    try:
        gradients = SubGroupGradients(None, store, torch.float32)
        info = sub_group(str(tmp_path / "0_gradient_0_1024.tensor.swp"))
        path = gradient_path(info)
        first, second = torch.arange(1.0, 4.0), torch.tensor([7.0, 8.0], dtype=torch.bfloat16)
        assert not gradients.reads_stage3_copy("g", 0, first)
        gradients.handed("g", info, [0, 5], [first, second])
        assert not gradients.views and gradients.held_by_store("g")
        assert gradients.update_slots(sub_groups=1) == 0  # the stored gradient is lent, not a filled copy
        lent = gradients.lend("g", path, NUMEL, lambda: store.lend(path))
        assert lent[:8].tolist() == [1.0, 2.0, 3.0, 0.0, 0.0, 7.0, 8.0, 0.0] and not lent[8:].any()
        gradients.give_back("g", path, changed=False)
        assert store.knows(path)  # released to the store, not discarded as a copy would be
        gradients.end_window()  # nothing to track without the lookup
        assert gradients.stats() == {"optimizer_gradient_fragments_remembered": 0,
                                     "optimizer_gradient_fragments_stored": 2,
                                     "optimizer_gradient_fragments_reduced_not_handed": 0,
                                     "optimizer_gradient_fragments_uncast": 1,  # the bf16 one
                                     "optimizer_gradients_lent_whole": 0}
        gradients.forget_all()
        assert gradients.stored == set() and gradients.held_by_store("g")  # without the lookup, always the tier's
    finally:
        store.close()


class _KeptBuffer:
    """Stage 3's lookup (stage3_gradients.Stage3Gradients) over one flat buffer: a fragment that is a view of it is
    its own host copy; every parameter reduced in every window."""

    def __init__(self, flat):
        self.flat = flat

    def host_copy(self, _group, _offset, fragment):
        return fragment if fragment._base is self.flat else None

    def reductions(self):
        return set()

    def param_at(self, _group, _offset):
        return None


def test_fp32_gradients_in_stage3s_buffer_are_lent_in_place_and_a_write_through_the_api_is_stored(io, tmp_path):
    """Where stage 3's buffer holds the whole fp32 gradient, the update is lent those bytes (no buffer filled, no
    copy): its in-place scaling lands in stage 3's buffer, as in stock CPU offload's, so no factor is kept for a
    replay; giving it back touches the store not at all. A fragment call is lent a filled copy (``whole`` false).
    A gradient written back through DeepSpeed's API while lent in place (Muon's update) is stored from those
    bytes, as a filled buffer would have been."""
    store = OptimizerStore(torch.float32, lambda numel: numel, io, largest_numel=NUMEL, streaming_slots=8,
                           host_tier_share=lambda: 0)
    try:
        flat = torch.arange(float(NUMEL))
        gradients = SubGroupGradients(None, store, torch.float32)
        gradients.stage3 = _KeptBuffer(flat)
        info = sub_group(str(tmp_path / "0_gradient_0_1024.tensor.swp"))
        path = gradient_path(info)
        gradients.handed("g", info, [0, 100], [flat.narrow(0, 0, 100), flat.narrow(0, 100, NUMEL - 100)])
        lent = gradients.lend("g", path, NUMEL, lambda: store.lend(path), whole=True)
        assert lent.data_ptr() == flat.data_ptr() and not store.knows(path)
        half = torch.tensor([0.5])
        lent.mul_(half)
        gradients.scaled("g", half)
        assert gradients.fragments.factors_kept("g") == 0  # the factor is in stage 3's bytes themselves
        gradients.give_back("g", path, changed=False)
        assert not store.knows(path) and gradients.stats()["optimizer_gradients_lent_whole"] == 1
        gradients.end_window()
        gradients.handed("g", info, [0, 100], [flat.narrow(0, 0, 100), flat.narrow(0, 100, NUMEL - 100)])
        copy = gradients.lend("g", path, NUMEL, lambda: store.lend(path), whole=False)  # a getter's
        assert copy.data_ptr() != flat.data_ptr() and torch.equal(copy, flat)
        gradients.give_back("g", path, changed=False)
        assert not store.knows(path)  # a filled copy is discarded
        lent = gradients.lend("g", path, NUMEL, lambda: store.lend(path), whole=True)
        lent.fill_(3.0)  # Muon's update writes the gradient, then stage 3 writes it back
        gradients.written_back("g")
        gradients.give_back("g", path, changed=True)
        assert store.knows(path) and "g" in gradients.stored
        assert torch.equal(store.lend(path), torch.full((NUMEL,), 3.0))
        store.release(path)
    finally:
        store.close()
