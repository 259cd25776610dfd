"""Whether a store's tensor has a current copy elsewhere. Owns: the rule that says when the bytes a borrower last
copied out of a lent tensor (into tensors another store keeps) are still that tensor's bytes, so that its next
lend may copy them back instead of reading its file. Pure: the caller names the tensors, and says how often the
copies' holders have written them since (``versions``); the copying itself is the caller's
(integrations/deepspeed/master_copies.py: the fp32 masters stage 3 copies into the parameter partitions).

The rule, per key:
- a borrower that copied the lent tensor out (``copied_out``) makes that copy current when the tensor goes back
  changed (``released``): the copy is the last thing stage 3 does with a sub-group before giving it back, and the
  tensor kept what the copy took (a tensor given back unchanged after a copy went back without the changes its
  borrower made before copying: no copy is current then);
- a tensor given back changed without such a copy has none that is current, and one given back with neither
  keeps what it had;
- a copy is current only while its holders report the versions they had right after it (``current``): any write
  to one of them since (a checkpoint load, a user's change of a parameter) ends it;
- ``forget`` ends one (a copy made while the tensor was not lent, a failed give-back), ``forget_all`` every one (the
  files were replaced: a checkpoint load, files adopted under other ids, a new initialisation).
"""
from typing import Dict, Hashable, Tuple

Versions = Tuple[int, ...]


class CopyValidity:
    """Per key: the holders' versions right after its current copy was made, if it has one."""

    def __init__(self):
        self._current: Dict[Hashable, Versions] = {}
        self._copied_while_lent: Dict[Hashable, Versions] = {}

    def lent(self, key) -> None:
        """``key`` was handed out: a copy is made, if at all, while it is lent this time."""
        self._copied_while_lent.pop(key, None)

    def copied_out(self, key, versions: Versions) -> None:
        """While ``key`` is lent, its bytes were copied out; its holders' versions are now ``versions``."""
        self._copied_while_lent[key] = tuple(versions)

    def released(self, key, changed: bool) -> None:
        """``key`` went back (``changed``: the borrower wrote to it)."""
        copied = self._copied_while_lent.pop(key, None)
        if copied is not None and changed:
            self._current[key] = copied
        elif copied is not None or changed:
            self._current.pop(key, None)

    def current(self, key, versions: Versions) -> bool:
        """Does ``key`` have a copy its holders, now at ``versions``, have not written since it was made?"""
        made = self._current.get(key)
        return made is not None and made == tuple(versions)

    def forget(self, key) -> None:
        self._current.pop(key, None)
        self._copied_while_lent.pop(key, None)

    def forget_all(self) -> None:
        self._current.clear()
        self._copied_while_lent.clear()

    def __len__(self) -> int:
        return len(self._current)
