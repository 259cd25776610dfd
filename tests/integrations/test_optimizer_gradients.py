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
                                     "optimizer_gradient_fragments_uncast": 1}  # the bf16 one
        gradients.forget_all()
        assert gradients.stored == set() and gradients.held_by_store("g")  # without the lookup, always the tier's
    finally:
        store.close()


def test_a_gradient_set_through_the_api_and_scaled_by_the_update_keeps_the_scaled_bytes_when_it_streams(io, tmp_path):
    """Regression test (helper-147's and helper-163's reviews): a gradient set through DeepSpeed's API (or Muon's
    write-back), lent from the store alone and scaled in place by the update (clipping), went back unchanged where
    the tier streams it (the swapper counts it changed only where held): its file kept the unscaled bytes, which a
    parameter without a gradient in the next window then read, where stock CPU offload (and a tier that holds it)
    reads the scaled ones. Now the scaled bytes are kept or written."""
    store = OptimizerStore(torch.float32, lambda numel: numel, io, largest_numel=NUMEL, streaming_slots=8,
                           host_tier_share=lambda: 0)  # nothing held: the gradient streams
    try:
        gradients = SubGroupGradients(None, store, torch.float32)
        info = sub_group(str(tmp_path / "0_gradient_0_1024.tensor.swp"))
        path = gradient_path(info)
        gradients.handed("g", info, [0], [torch.full((NUMEL,), 2.0)])
        gradients.written_back("g")  # set through the API: its newest bytes are the store's
        lent = gradients.lend("g", path, NUMEL, lambda: store.lend(path))
        lent.mul_(0.5)  # the update's clipping, in place
        gradients.scaled("g", torch.tensor([0.5]), path)
        gradients.give_back("g", path, changed=store.kept(path))  # as swap_out_optimizer_state gives it back
        store.flush()
        store.trim_kept(0)
        again = store.lend(path)
        assert torch.all(again == 1.0), again[:4]
        store.release(path)
        # new fragments from stage 3: scaled as before the write-back, not marked changed at every later step
        gradients.handed("g", info, [0], [torch.full((NUMEL,), 2.0)])
        lent = gradients.lend("g", path, NUMEL, lambda: store.lend(path))
        gradients.scaled("g", torch.tensor([0.5]), path)
        assert store.state(path).value == "lent_clean"
        gradients.give_back("g", path, changed=False)
    finally:
        store.close()
