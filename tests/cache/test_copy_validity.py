"""cache/copy_validity.py: when the bytes a borrower copied out of a lent tensor are still that tensor's."""
from tencache_ds.cache.copy_validity import CopyValidity


def test_a_copy_made_while_lent_is_current_after_a_changed_release_until_its_holders_are_written():
    validity = CopyValidity()
    assert not validity.current("m", (0,))  # nothing copied yet
    validity.lent("m")
    validity.copied_out("m", (1,))  # the update, then stage 3's copy of the new master into the partitions
    assert not validity.current("m", (1,))  # not before the tensor is given back
    validity.released("m", changed=True)
    assert validity.current("m", (1,))
    assert not validity.current("m", (2,))  # a partition written since (a modifying gather): no copy


def test_a_change_without_a_copy_ends_the_copy_and_a_read_only_lend_keeps_it():
    validity = CopyValidity()
    validity.lent("m")
    validity.copied_out("m", (1,))
    validity.released("m", changed=True)
    validity.lent("m")  # a read-only query (safe_get_full_fp32_param)
    validity.released("m", changed=False)
    assert validity.current("m", (1,))
    validity.lent("m")  # safe_set_full_fp32_param: the master changes, the partitions do not
    validity.released("m", changed=True)
    assert not validity.current("m", (1,))


def test_a_copy_given_back_unchanged_or_forgotten_is_not_current():
    """A copy made, then the tensor given back unchanged (a give-back that dropped the borrower's changes: the copy
    has them, the tensor not), or forgotten (a copy made while it was not lent, a failed give-back): no copy."""
    validity = CopyValidity()
    validity.lent("m")
    validity.copied_out("m", (1,))
    validity.released("m", changed=True)
    validity.lent("m")
    validity.copied_out("m", (2,))
    validity.released("m", changed=False)
    assert not validity.current("m", (2,)) and not validity.current("m", (1,))
    validity.lent("m")
    validity.copied_out("m", (3,))
    validity.released("m", changed=True)
    validity.forget("m")
    assert not validity.current("m", (3,))


def test_a_copy_made_in_an_earlier_lend_does_not_count_for_a_later_change():
    validity = CopyValidity()
    validity.lent("m")
    validity.copied_out("m", (1,))
    validity.lent("m")  # (a lend that failed and was lent again: the copy belonged to the first)
    validity.released("m", changed=True)
    assert not validity.current("m", (1,))


def test_forgetting_ends_every_copy_and_keys_are_apart():
    validity = CopyValidity()
    for key in ("a", "b"):
        validity.lent(key)
        validity.copied_out(key, (key,))
        validity.released(key, changed=True)
    assert validity.current("a", ("a",)) and validity.current("b", ("b",)) and len(validity) == 2
    validity.forget_all()
    assert not validity.current("a", ("a",)) and len(validity) == 0
