"""probes/limits.py: the memlock limit a process really has. CAP_IPC_LOCK lifts RLIMIT_MEMLOCK only where the kernel
honours it, in the initial user namespace (helper-197: root of a user namespace shows it, and the limit still
applies)."""
from tencache_ds.probes import limits


def test_only_the_initial_user_namespace_maps_every_uid_onto_itself():
    assert limits.in_initial_user_namespace("         0          0 4294967295\n")
    assert not limits.in_initial_user_namespace("         0       1000          1\n")  # unshare -r
    assert not limits.in_initial_user_namespace("0 100000 65536\n")  # rootless Podman, an unprivileged LXD container
    assert not limits.in_initial_user_namespace("0 0 4294967295\n1 2 3\n")


def test_the_capability_in_a_user_namespace_leaves_the_soft_limit(monkeypatch):
    monkeypatch.setattr(limits, "in_initial_user_namespace", lambda: False)
    real_open = open

    def status_with_ipc_lock(path, *args, **kwargs):
        if path == "/proc/self/status":
            import io
            return io.StringIO(f"Name:\tpython\nCapEff:\t{1 << limits.CAP_IPC_LOCK:016x}\n")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr("builtins.open", status_with_ipc_lock)
    assert not limits.has_ipc_lock_capability()
    monkeypatch.setattr(limits, "in_initial_user_namespace", lambda: True)
    assert limits.has_ipc_lock_capability()
