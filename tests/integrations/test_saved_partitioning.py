"""What a load's copy of a checkpoint's optimizer swap files may place when another number of data-parallel ranks
saved it (integrations/deepspeed/checkpoint.py ``_places_for_saved_partitioning``), decided on an engine object
with only what the decision reads. The real engine, at 1 rank on a checkpoint of 2, against stock CPU offload:
tests/deepspeed/test_upstream_checkpoints.py (``load_at_other_world_size``)."""
import types

import pytest
from deepspeed.runtime.zero.utils import ZeRORuntimeException

from tencache_ds.errors import TencacheError
from tencache_ds.integrations.deepspeed.checkpoint import _places_for_saved_partitioning
from tencache_ds.integrations.deepspeed.optimizer_swapper import LoadPlaces


def engine(saved, current, flat_partitions=("flat", "flat")):
    refreshed = []
    optimizer = types.SimpleNamespace(fp16_partitioned_groups_flat=list(flat_partitions),
                                      refresh_fp32_params=lambda: refreshed.append(True))
    return types.SimpleNamespace(loaded_checkpoint_dp_world_size=saved, seq_dp_world_size=current,
                                 optimizer=optimizer), refreshed


@pytest.mark.parametrize("places", list(LoadPlaces))
def test_the_same_world_size_places_what_was_asked(places):
    same, refreshed = engine(2, 2)
    assert _places_for_saved_partitioning(same, places) is places and not refreshed


def test_the_optimizers_state_of_another_world_size_is_refused_as_stock_cpu_offload_refuses_it():
    other, refreshed = engine(2, 1)
    with pytest.raises(ZeRORuntimeException, match="used a DP world size of 2 but the current world size is 1"):
        _places_for_saved_partitioning(other, LoadPlaces.ALL)
    assert not refreshed


def test_without_the_optimizers_state_the_masters_come_from_the_loaded_weights_and_no_file_is_placed():
    other, refreshed = engine(2, 1)
    assert _places_for_saved_partitioning(other, LoadPlaces.MASTERS) is LoadPlaces.NOTHING and refreshed == [True]


def test_without_flat_partitions_to_set_the_masters_from_the_load_stops_naming_max_in_cpu():
    other, refreshed = engine(4, 2, flat_partitions=("flat", None))
    with pytest.raises(TencacheError, match="max_in_cpu"):
        _places_for_saved_partitioning(other, LoadPlaces.MASTERS)
    assert not refreshed


def test_a_load_of_the_module_only_places_nothing_at_any_world_size():
    other, refreshed = engine(2, 1)
    assert _places_for_saved_partitioning(other, LoadPlaces.NOTHING) is LoadPlaces.NOTHING and not refreshed
