"""Host-tier residency in steady state under the store's policy (Belady with bypass), against a brute-force
check of what a cyclic order lets a tier of a given size keep."""
from tencache_ds.plan.host_residency import steady_state


def test_cyclic_order_keeps_a_fixed_share_instead_of_cycling_everything():
    result = steady_state(list("abcabc"), dict(a=1, b=1, c=1), capacity_bytes=2)
    assert result.held == {"a", "b"} and result.misses == {2, 5}  # LRU would miss all six


def test_forward_backward_order_keeps_the_turnaround_and_the_next_steps_start():
    keys = list("abcdeedcba")
    result = steady_state(keys, {key: 10 for key in "abcde"}, capacity_bytes=20)
    # two slots: e (used twice in a row at the turnaround) always hits its second use; a at the end of
    # backward is needed again at the start of the next forward
    assert 5 not in result.misses and 0 not in result.misses
    assert result.read_bytes([10] * 10) == 10 * len(result.misses)


def test_a_holder_emptied_each_pass_misses_every_first_use():
    """The device tier at each optimizer step: what it kept goes stale, so a pass's first use of each key misses
    however large the tier, and only uses later in the same pass can hit."""
    keys = list("abcba")
    assert steady_state(keys, {key: 1 for key in "abc"}, capacity_bytes=3).misses == set()
    emptied = steady_state(keys, {key: 1 for key in "abc"}, capacity_bytes=3, emptied_each_pass=True)
    assert emptied.misses == {0, 1, 2}


def test_everything_fits_or_nothing_does():
    keys = list("abab")
    assert steady_state(keys, dict(a=5, b=5), capacity_bytes=10).misses == frozenset()
    nothing = steady_state(keys, dict(a=5, b=5), capacity_bytes=4)
    assert nothing.misses == {0, 1, 2, 3} and nothing.held == frozenset()


def test_a_large_tensor_does_not_push_out_smaller_ones_needed_sooner():
    # big is used once per step; a and b twice: keeping a and b saves more reads than keeping big
    keys = ["a", "b", "big", "a", "b"]
    result = steady_state(keys, {"a": 1, "b": 1, "big": 2}, capacity_bytes=2)
    assert result.held == {"a", "b"} and result.misses == {2}


def test_the_room_kept_tensors_leave_holds_prefixes_of_the_first_that_miss():
    """The optimizer's store (cache/admission.py grant_prefix): whole granules of the spare room hold the first
    bytes of the tensors that stream, in the order they first miss; their reads still count, that much smaller."""
    mib = 1 << 20
    keys = list("abcabc")
    sizes = dict(a=4 * mib, b=4 * mib, c=4 * mib)
    result = steady_state(keys, sizes, capacity_bytes=6 * mib + 5, prefixes=True)
    assert result.held == {"a"} and result.prefixes == {"b": 2 * mib}  # the 2 MiB after "a"; none left for "c"
    assert result.read_bytes([4 * mib] * 6, keys) == 2 * (4 * mib - 2 * mib) + 2 * 4 * mib
    smaller = steady_state(keys, sizes, capacity_bytes=3 * mib, prefixes=True)
    assert smaller.held == frozenset() and smaller.prefixes == {"a": 3 * mib}
    assert steady_state(keys, sizes, capacity_bytes=3 * mib).prefixes == {}  # the parameter store holds none
