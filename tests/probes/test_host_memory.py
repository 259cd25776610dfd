"""Reading the host's memory (probes/host_memory.py): the node's, bounded by every memory cgroup around the process
(v1 and v2, limits set on a parent, memory.high, reclaimable page cache). The layouts are written as files the way
the kernel shows them; the last test reads this machine itself."""
import os

import pytest

from tencache_ds.plan.budget import MachineResources
from tencache_ds.probes.host_memory import (anonymous_resident_bytes, cgroup_levels, memory_cgroup_folder,
                                          per_cpu_free_bytes, read_host_memory)

GiB, MiB = 1 << 30, 1 << 20
V1_NO_LIMIT = 9223372036854771712


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def fake_proc(tmp_path, cgroup_lines, mounts, total=64 * GiB, available=48 * GiB):
    """A /proc with this process's cgroup memberships and mounts, and the node's meminfo."""
    proc = tmp_path / "proc"
    write(str(proc / "meminfo"), f"MemTotal: {total // 1024} kB\nMemFree: 1 kB\nMemAvailable: {available // 1024} kB\n")
    write(str(proc / "self" / "cgroup"), "".join(line + "\n" for line in cgroup_lines))
    write(str(proc / "self" / "mountinfo"), "".join(
        f"{30 + i} 23 0:{28 + i} {root} {point} rw,relatime - {fstype} {fstype} {options}\n"
        for i, (root, point, fstype, options) in enumerate(mounts)))
    return str(proc)


def v1_group(folder, limit, usage, inactive_file=0, active_file=0):
    write(os.path.join(folder, "memory.limit_in_bytes"), f"{limit}\n")
    write(os.path.join(folder, "memory.usage_in_bytes"), f"{usage}\n")
    write(os.path.join(folder, "memory.stat"), f"cache 1\ninactive_file 3\ntotal_inactive_file {inactive_file}\n"
                                               f"total_active_file {active_file}\nrss 2\n")


def v2_group(folder, limit, usage, inactive_file=0, high="max", active_file=0):
    write(os.path.join(folder, "memory.max"), f"{limit}\n")
    write(os.path.join(folder, "memory.high"), f"{high}\n")
    write(os.path.join(folder, "memory.current"), f"{usage}\n")
    write(os.path.join(folder, "memory.stat"), f"anon 5\ninactive_file {inactive_file}\nactive_file {active_file}\n")


def test_no_cgroup_limit_is_the_node(tmp_path):
    mount = tmp_path / "cg" / "memory"
    v1_group(str(mount), V1_NO_LIMIT, 3 * GiB)
    v1_group(str(mount / "job"), V1_NO_LIMIT, 2 * GiB)
    proc = fake_proc(tmp_path, ["4:memory:/job", "0::/"], [("/", str(mount), "cgroup", "rw,memory")])
    assert memory_cgroup_folder(proc) == (str(mount / "job"), str(mount), 1)
    assert cgroup_levels(proc) == []
    memory = read_host_memory(proc)
    assert (memory.total_bytes, memory.available_bytes, memory.bound_by) == (64 * GiB, 48 * GiB, "node")


ZONEINFO = """Node 0, zone      DMA
  pages free     3840
        min      8
  pagesets
    cpu: 0
              count: 0
              high:  0
              batch: 1
  vm stats threshold: 6
Node 0, zone   Normal
  pages free     1462845
        nr_free_pages 1462845
  pagesets
    cpu: 0
              count: 40648
              high:  336896
              batch: 63
              high_min:  8415
              high_max:  336896
  vm stats threshold: 48
    cpu: 1
              count: 316869
              high:  336896
              batch: 63
  vm stats threshold: 48
  node_unreclaimable:  0
"""


def test_free_pages_in_the_per_cpu_lists_of_this_process_cpus_count_as_available_on_the_node(tmp_path):
    """MemAvailable leaves out the free pages the kernel keeps per CPU: this VM held 1.3 GiB there after a step had
    freed its gradients, and the governor gave back host cache for it (probes/host_memory.py,
    ``per_cpu_free_bytes``). Only the lists of the CPUs the process may run on (its allocations take those first);
    never more than the node has; nothing where zoneinfo is missing or not as expected."""
    page = os.sysconf("SC_PAGE_SIZE")
    proc = fake_proc(tmp_path, ["0::/"], [])
    write(os.path.join(proc, "zoneinfo"), ZONEINFO)
    assert per_cpu_free_bytes(proc, cpus=[0, 1]) == (40648 + 316869) * page
    assert per_cpu_free_bytes(proc, cpus=[1]) == 316869 * page
    assert per_cpu_free_bytes(proc, cpus=[2]) == 0
    mine = per_cpu_free_bytes(proc)  # this process's affinity
    assert mine == sum({0: 40648, 1: 316869}.get(cpu, 0) for cpu in os.sched_getaffinity(0)) * page
    memory = read_host_memory(proc)
    assert (memory.available_bytes, memory.allocatable_bytes) == (48 * GiB + mine, 48 * GiB + mine)
    full = fake_proc(tmp_path / "full", ["0::/"], [], total=48 * GiB + MiB, available=48 * GiB)
    write(os.path.join(full, "zoneinfo"), ZONEINFO)
    assert read_host_memory(full).available_bytes == min(48 * GiB + mine, 48 * GiB + MiB)
    write(os.path.join(proc, "zoneinfo"), ZONEINFO.replace("count: 40648", "count: many"))
    assert per_cpu_free_bytes(proc) == 0
    os.remove(os.path.join(proc, "zoneinfo"))
    assert per_cpu_free_bytes(proc) == 0 and read_host_memory(proc).available_bytes == 48 * GiB


def test_a_cgroups_headroom_is_its_own_accounting_whatever_the_per_cpu_lists_hold(tmp_path):
    mount = tmp_path / "cg" / "memory"
    v2_group(str(mount / "job"), 8 * GiB, 6 * GiB)
    v2_group(str(mount), "max", 6 * GiB)
    proc = fake_proc(tmp_path, ["0::/job"], [("/", str(mount), "cgroup2", "rw")])
    write(os.path.join(proc, "zoneinfo"), ZONEINFO)
    assert read_host_memory(proc).available_bytes == 2 * GiB


def test_a_v1_limit_on_a_parent_bounds_the_child_and_page_cache_counts_as_free(tmp_path):
    mount = tmp_path / "cg" / "memory"
    v1_group(str(mount), V1_NO_LIMIT, 10 * GiB)
    v1_group(str(mount / "pod"), 4 * GiB, 3 * GiB, inactive_file=512 * MiB, active_file=256 * MiB)  # the limit
    v1_group(str(mount / "pod" / "ctr"), V1_NO_LIMIT, 2 * GiB)                 # the container: no limit of its own
    proc = fake_proc(tmp_path, ["7:cpu,cpuacct:/pod/ctr", "4:memory:/pod/ctr"],
                     [("/", str(tmp_path / "cg" / "cpu"), "cgroup", "rw,cpu,cpuacct"),
                      ("/", str(mount), "cgroup", "rw,memory")])
    memory = read_host_memory(proc)
    assert memory.total_bytes == 4 * GiB
    assert memory.available_bytes == 4 * GiB - (3 * GiB - 512 * MiB)      # inactive page cache is free to take
    assert memory.allocatable_bytes == 4 * GiB - (3 * GiB - 768 * MiB)    # before the OOM killer: all page cache
    assert memory.bound_by == str(mount / "pod")
    # MachineResources at start-up sees the container, and messages name it
    assert "cgroup" in MachineResources(memory.total_bytes, memory.available_bytes, -1,
                                        host_bound_by=memory.bound_by).host_memory_name


def test_v2_takes_the_tightest_of_max_and_high_at_every_level(tmp_path):
    mount = tmp_path / "unified"
    write(str(mount / "cgroup.controllers"), "cpu memory\n")  # the root has no memory.max
    v2_group(str(mount / "slice"), 8 * GiB, 5 * GiB, high=str(6 * GiB))
    v2_group(str(mount / "slice" / "job"), "max", 4 * GiB, inactive_file=1 * GiB)
    proc = fake_proc(tmp_path, ["0::/slice/job"], [("/", str(mount), "cgroup2", "rw,nsdelegate")])
    assert memory_cgroup_folder(proc) == (str(mount / "slice" / "job"), str(mount), 2)
    [slice_level] = cgroup_levels(proc)  # "max" is no limit
    assert slice_level.limit_bytes == 6 * GiB and slice_level.headroom_bytes == 1 * GiB
    memory = read_host_memory(proc)
    assert (memory.total_bytes, memory.available_bytes) == (6 * GiB, 1 * GiB)


def test_a_node_tighter_than_its_cgroup_is_the_bound(tmp_path):
    mount = tmp_path / "unified"
    v2_group(str(mount / "job"), 32 * GiB, 1 * GiB)
    proc = fake_proc(tmp_path, ["0::/job"], [("/", str(mount), "cgroup2", "rw")], total=16 * GiB,
                     available=2 * GiB)
    memory = read_host_memory(proc)
    assert (memory.total_bytes, memory.available_bytes, memory.bound_by) == (16 * GiB, 2 * GiB, "node")
    assert memory.allocatable_bytes == 2 * GiB


def test_a_namespaced_mount_shows_the_process_cgroup_as_its_root(tmp_path):
    """Inside a cgroup namespace (docker, Kubernetes) /proc/self/cgroup says "/" and the mount's root is the
    container's own cgroup: its limit is read at the mount point."""
    mount = tmp_path / "unified"
    v2_group(str(mount), 2 * GiB, 1536 * MiB)
    proc = fake_proc(tmp_path, ["0::/"], [("/", str(mount), "cgroup2", "rw")])
    memory = read_host_memory(proc)
    assert (memory.total_bytes, memory.available_bytes) == (2 * GiB, 512 * MiB)


def test_no_memory_cgroup_mounted_or_unreadable_proc_is_the_node(tmp_path):
    proc = fake_proc(tmp_path, ["4:memory:/job"], [("/", str(tmp_path / "cpu"), "cgroup", "rw,cpu")])
    assert memory_cgroup_folder(proc) == (None, None, 0)
    assert read_host_memory(proc).bound_by == "node"
    os.remove(os.path.join(proc, "self", "mountinfo"))
    assert cgroup_levels(proc) == []


def test_anonymous_resident_bytes_are_rss_anon_and_rss_shmem_read_again_at_each_call(tmp_path):
    """The status file stays open between reads (opening it cost more than reading it): each call still reads
    what the file says then."""
    proc = tmp_path / "proc"
    status = "Name:\tpython3\nVmRSS:\t  9000 kB\nRssAnon:\t    4000 kB\nRssFile:\t  3000 kB\nRssShmem:\t  {} kB\n"
    write(str(proc / "self" / "status"), status.format(2000))
    assert anonymous_resident_bytes(str(proc)) == 6000 * 1024
    write(str(proc / "self" / "status"), status.format(500))
    assert anonymous_resident_bytes(str(proc)) == 4500 * 1024


def test_anonymous_resident_bytes_follow_this_process_and_a_forked_childs_own():
    """On the real /proc: the kept descriptor is read again at each call (procfs makes the file anew), and a forked
    child reads its own memory, not its parent's through the inherited descriptor. (Plain bytes, not torch: a
    child forked after torch's thread pool ran may hang in it.)"""
    before = anonymous_resident_bytes()
    grown = b"\x01" * (128 << 20)  # written, so resident
    assert anonymous_resident_bytes() >= before + (96 << 20)
    pid = os.fork()
    if pid == 0:  # the child: 256 MiB more of its own
        more = b"\x02" * (256 << 20)
        os._exit(0 if anonymous_resident_bytes() >= before + (320 << 20) and more else 1)
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert anonymous_resident_bytes() < before + (250 << 20) and grown  # the child's memory was not ours


def test_this_machine():
    memory = read_host_memory()
    assert 0 < memory.available_bytes <= memory.total_bytes
    probe = MachineResources.probe()
    assert probe.host_total_bytes == memory.total_bytes
    assert 0 < anonymous_resident_bytes() < memory.total_bytes


@pytest.mark.parametrize("line", ["0::/", "0::/user.slice/session-1.scope"])
def test_v2_membership_without_a_mount_is_ignored(tmp_path, line):
    proc = fake_proc(tmp_path, [line], [])
    assert memory_cgroup_folder(proc) == (None, None, 0)


def test_a_v2_limit_above_a_cgroup_without_memory_files_still_bounds_it(tmp_path):
    """helper-235: a v2 cgroup has memory files only where its parent enables the controller for its children (a
    systemd slice with MemoryMax above a job with accounting off); the kernel charges the slice all the same. The
    folder was refused for its missing memory.max, and the run sized itself from the node."""
    mount = tmp_path / "unified"
    write(str(mount / "cgroup.controllers"), "cpu memory\n")
    v2_group(str(mount / "slice"), 8 * GiB, 5 * GiB)
    write(str(mount / "slice" / "job" / "cgroup.procs"), "1\n")  # no memory files here
    proc = fake_proc(tmp_path, ["0::/slice/job"], [("/", str(mount), "cgroup2", "rw")])
    assert memory_cgroup_folder(proc) == (str(mount / "slice" / "job"), str(mount), 2)
    memory = read_host_memory(proc)
    assert (memory.total_bytes, memory.available_bytes, memory.bound_by) == (8 * GiB, 3 * GiB, str(mount / "slice"))
    write(os.path.join(proc, "self", "cgroup"), "0::/other\n")  # a membership whose folder the mount does not show
    assert memory_cgroup_folder(proc) == (None, None, 0)
    v2_group(str(mount), 4 * GiB, 1 * GiB)  # ... but whose mount point is limited: that limit (helper-239)
    assert read_host_memory(proc).total_bytes == 4 * GiB
