"""Every method ZeRO-3 calls on its swappers (deepspeed-integration.md a.3, a.6) is defined by our class itself and
accepts the arguments DeepSpeed passes (by name where DeepSpeed passes them by name).

"Defined by our class itself" matters because ours subclass the stock swappers (DeepSpeed's isinstance checks):
a method we forget to override still exists, inherited, and silently runs stock code against stock buffers and
state our constructors never set up. Methods whose stock body is safe for us are listed in INHERITED_ON_PURPOSE,
each with the reason; keep that list and the two call tables below up to date."""
import inspect

import pytest

pytest.importorskip("deepspeed")
from deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper import PartitionedOptimizerSwapper  # noqa: E402
from deepspeed.runtime.swap_tensor.partitioned_param_swapper import AsyncPartitionedParameterSwapper  # noqa: E402

from tencache_ds.integrations.deepspeed.optimizer_swapper import TencacheOptimizerSwapper  # noqa: E402
from tencache_ds.integrations.deepspeed.param_swapper import TencacheParamSwapper  # noqa: E402

# deepspeed-integration.md a.3: method -> keywords DeepSpeed passes by name
PARAM_CALLS = {
    "swappable_tensor": {"numel"}, "get_buffer": set(), "swap_out_and_release": {"async_op", "force_buffer_release"},
    "swap_in": {"async_op", "swap_in_buffers"}, "synchronize_reads": set(),
    "remove_partition_and_release_buffers": set(), "available_swap_in_buffers": set(),
    "swap_into_buffer": set(), "get_path": {"must_exist"}, "reserve_partitioned_swap_space": set(),
    "swap_out_partitioned_params": {"dst_fp16_params", "src_fp32_params"}, "reserve_available_buffers": set(),
    "release_reserved_buffers": set(),
}
# deepspeed-integration.md a.6 (plus the attribute swap_folder, an instance attribute this file cannot check)
OPTIMIZER_CALLS = {
    "is_swappable_tensor": {"tensor", "numel"}, "initialize_parameters": {"parameters", "src_tensors"},
    "initialize_from_swapped_fp16_params": {"fp16_partitions_info", "fp16_num_elems", "fp16_pinned_buffers",
                                            "fp32_parameters"},
    "init_timers": set(), "log_timers": set(), "pre_backward": set(), "post_backward": set(),
    "swap_out_gradients": {"parameter", "gradient_offsets", "gradient_tensors"},
    "swap_in_optimizer_state": {"parameter", "async_parameter"},
    "swap_out_optimizer_state": {"parameter", "async_swap"}, "release_swap_buffers": {"parameter"},
    "writeback_optimizer_state_and_gradients": set(), "purge_state": set(),
}


# method name -> why the stock body is right for our class (it touches no buffer, file or handle of the stock
# swapper). Everything else DeepSpeed calls must be in our class's own __dict__.
INHERITED_ON_PURPOSE = {
    TencacheParamSwapper: {},
    TencacheOptimizerSwapper: {
        "is_swappable_tensor": "pure size test, numel * swap_element_size >= min_aio_bytes, both set by our __init__",
        "init_timers": "only resets the set of timer names (OptimizerSwapper.init_timers)",
        "post_backward": "stock body is `pass`",
    },
}


@pytest.mark.parametrize("ours, calls", [(TencacheParamSwapper, PARAM_CALLS),
                                         (TencacheOptimizerSwapper, OPTIMIZER_CALLS)],
                         ids=["param", "optimizer"])
def test_every_called_method_is_our_own_or_inherited_on_purpose(ours, calls):
    on_purpose = INHERITED_ON_PURPOSE[ours]
    assert set(on_purpose) <= set(calls), "INHERITED_ON_PURPOSE names a method DeepSpeed does not call"
    overridden_after_all = sorted(name for name in on_purpose if name in vars(ours))
    assert not overridden_after_all, f"{ours.__name__} now defines {overridden_after_all}: remove them from " \
                                     f"INHERITED_ON_PURPOSE"
    inherited = sorted(name for name in calls if name not in vars(ours) and name not in on_purpose)
    assert not inherited, f"{ours.__name__} inherits {inherited} from DeepSpeed: override them, or list them in " \
                          f"INHERITED_ON_PURPOSE with the reason the stock body is right"


@pytest.mark.parametrize("ours, stock, calls", [(TencacheParamSwapper, AsyncPartitionedParameterSwapper, PARAM_CALLS),
                                                (TencacheOptimizerSwapper, PartitionedOptimizerSwapper,
                                                 OPTIMIZER_CALLS)])
def test_every_called_method_exists_with_the_keywords_deepspeed_uses(ours, stock, calls):
    assert issubclass(ours, stock)  # DeepSpeed's isinstance checks and OptimizerSwapper.parameter_id hold
    for name, keywords in calls.items():
        parameters = inspect.signature(getattr(ours, name)).parameters
        assert keywords <= set(parameters), (name, keywords - set(parameters))


def test_optional_hints_default_like_the_muon_path_needs():
    signature = inspect.signature(TencacheOptimizerSwapper.swap_in_optimizer_state)
    assert signature.parameters["async_parameter"].default is None
    assert inspect.signature(TencacheOptimizerSwapper.swap_out_optimizer_state).parameters["async_swap"].default is False
