"""A file renamed over one that held a valid file (io/durable.py): its bytes reach the drive before the rename, and
the folder's entry after it. A crash cannot be made here; the order of the calls is what is checked."""
import os

from tencache_ds.io import durable


def test_the_bytes_are_synced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    target, temporary = tmp_path / "zero.pt", tmp_path / "zero.pt.filling"
    target.write_bytes(b"old")
    temporary.write_bytes(b"new bytes")
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor):  # (only this test's files: another thread of the process may sync its own)
        path = os.readlink(f"/proc/self/fd/{descriptor}")
        if path.startswith(str(tmp_path)):
            calls.append(("fsync", path))
        real_fsync(descriptor)

    def replace(source, destination):
        if str(source).startswith(str(tmp_path)):
            calls.append(("replace", str(source)))
        real_replace(source, destination)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    monkeypatch.setattr(durable.os, "replace", replace)
    durable.replace_durably(str(temporary), str(target))
    assert calls == [("fsync", str(temporary)), ("replace", str(temporary)), ("fsync", str(tmp_path))]
    assert target.read_bytes() == b"new bytes" and not temporary.exists()
