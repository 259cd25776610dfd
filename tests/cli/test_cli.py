"""The `tencache-ds` command line: help on every subcommand, the frozen option sets, `doctor` on good and broken
environments (real checks, real probe process), `bench` argument errors, one real `bench` run end to end, and
`checkpoint-for-cpu`'s error on a folder that is no checkpoint (the conversion: tests/integrations/
test_checkpoint_for_cpu.py)."""
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from tencache_ds import ext_lock
from tencache_ds.cli import doctor
from tencache_ds.cli.main import build_parser
from tencache_ds.io import drive_rate

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The CLI surface. Changing it is a user-visible change: update this list, the README and the changelog together.
FROZEN_OPTIONS = {
    "doctor": ["--config", "--help", "--json", "--nvme-path", "--ranks", "-h"],
    "bench": ["--compare", "--config", "--device-cache-bytes", "--drive-tbw", "--dtype", "--grad-accum", "--help",
              "--host-cache-bytes", "--launcher", "--micro-batch", "--model", "--no-plots", "--nvme-bandwidth",
              "--nvme-path", "--offload", "--out", "--ranks", "--repeats", "--seq-len", "--steps", "--warmup", "-h"],
    "config-reference": ["--help", "-h"],
    "checkpoint-for-cpu": ["--help", "-h"],
}


# The drive's trials shortened (io/drive_rate.py's test hook), for the tests that check what doctor and bench do with
# the drive's rate, not the rate: test_doctor_on_a_good_folder_passes times it in full, as a user's doctor does.
QUICK_DRIVE = {drive_rate.QUICK_ENV: "1"}


def run_cli(*args, env_extra=None, timeout=300):
    """`tencache-ds ARGS` as a user runs it: a fresh interpreter calling main()."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", "from tencache_ds.cli.main import main; main()", *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def status_lines(stdout):
    """{check name: (status, message)} from doctor's text output."""
    found = {}
    for line in stdout.splitlines():  # "STATUS  name-padded-to-16 message", as CheckResult.line() writes it
        status, name, message = line[:4].strip(), line[6:22].strip(), line[23:]
        if status in (doctor.OK, doctor.WARN, doctor.FAIL):
            found[name] = (status, message)
    return found


# ----------------------------------------------------------------------------------------------------------------
# Help and the frozen surface
# ----------------------------------------------------------------------------------------------------------------
def test_top_level_help_lists_the_subcommands():
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    assert "doctor" in result.stdout and "bench" in result.stdout


@pytest.mark.parametrize("command", sorted(FROZEN_OPTIONS))
def test_subcommand_help_shows_every_option(command):
    result = run_cli(command, "--help")
    assert result.returncode == 0, result.stderr
    for option in FROZEN_OPTIONS[command]:
        assert option in result.stdout, f"{option} missing from `tencache-ds {command} --help`"


@pytest.mark.parametrize("command", sorted(FROZEN_OPTIONS))
def test_option_sets_are_frozen(command):
    parser = build_parser()
    subparsers = next(action for action in parser._actions if action.dest == "command")
    options = sorted(flag for action in subparsers.choices[command]._actions for flag in action.option_strings)
    assert options == sorted(FROZEN_OPTIONS[command])


def test_no_command_is_an_error_and_module_entry_point_works():
    result = run_cli()
    assert result.returncode == 2 and "COMMAND" in result.stderr
    module = subprocess.run([sys.executable, "-m", "tencache_ds.cli.main", "doctor", "--help"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60)
    assert module.returncode == 0 and "--nvme-path" in module.stdout


def test_help_imports_neither_torch_nor_deepspeed():
    code = ("import sys\nfrom tencache_ds.cli.main import build_parser\nbuild_parser().format_help()\n"
            "print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# ----------------------------------------------------------------------------------------------------------------
# doctor
# ----------------------------------------------------------------------------------------------------------------
def test_doctor_on_a_good_folder_passes(tmp_path):
    """Scenario: a fresh folder on a local disk, on a machine with DeepSpeed's async_io op built."""
    # Step 1: run doctor on a folder that does not exist yet (it must be created for the checks and removed).
    nvme = tmp_path / "nvme" / "swap"
    result = run_cli("doctor", "--nvme-path", str(nvme))
    lines = status_lines(result.stdout)
    # Step 2: every check answered, none failed, and the exit code says so.
    assert not [name for name, (status, _) in lines.items() if status == doctor.FAIL], result.stdout
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("versions", "accelerator", "libaio", "async_io op", "ext build lock", "native arena", "memlock",
                 "host", "gpus", "nvme path", "nvme writable", "nvme free space", "nvme filesystem", "nvme bandwidth",
                 "budgets"):
        assert name in lines, f"no {name!r} line in:\n{result.stdout}"
    assert lines["async_io op"][0] == doctor.OK
    assert lines["nvme writable"] == (doctor.OK, f"{nvme} is writable")
    # Step 3: the bandwidth was measured through DeepSpeed's aio handle, and the folder is gone again.
    assert lines["nvme bandwidth"][0] == doctor.OK and "DeepSpeed aio" in lines["nvme bandwidth"][1]
    # Step 4: and the drive as tencache's own engine uses it (reads, writes, both at once), in the same folder.
    assert lines["nvme drive"][0] == doctor.OK and "both at once" in lines["nvme drive"][1]
    assert "tencache DirectFileIO" in lines["nvme drive"][1] and str(nvme) in lines["nvme drive"][1]
    assert "shortened" not in lines["nvme drive"][1]  # timed in full (the suite's other doctor runs are not)
    assert not (tmp_path / "nvme").exists()
    assert result.stdout.splitlines()[-1].startswith("doctor: ")
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("kind", ["file_in_the_way", "under_proc", "is_a_file", "tilde"])
def test_doctor_fails_on_an_unusable_nvme_path(tmp_path, kind):
    """Scenario: the NVMe path cannot hold swap files (as root, permissions do not stop us, so the path is made
    unusable structurally: a file where a folder must be, a folder under /proc, or a plain file)."""
    # Step 1: build the unusable path.
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    # "tilde": DeepSpeed does not expand "~" in a config's nvme_path (the run swaps into ./~/...): doctor checked
    # $HOME's folder instead (helper-194)
    path = {"file_in_the_way": str(blocker / "swap"), "under_proc": "/proc/tencache-doctor-test/swap",
            "is_a_file": str(blocker), "tilde": "~/tencache-doctor-test"}[kind]
    # Step 2: the path's check (doctor_nvme.check_nvme_path, which doctor runs) fails naming the path, nothing else.
    from tencache_ds.cli.doctor_nvme import check_nvme_path
    state = check_nvme_path(path, "--nvme-path")
    try:
        assert [(check.name, check.status) for check in state.checks] == [("nvme path", doctor.FAIL)], state.checks
        assert path in state.checks[0].message and not state.usable
    finally:
        state.cleanup()
    # Step 3: once through the command (each doctor run takes seconds): doctor --json names the path in a FAIL entry
    # and exits non-zero, without a traceback, and so does its text form
    if kind == "file_in_the_way":
        result = run_cli("doctor", "--nvme-path", path, "--json")
        assert result.returncode == 1, result.stdout + result.stderr
        checks = json.loads(result.stdout)
        failures = [check for check in checks if check["status"] == doctor.FAIL]
        assert [check["name"] for check in failures] == ["nvme path"]
        assert path in failures[0]["message"]
        assert {check["status"] for check in checks} <= {doctor.OK, doctor.WARN, doctor.FAIL}
        assert "Traceback" not in result.stdout + result.stderr
        text = run_cli("doctor", "--nvme-path", path)
        assert text.returncode == 1
        assert any(line.startswith("FAIL") and path in line for line in text.stdout.splitlines()), text.stdout
        assert "Traceback" not in text.stdout + text.stderr


def test_doctor_fails_when_the_aio_op_is_missing(tmp_path):
    """Scenario: DeepSpeed's async_io op cannot be built (its libaio link test fails, forced through the
    documented test hook); doctor says so in a FAIL line and still measures bandwidth with plain file I/O."""
    result = run_cli("doctor", "--nvme-path", str(tmp_path), env_extra={doctor.FORCE_NO_AIO_ENV: "1", **QUICK_DRIVE})
    assert result.returncode == 1, result.stdout + result.stderr
    lines = status_lines(result.stdout)
    assert lines["async_io op"][0] == doctor.FAIL
    assert "not compatible" in lines["async_io op"][1] and "libaio" in lines["async_io op"][1]
    assert lines["nvme bandwidth"][0] == doctor.OK and "plain file I/O" in lines["nvme bandwidth"][1]
    assert [name for name, (status, _) in lines.items() if status == doctor.FAIL] == ["async_io op"]
    assert "Traceback" not in result.stdout + result.stderr


def test_doctor_reports_a_bad_tencache_block_and_an_unreadable_config(tmp_path):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"tencache": {"host_cache_bytes": "lots"},
                                  "zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": "/proc/x"}}}))
    result = run_cli("doctor", "--config", str(config), "--json")
    checks = {check["name"]: check for check in json.loads(result.stdout)}
    assert result.returncode == 1
    assert checks["budgets"]["status"] == doctor.FAIL and "host_cache_bytes" in checks["budgets"]["message"]
    # the nvme_path comes from the config when --nvme-path is not given
    assert checks["nvme path"]["status"] == doctor.FAIL and "/proc/x" in checks["nvme path"]["message"]
    missing = run_cli("doctor", "--config", str(tmp_path / "missing.json"), "--nvme-path", "/proc/x")
    assert missing.returncode == 1
    assert status_lines(missing.stdout)["config"][0] == doctor.FAIL
    assert "Traceback" not in missing.stdout + missing.stderr


def test_doctor_reads_a_config_as_the_run_checks_it(tmp_path):
    """Scenario: configs the run refuses at initialize (before writing anything) are FAIL lines of doctor's config
    check too, naming the key; before, doctor said OK to them (only the budgets were checked)."""
    from tencache_ds.cli.doctor_checks import load_ds_config
    base = json.load(open(os.path.join(REPO_ROOT, "configs", "stock-nvme.json")))
    for section in ("offload_param", "offload_optimizer"):
        base["zero_optimization"][section]["nvme_path"] = str(tmp_path / "nvme")
    base["tencache"] = {}
    edits = {"zero_optimization.stage": lambda config: config["zero_optimization"].update(stage=2),
             "aio.tencache": lambda config: config["aio"].update(tencache=config.pop("tencache")),
             "aio.intra_op_parallelism": lambda config: config["aio"].update(intra_op_parallelism=0),
             "tencache.metrics_path": lambda config: config["tencache"].update(metrics_path="/proc/x/m.jsonl"),
             # what DeepSpeed's own models refuse (helper-244's review: "OK config" for a misspelt key)
             "zero_optimization.sub_group_sise": lambda config: config["zero_optimization"].update(sub_group_sise=1)}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(base))
    assert load_ds_config(str(path))[1].status == doctor.OK
    for key, edit in edits.items():
        config = json.loads(json.dumps(base))
        edit(config)
        path.write_text(json.dumps(config))
        read, check = load_ds_config(str(path))
        assert read is not None and check.status == doctor.FAIL and key in check.message, (key, check)
    assert not (tmp_path / "nvme").exists()


def test_doctor_survives_a_probe_that_does_not_finish(tmp_path):
    """Scenario: the probe (torch/DeepSpeed import, async_io load) outlives its timeout, as a first JIT build of the
    op does. The checks that need it FAIL with the reason, the rest still run, and nothing raises."""
    # Step 1: a timeout far shorter than importing torch takes.
    checks = {check.name: check for check in doctor.run_checks(nvme_path=str(tmp_path), probe_timeout_s=0.3)}
    # Step 2: the probe's checks fail and say why, with the fix for the JIT case.
    assert checks["async_io op"].status == doctor.FAIL
    assert "did not finish in 0.3 s" in checks["async_io op"].message
    assert "AsyncIOBuilder().load()" in checks["async_io op"].message
    # The probe starts before the doctor's own checks and is timed from then: where those checks outlast the import
    # of torch and DeepSpeed (a loaded machine: seen once in a full suite run), the probe reported the versions
    # before it was killed. Either way nothing raises and a FAIL says why.
    assert checks["versions"].status == doctor.OK or (
        checks["versions"].status == doctor.FAIL and "did not finish in 0.3 s" in checks["versions"].message)
    # Step 3: the bandwidth is measured without DeepSpeed, and the probe left no file behind.
    assert checks["nvme bandwidth"].status == doctor.OK and "plain file I/O" in checks["nvme bandwidth"].message
    assert checks["host"].status == doctor.OK
    assert checks["nvme drive"].status == doctor.WARN and "not measured" in checks["nvme drive"].message
    assert list(tmp_path.iterdir()) == []


def test_doctor_fails_on_a_stale_build_lock_with_the_remedy(tmp_path):
    """Scenario: a killed JIT build left async_io's `lock` in torch's extension cache, so every DeepSpeed process
    that loads the op would wait forever. doctor names the lock and the fix, does not wait on it itself, and does
    not remove a lock that is not its own."""
    # Step 1: the lock of a dead build, in the extension cache TORCH_EXTENSIONS_DIR names.
    build_dir = tmp_path / "torch_extensions" / "async_io"
    build_dir.mkdir(parents=True)
    lock = build_dir / "lock"
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))
    # Step 2: doctor FAILs the build-lock line with the path and `rm <path>`, and the async_io line says why it did
    # not load the op (stock doctor would wait on the lock until its probe timeout).
    result = run_cli("doctor", "--nvme-path", str(tmp_path / "nvme"), timeout=150,
                     env_extra={"TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"), **QUICK_DRIVE})
    assert result.returncode == 1, result.stdout + result.stderr
    lines = status_lines(result.stdout)
    assert lines["ext build lock"][0] == doctor.FAIL, result.stdout
    assert str(lock) in lines["ext build lock"][1] and f"rm {lock}" in lines["ext build lock"][1]
    assert lines["async_io op"][0] == doctor.FAIL and f"rm {lock}" in lines["async_io op"][1]
    assert lines["versions"][0] == doctor.OK  # the probe ran; only the op behind the lock was skipped
    assert sorted(name for name, (status, _) in lines.items() if status == doctor.FAIL) == \
        ["async_io op", "ext build lock"]
    assert lock.exists()
    assert "Traceback" not in result.stdout + result.stderr


def test_a_probe_killed_mid_build_leaves_no_build_lock(tmp_path, monkeypatch):
    """Regression test: doctor's probe timing out during a first JIT build of DeepSpeed's ops (async_io, and
    pin_memory which it loads first) left the build `lock` behind, and every later DeepSpeed process on the machine
    waited on it forever."""
    # Step 1: an empty extension cache, so the probe has to build the ops from scratch.
    root = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    probe = doctor.Probe(want_aio=True, bandwidth_dir=None, bandwidth_bytes=0, timeout_s=600)
    # Step 2: wait until the first build holds its lock (imports and the libaio link test come first). That is
    # pin_memory's, which DeepSpeed builds before async_io: a build killed there leaves the same kind of lock, and
    # waiting for async_io's own would add pin_memory's whole build (a minute on two cores) to the test.
    deadline = time.monotonic() + 240
    while not (locks := ext_lock.find_locks(str(root))):
        assert probe._process.poll() is None, f"the probe ended before building: {probe.facts()}"
        assert time.monotonic() < deadline, "the probe did not start building DeepSpeed's ops in 240 s"
        time.sleep(0.05)
    lock = locks[0]
    # Step 3: time the probe out now, mid-build: the group is killed and its lock removed, and the report says so.
    probe.timeout_s = 0.0
    facts = probe.facts()
    assert facts["timed_out"] and facts["removed_build_locks"] == [lock]
    assert not os.path.lexists(lock)
    assert ext_lock.find_locks(str(root)) == []
    assert "build lock(s) it left were removed" in doctor.check_async_io(probe).message
    locks_line = doctor.check_build_locks(probe)
    assert locks_line.status == doctor.OK and lock in locks_line.message
    # Step 4: nothing of the killed build still runs: ninja's compilers (each in a process group of its own) too.
    assert ext_lock.kill_session(probe._process.pid, wait_s=0) == 0


def test_doctor_fails_when_the_native_arena_does_not_load(tmp_path):
    """Scenario: the package's native library is not a usable arena build (here: another shared object in its
    place, found before any installed copy). There is no other arena, so a tencache run would fail: doctor FAILs
    and says how to build it."""
    # Step 1: a copy of the package whose _tencache_arena library is some other real shared object (_ctypes).
    import _ctypes
    import importlib.machinery
    package = tmp_path / "tencache_ds"
    shutil.copytree(os.path.join(REPO_ROOT, "tencache_ds"), package,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(_ctypes.__file__, package / ("_tencache_arena" + importlib.machinery.EXTENSION_SUFFIXES[0]))
    code = ("import json\nfrom tencache_ds.cli.doctor import check_native_arena\n"
            "print(json.dumps(check_native_arena().to_dict()))")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(tmp_path)),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # Step 2: FAIL, with the remedy, and no talk of a fallback that does not exist.
    check = json.loads(result.stdout.splitlines()[-1])
    assert check["status"] == doctor.FAIL and check["details"]["native"] is False, check
    assert "pip install -e ." in check["message"]
    assert "pure-Python" not in check["message"]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux) to drop CAP_IPC_LOCK")
def test_doctor_warns_on_a_low_memlock_limit_with_the_fix():
    """Scenario: `ulimit -l` is 64 KiB and the process cannot lock past it (no CAP_IPC_LOCK; as root the
    capability would make any limit moot, so the child is started without it)."""
    code = ("import json, resource\n"
            "resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, 65536))\n"
            "from tencache_ds.cli.doctor import check_memlock\n"
            "print(json.dumps(check_memlock().to_dict()))")
    result = subprocess.run(["setpriv", "--bounding-set=-ipc_lock", "--", sys.executable, "-c", code], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    check = json.loads(result.stdout)
    assert check["status"] == doctor.WARN and check["details"]["cap_ipc_lock"] is False
    assert "64.00 KiB" in check["message"] and "ulimit -l unlimited" in check["message"]


def test_mount_of_picks_the_longest_mount_point():
    mounts = ("/dev/vda / ext4 rw 0 0\n"
              "tmpfs /tmp tmpfs rw 0 0\n"
              "/dev/nvme0n1 /tmp/fast\\040disk xfs rw 0 0\n")
    assert doctor.mount_of("/tmp/fast disk/swap", mounts)["fs_type"] == "xfs"
    assert doctor.mount_of("/tmp/fastdisk", mounts)["fs_type"] == "tmpfs"  # a prefix of a name is not a parent
    assert doctor.mount_of("/home/x", mounts)["mount_point"] == "/"


def test_plain_io_bandwidth_measures_and_cleans_up(tmp_path):
    result = doctor.plain_io_bandwidth(str(tmp_path), 8 << 20)
    assert result["write_bytes"] == 8 << 20 and result["read_bytes"] == 8 << 20
    assert result["write_s"] > 0 and result["read_s"] > 0
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------------------------------
# bench
# ----------------------------------------------------------------------------------------------------------------
def test_bench_rejects_bad_arguments_before_running(tmp_path):
    no_measured = run_cli("bench", "--steps", "2", "--warmup", "2", "--out", str(tmp_path / "out"))
    assert no_measured.returncode == 1 and "--warmup 2 leaves no measured step" in no_measured.stderr
    bad_budget = run_cli("bench", "--host-cache-bytes", "lots")
    assert bad_budget.returncode == 2 and "lots" in bad_budget.stderr
    missing_config = run_cli("bench", "--config", str(tmp_path / "nope.json"), "--out", str(tmp_path / "out"))
    assert missing_config.returncode == 1 and "nope.json does not exist" in missing_config.stderr
    folder_config = run_cli("bench", "--config", str(tmp_path), "--out", str(tmp_path / "out"))
    assert folder_config.returncode == 1 and f"{tmp_path} is not a file" in folder_config.stderr  # (helper-244)
    assert "Traceback" not in no_measured.stderr + bad_budget.stderr + missing_config.stderr + folder_config.stderr
    # a path the bench makes from its own option is refused naming that option first (helper-244's review: only the
    # config keys the bench wrote, which the user never did)
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    nvme_in_a_file = run_cli("bench", "--nvme-path", str(a_file), "--out", str(tmp_path / "out"))
    assert nvme_in_a_file.returncode == 1 and f"--nvme-path {a_file} (where the bench puts its run's tencache-1)" \
        in nvme_in_a_file.stderr, nvme_in_a_file.stderr
    assert not (tmp_path / "out").exists()
    # a budget the tencache run would refuse at initialize: refused before stock's run, and before --out is made
    # (until 2026-12-02 the out folder was made first, and stock trained before the tencache run stopped)
    too_large = run_cli("bench", "--host-cache-bytes", "10000TB", "--out", str(tmp_path / "never"))
    assert too_large.returncode == 1 and "tencache.host_cache_bytes = 10000000000000000" in too_large.stderr, \
        too_large.stderr
    assert not (tmp_path / "never").exists() and "Traceback" not in too_large.stderr
    # per rank: at --ranks 2, 60% of the node's memory each is more than the node has
    from tencache_ds.plan.budget import MachineResources
    share = int(0.6 * MachineResources.probe().host_total_bytes)
    two_ranks = run_cli("bench", "--ranks", "2", "--host-cache-bytes", str(share), "--out", str(tmp_path / "never"))
    assert two_ranks.returncode == 1 and "x 2 ranks on this node" in two_ranks.stderr, two_ranks.stderr
    # refused before any run (the tencache run's own refusal came after stock's had trained)
    assert not (tmp_path / "never").exists()
    # a model scripts/train.py does not know, a sequence past the model's position table (gpt2-tiny: 256)
    unknown = run_cli("bench", "--model", "gtp2-tiny", "--out", str(tmp_path / "never"))
    assert unknown.returncode == 1 and "--model gtp2-tiny: no such model" in unknown.stderr, unknown.stderr
    too_long = run_cli("bench", "--seq-len", "512", "--out", str(tmp_path / "never"))
    assert too_long.returncode == 1 and "--seq-len 512 is longer than gpt2-tiny's" in too_long.stderr, too_long.stderr
    assert not (tmp_path / "never").exists()
    (tmp_path / "a-file").write_text("")
    on_a_file = run_cli("bench", "--out", str(tmp_path / "a-file" / "out"))
    assert on_a_file.returncode == 1 and "--out" in on_a_file.stderr and "Traceback" not in on_a_file.stderr
    for bad in ("0", "fast"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "--nvme-bandwidth", bad])
    assert build_parser().parse_args(["bench", "--nvme-bandwidth", "2GB"]).nvme_bandwidth == 2 * 10 ** 9


def test_bench_holds_its_nvme_path_and_leaves_no_earlier_summary_beside_a_failed_run(tmp_path):
    """Scenario: two benches given one --nvme-path (the default, say) used the same run folders, each emptying the
    other's live swap files before its own runs; and a bench that failed left an earlier bench's bench.json in
    --out beside its own logs, which validate_estimate.py --reprice reads as this bench's."""
    from tencache_ds.cli.bench import TRAIN_SCRIPT_ENV
    from tencache_ds.io import folder_lock
    nvme = tmp_path / "nvme"
    # Step 1: another process holds --nvme-path (as a running bench does): refused by name, nothing made.
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from tencache_ds.io import folder_lock; "
                               "from tencache_ds.cli.bench import bench_lock_folder; "
                               "folder_lock.hold(bench_lock_folder(sys.argv[1])); print('held', flush=True); "
                               "time.sleep(60)", str(nvme)],
                              cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = run_cli("bench", "--nvme-path", str(nvme), "--nvme-bandwidth", "1GB", "--out", str(tmp_path / "no"))
    finally:
        holder.kill()
        holder.wait()
    assert refused.returncode == 1 and f"--nvme-path {nvme} is in use by another bench" in refused.stderr, \
        refused.stderr
    assert f"pid {holder.pid}" in refused.stderr and not (tmp_path / "no").exists()
    # Step 2: let go, the bench runs; its first run fails (a train script that exits 1): the earlier bench's
    # summary in --out is gone, in either form, and so is its result file for the run that failed; the lock went
    # with the bench.
    out = tmp_path / "out"
    out.mkdir()
    # (and as docs/ keeps them, archived: bench/records.py reads an archive where the plain file is missing)
    for name in ("bench.json", "bench.md", "dashboard.png", "bench.json.gz", "stock-1.result.json.gz"):
        (out / name).write_text("an earlier bench's")
    failing = tmp_path / "fails.py"
    failing.write_text("import sys; sys.exit(1)\n")
    failed = run_cli("bench", "--nvme-path", str(nvme), "--nvme-bandwidth", "1GB", "--launcher", "python", "--out",
                     str(out), "--steps", "2", "--warmup", "1", "--config",
                     os.path.join(REPO_ROOT, "configs", "stock-nvme.json"), env_extra={TRAIN_SCRIPT_ENV: str(failing)})
    assert failed.returncode == 1 and "stock-1 failed with exit code 1" in failed.stderr, failed.stderr
    assert sorted(path.name for path in out.iterdir()) == ["stock-1.log"]
    from tencache_ds.cli.bench import bench_lock_folder
    folder_lock.let_go(folder_lock.hold(bench_lock_folder(str(nvme))))  # free again


def test_a_bench_summary_is_replaced_whole_or_not_at_all(tmp_path):
    """A bench killed while writing bench.json (here: its writer raises half-way) leaves the earlier file and no
    temporary one, never a truncated file that a later reader stops on."""
    from tencache_ds.cli.bench import _write_replacing
    path = tmp_path / "bench.json"
    _write_replacing(str(path), lambda handle: json.dump({"runs": 1}, handle))

    def half_then_raise(handle):
        handle.write('{"runs": ')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _write_replacing(str(path), half_then_raise)
    assert json.loads(path.read_text()) == {"runs": 1} and os.listdir(tmp_path) == ["bench.json"]


def test_bench_dependency_check_names_the_missing_modules_and_the_install_command():
    from tencache_ds.cli import bench
    # Real look-ups: a module that exists and two that do not.
    assert bench.missing_modules(["json", "tencache_no_such_module", "tencache_nor_this"]) == \
        ["tencache_no_such_module", "tencache_nor_this"]
    bench.check_dependencies(["json"])  # nothing missing: no error
    with pytest.raises(bench.BenchError) as raised:
        bench.check_dependencies(["json", "tencache_no_such_module"])
    message = str(raised.value)
    assert "tencache_no_such_module" in message and "json" not in message.split(";")[0]
    assert "pip install -e '.[bench]'" in message and "pip install tencache_no_such_module" in message
    # By default it checks what scripts/train.py imports and the required part of the bench extra.
    assert set(bench.REQUIRED_MODULES) == {"torch", "deepspeed", "transformers", "accelerate", "tqdm"}


def test_bench_without_transformers_stops_before_launching_anything(tmp_path):
    """Regression test: without the `bench` extra, `tencache-ds bench` died inside the first training run with
    `ModuleNotFoundError: No module named 'transformers'`. Now it says what to install before starting a run."""
    # Step 1: a bench process in which transformers cannot be imported (None in sys.modules is how Python
    # spells "not importable": import raises ModuleNotFoundError and find_spec returns None).
    out = tmp_path / "out"
    code = ("import sys; sys.modules['transformers'] = None\n"
            "from tencache_ds.cli.main import main; main()")
    result = subprocess.run([sys.executable, "-c", code, "bench", "--out", str(out), "--nvme-path",
                             str(tmp_path / "nvme")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    # Step 2: exit 1, the module and both install commands named, no traceback.
    assert result.returncode == 1, result.stdout + result.stderr
    assert "transformers" in result.stderr and "pip install -e '.[bench]'" in result.stderr
    assert "pip install transformers" in result.stderr
    assert "Traceback" not in result.stderr
    # Step 3: nothing was launched or written.
    assert not out.exists() and not (tmp_path / "nvme").exists()


def test_bench_extra_list_matches_pyproject():
    """bench.BENCH_EXTRA restates the `bench` extra of pyproject.toml (for the install advice); keep them equal."""
    import re
    import tomllib
    from tencache_ds.cli import bench
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as fh:
        extra = tomllib.load(fh)["project"]["optional-dependencies"]["bench"]
    assert sorted(re.split(r"[<>=!~ \[]", requirement)[0] for requirement in extra) == sorted(bench.BENCH_EXTRA)


def synthetic_runs():
    """Two runs as scripts/train.py would record them (see tests/cli/test_report.py for the contract)."""
    from tencache_ds.bench.report import BenchRun

    def result(times):
        steps = [{"step": step, "loss": 7.0, "loss_bits": "0x40e00000", "time_s": time_s,
                  "peak_rss_bytes": (100 + step) << 20, "io_read_bytes": 4096 * step, "io_write_bytes": 0,
                  "stats": {"pinned_bytes_reserved": 1 << 20}} for step, time_s in enumerate(times)]
        return {"model": "gpt2-tiny", "steps": steps, "weights_sha256": "a" * 64}
    return [BenchRun("stock", 1, result([3.0, 1.0, 1.2])), BenchRun("tencache", 1, result([3.0, 0.5, 0.6]))]


def test_bench_writes_one_dashboard_and_no_per_stat_pngs(tmp_path):
    """The output stage of `tencache-ds bench`: one dashboard.png in --out, nothing else drawn; the constant
    pinned memory is named instead of plotted."""
    pytest.importorskip("matplotlib")
    from tencache_ds.cli import bench
    args = build_parser().parse_args(["bench", "--out", str(tmp_path)])
    path, note, constants = bench.write_figure(args, synthetic_runs(), str(tmp_path), "gpt2-tiny")
    assert path == str(tmp_path / "dashboard.png") and note == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["dashboard.png"]
    assert any("pinned" in text for text in constants)
    # --no-plots: no figure, and the reason for bench.md
    args = build_parser().parse_args(["bench", "--no-plots"])
    path, note, _ = bench.write_figure(args, synthetic_runs(), str(tmp_path / "none"), "")
    assert (path, note) == (None, "No figure (--no-plots).")


def test_a_figure_that_fails_to_draw_leaves_the_summary_to_be_written(tmp_path, monkeypatch):
    """Regression (helper-186's review): a dashboard that raised (a full disk, a matplotlib error) stopped the bench
    before bench.json and bench.md, the summary of runs that took minutes; now the figure is left out, said why."""
    from tencache_ds.bench import dashboard
    from tencache_ds.cli import bench

    def fails(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(dashboard, "matplotlib_available", lambda: True)
    monkeypatch.setattr(dashboard, "write_dashboard", fails)
    args = build_parser().parse_args(["bench", "--out", str(tmp_path)])
    path, note, _ = bench.write_figure(args, synthetic_runs(), str(tmp_path), "gpt2-tiny")
    assert path is None and note.startswith("No figure: drawing it failed (OSError") and "No space" in note, note


def test_bench_without_matplotlib_writes_no_figure_and_says_so(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "sys.path.insert(0, 'tests/cli')\n"
            "from test_cli import synthetic_runs\n"
            "import json\nfrom tencache_ds.cli import bench\nfrom tencache_ds.cli.main import build_parser\n"
            "args = build_parser().parse_args(['bench'])\n"
            f"print(json.dumps(bench.write_figure(args, synthetic_runs(), {str(tmp_path)!r}, 't')[:2]))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    assert result.returncode == 0, result.stderr
    path, note = json.loads(result.stdout)
    assert path is None and note.startswith("No figure: matplotlib is not installed") and "pip install" in note
    assert list(tmp_path.iterdir()) == []


def test_bench_run_plan_interleaves_repeats_and_differs_only_in_the_tencache_block(tmp_path):
    """Scenario: --repeats 2 with an explicit host budget; the plan is built but nothing is launched."""
    from tencache_ds.cli import bench
    # Step 1: parse the options as the CLI does and build the plan for the deepspeed launcher.
    args = build_parser().parse_args(["bench", "--repeats", "2", "--host-cache-bytes", "1GiB", "--nvme-path",
                                      str(tmp_path / "nvme"), "--out", str(tmp_path / "out")])
    ds_config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}},
                 "tencache": {"device_cache_bytes": 0}}
    specs = bench.build_runs(args, REPO_ROOT, os.path.join(REPO_ROOT, "scripts", "train.py"), "/cfg.json",
                             ds_config, str(tmp_path / "out"), "deepspeed")
    # Step 2: stock and tencache alternate, each with its own swap folder, result file and log.
    assert [spec.label for spec in specs] == ["stock-1", "tencache-1", "stock-2", "tencache-2"]
    assert len({spec.nvme_dir for spec in specs}) == len({spec.result_path for spec in specs}) == 4
    # Step 3: the command lines are identical except the tencache block, the per-run paths and label.
    def block_of(spec):
        return spec.command[spec.command.index("--tencache-block") + 1]
    assert block_of(specs[0]) == "none"
    block = json.loads(block_of(specs[1]))
    assert block == {"enabled": True, "device_cache_bytes": 0, "host_cache_bytes": 1 << 30,
                     "metrics_path": str(tmp_path / "out" / "tencache-1.metrics.jsonl"),
                     "profile_path": str(tmp_path / "out" / "tencache-1.profile.json")}  # each run its own profile
    varying = {"--tencache-block", "--nvme-path", "--result-file", "--label"}
    def fixed_part(spec):
        return [arg for index, arg in enumerate(spec.command) if index == 0 or spec.command[index - 1] not in varying]
    assert fixed_part(specs[0]) == fixed_part(specs[1])
    assert specs[0].command[1:4] == ["-m", "deepspeed.launcher.runner", "--num_gpus"]
    # the launcher's port is chosen as each run starts, not now (another process may take it before then)
    assert {spec.command[spec.command.index("--master_port") + 1] for spec in specs} == {bench.PORT_AT_START}


def test_bench_compare_cpu_runs_stock_cpu_offload_with_deepspeeds_fetch_defaults(tmp_path):
    """Scenario: `bench --compare cpu` with a config tuned to keep stock NVMe alive (reuse distance 0, persistence
    threshold 0). Its third arm is stock DeepSpeed with both offloads on the CPU and DeepSpeed's default stage-3 fetch
    knobs, what a user whose memory holds the model runs (helper-241's review: no test read that command): the plan
    and the config scripts/train.py builds from that command line."""
    from tencache_ds.cli import bench
    args = build_parser().parse_args(["bench", "--repeats", "2", "--compare", "cpu", "--nvme-path",
                                      str(tmp_path / "nvme"), "--out", str(tmp_path / "out")])
    config_path = os.path.join(REPO_ROOT, "configs", "stock-nvme.json")
    with open(config_path) as handle:
        ds_config = json.load(handle)
    specs = bench.build_runs(args, REPO_ROOT, os.path.join(REPO_ROOT, "scripts", "train.py"), config_path,
                             ds_config, str(tmp_path / "out"), "deepspeed")
    assert [spec.label for spec in specs] == ["stock-1", "tencache-1", "stock-cpu-1", "stock-2", "tencache-2",
                                              "stock-cpu-2"]
    cpu = specs[2]
    assert cpu.metrics_path is None and cpu.command[cpu.command.index("--tencache-block") + 1] == "none"
    # the config train.py builds from the arm's own arguments (those after the script's path)
    sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
    try:
        import train
    finally:
        sys.path.pop(0)
    train_args = train.parse_args(cpu.command[cpu.command.index(os.path.join(REPO_ROOT, "scripts", "train.py")) + 1:])
    zero = train.load_ds_config(train_args.ds_config_path, train_args)["zero_optimization"]
    assert (zero["offload_param"]["device"], zero["offload_optimizer"]["device"]) == ("cpu", "cpu")
    assert not set(train.STAGE3_FETCH_KNOBS) & set(zero), zero
    stock_zero = ds_config["zero_optimization"]  # the stock NVMe arm keeps the config's knobs
    assert {"stage3_max_reuse_distance", "stage3_param_persistence_threshold"} <= set(stock_zero)


def test_bench_measures_the_drive_with_the_configs_requests_in_flight(tmp_path, monkeypatch):
    """Scenario: the bench's probe measures the drive under --nvme-path through tencache's engine, with as many
    requests in flight as the config's swappers issue (aio.intra_op_parallelism 3: 3 per store, 6 for both)."""
    from tencache_ds.cli import bench
    monkeypatch.setenv(drive_rate.QUICK_ENV, "1")  # the probe's environment: what is checked is not the rate
    probe, why_not = bench.start_probe(str(tmp_path / "nvme"), True, {"aio": {"intra_op_parallelism": 3}})
    bandwidth, record = bench.nvme_bandwidth(str(tmp_path / "nvme"), probe, None, why_not)
    assert why_not is None and bandwidth is not None, record
    assert {trial["threads"] for trial in record["drive"]["trials"]} == {3, 6}
    # the bound's rates are the measurement's: each direction's fastest, alone or beside the other, and combined
    drive = record["drive"]
    assert bandwidth.read_bytes_per_s == max(drive["read_bytes_per_s"], drive["both_read_bytes_per_s"])
    assert bandwidth.combined_bytes_per_s == drive["combined_bytes_per_s"]
    assert "tencache DirectFileIO" in bandwidth.source
    assert list((tmp_path / "nvme").iterdir()) == []  # its files are gone


def test_bench_rejects_an_invalid_tencache_block_before_running():
    from tencache_ds.cli import bench
    from tencache_ds.errors import TencacheConfigError
    with pytest.raises(TencacheConfigError, match="no_such_key"):
        bench.tencache_block({"tencache": {"no_such_key": 1}}, None, None, None)


def test_bench_refuses_a_config_the_tencache_run_would_refuse_before_anything_runs_or_is_written(tmp_path):
    """Scenario: `bench --offload cpu` (its config offloads nothing to NVMe) and a config whose aio settings the
    tencache run refuses. Before, stock's run trained first and the tencache run stopped at its initialize, with
    --out, logs and the drive probe's files already written."""
    out, nvme = tmp_path / "out", tmp_path / "nvme"
    result = run_cli("bench", "--offload", "cpu", "--steps", "3", "--warmup", "1", "--out", str(out),
                     "--nvme-path", str(nvme))
    assert result.returncode == 1 and "zero_optimization.offload_param.device" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not out.exists() and not nvme.exists()
    config = json.load(open(os.path.join(REPO_ROOT, "configs", "stock-nvme.json")))
    config["aio"]["intra_op_parallelism"] = 0
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    result = run_cli("bench", "--config", str(path), "--out", str(out), "--nvme-path", str(nvme))
    assert result.returncode == 1 and "aio.intra_op_parallelism" in result.stderr, result.stderr
    assert not out.exists() and not nvme.exists()
    # the arm's config as train.py hands it over: its --nvme-path, and --dtype's rewrite of the precision sections
    # (bf16 masters in the file, --dtype bf16 replaces the section: the run is not refused for them)
    from tencache_ds.cli import bench
    from tencache_ds.errors import TencacheConfigError
    from tencache_ds.zero_sections import check_zero_sections
    config["aio"]["intra_op_parallelism"] = 1
    config["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True}
    config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-4}}
    block = bench.tencache_block(config, None, None, None)
    with pytest.raises(TencacheConfigError, match="bf16.bf16_master_weights_and_grads"):
        check_zero_sections(dict(config, tencache=block))  # the file as it is
    bench.check_tencache_arm(config, block, "bf16", str(nvme / "tencache-1"))  # as the run gets it
    assert not nvme.exists()


def test_bench_refuses_a_path_starting_with_a_tilde_before_anything(tmp_path):
    """Regression test (helper-215): `--nvme-path=~/x` (no shell expands "~" after "=") was made absolute under the
    working folder before the run's own "~" check saw it: the drive probe and every swap file went to ./~/x."""
    out = tmp_path / "out"
    result = run_cli("bench", "--offload", "cpu", "--steps", "3", "--warmup", "1", "--out", str(out),
                     "--nvme-path=~/tencache-test-nvme")
    assert result.returncode == 1 and "--nvme-path = '~/tencache-test-nvme' starts with '~'" in result.stderr, \
        result.stderr
    assert not out.exists() and not os.path.exists(os.path.join(REPO_ROOT, "~"))


def test_bench_says_what_its_dtype_and_micro_batch_replace_in_the_config():
    """Scenario: a config that trains fp32 at micro-batch 1, benchmarked without --dtype or --micro-batch. The
    bench's defaults (bf16, 2) replace both in every arm; before, nothing said so."""
    from tencache_ds.cli import bench
    config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": False}}
    assert bench.replaced_config_values(config, "bf16", 2) == [
        "--dtype bf16 replaces the config's fp32",
        "--micro-batch 2 replaces the config's train_micro_batch_size_per_gpu 1"]
    assert bench.replaced_config_values(config, "fp32", 1) == []
    assert bench.replaced_config_values({"fp16": {"enabled": True}}, "bf16", 2) == [
        "--dtype bf16 replaces the config's fp16"]


@pytest.mark.slow
@pytest.mark.deepspeed
def test_bench_end_to_end(tmp_path):
    """Scenario: the real benchmark, shortened (3 steps, 1 warm-up) through the deepspeed launcher: stock and
    tencache runs of gpt2-tiny on NVMe offload, compared."""
    out = tmp_path / "out"
    result = run_cli("bench", "--steps", "3", "--warmup", "1", "--dtype", "fp32", "--out", str(out), "--nvme-path",
                     str(tmp_path / "nvme"), timeout=600, env_extra=QUICK_DRIVE)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The headline went to stdout, with both arms, the bound and the equality row; the full table did not.
    assert "step time (s, median)" in result.stdout and "identical losses / weights" in result.stdout
    assert "step time / bound" in result.stdout and "stats.param_hits" not in result.stdout
    bench = json.loads((out / "bench.json").read_text())
    assert [run["label"] for run in bench["runs"]] == ["stock-1", "tencache-1"]
    for run in bench["runs"]:  # the port each run was given as it started, in the commands the bench records
        assert run["command"][run["command"].index("--master_port") + 1].isdigit(), run["command"]
        with open(run["log"]) as log:
            assert log.readline() == "# " + shlex.join(run["command"]) + "\n"
    assert bench["comparison"]["num_measured_steps"] == {"stock": 2, "tencache": 2}
    # Stock and tencache train the same model identically.
    assert bench["comparison"]["losses_identical"], bench["comparison"]["losses_detail"]
    assert bench["comparison"]["weights_identical"], bench["comparison"]["weights_detail"]
    # The drive was measured once, before the runs, through tencache's engine, and is in bench.json with the bound;
    # the bound's NVMe part is the least bytes of tencache's profile (none here: "auto" holds gpt2-tiny).
    assert bench["nvme_bandwidth"]["read_bytes_per_s"] > 0 and bench["nvme_bandwidth"]["drive"]["trials"]
    assert bench["comparison"]["bound"]["io_s"] is not None
    assert (out / "tencache-1.profile.json").is_file()
    markdown = (out / "bench.md").read_text()
    assert "tencache-ds bench --steps 3" in markdown and "accelerator" in markdown and "## Full table" in markdown
    assert "--dtype fp32 replaces the config's bf16, in every arm" in markdown  # configs/stock-nvme.json's bf16
    for name in ("stock-1.log", "tencache-1.log"):
        assert (out / name).is_file(), name
    # One figure, no per-stat PNGs.
    pngs = sorted(str(path.relative_to(out)) for path in out.rglob("*.png"))
    assert pngs == (["dashboard.png"] if bench["figure"] else []), pngs
    assert "step 2 loss" in (out / "tencache-1.log").read_text()
    assert not (tmp_path / "nvme" / "stock-1").exists()  # each run's swap folder is removed after it


def test_checkpoint_for_cpu_on_a_folder_that_is_no_checkpoint_exits_2_naming_it(tmp_path):
    result = run_cli("checkpoint-for-cpu", str(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"tencache-ds checkpoint-for-cpu: {tmp_path} holds no ZeRO-3 optimizer file" in result.stderr


@pytest.mark.parametrize("block, says", [("on", "must be an object"), ([], "must be an object"),
                                         ({"enabled": "no"}, "tencache.enabled")])
def test_the_bench_refuses_a_bad_block_in_its_config_instead_of_replacing_it(block, says):
    """Regression test (helper-161's review): the bench's tencache arm replaced a block that was no object, and
    forced an invalid "enabled" to true, where doctor and the run refuse them; a valid block is enabled for the arm."""
    from tencache_ds.cli.bench import tencache_block
    from tencache_ds.errors import TencacheConfigError
    with pytest.raises(TencacheConfigError, match=says):
        tencache_block({"tencache": block}, None, None, None)
    assert tencache_block({"tencache": {"enabled": False}}, None, None, None)["enabled"] is True


def test_train_py_names_the_flag_of_a_bad_value():
    """Regression (helper-186's review): scripts/train.py (the bench's and the tests' training script) stopped on a
    mistyped --tencache-block with a bare JSONDecodeError, and took --steps 0 into DeepSpeed."""
    for args, message in ((["--tencache-block", "{bad"], "argument --tencache-block: not JSON"),
                          (["--tencache-block", "[1]"], "argument --tencache-block: a JSON object"),
                          (["--steps", "0"], "argument --steps: must be a positive whole number")):
        result = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "scripts", "train.py"), *args],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr[-2000:])


def test_a_teardown_abort_counts_as_finished_for_stocks_runs_only(tmp_path):
    """Regression test (helper-215): stock DeepSpeed's aio handles can abort the interpreter's teardown after a
    finished run, which then counts; a tencache run (which makes no such handle) that aborted was counted too."""
    from tencache_ds.cli import bench
    log, result = tmp_path / "run.log", tmp_path / "run.json"
    log.write_text("step 3 loss 1.0\nterminate called without an active exception\n")
    result.write_text("{}")
    for arm, counts in (("stock", True), ("stock-cpu", True), ("tencache", False)):
        spec = bench.RunSpec(arm, 1, [], {}, str(log), str(result), None, str(tmp_path / "nvme"))
        assert bench._finished_but_teardown_aborted(spec) is counts, arm


def test_a_probe_stopped_while_it_runs_ends_with_its_session(tmp_path):
    """Regression test (helper-215): a bench interrupted (Ctrl-C, SIGTERM, SIGHUP) while the drive's probe ran left
    the probe, in a session of its own, measuring the drive beside the next bench. ``stop`` ends it and its files."""
    from tencache_ds.cli.doctor_probe import Probe
    probe = Probe(want_aio=False, bandwidth_dir=None, bandwidth_bytes=0, drive_dir=str(tmp_path))
    probe.stop()
    assert probe._process.poll() is not None
    assert not [name for name in os.listdir(tmp_path) if "tencache" in name]
    probe.stop()  # (ended: nothing to do)


def test_the_bench_leaves_a_signal_nohup_ignores_ignored():
    """Regression test (helper-219): SIGHUP raised KeyboardInterrupt whatever its handler was: under nohup the
    closed terminal stopped the bench it was meant to keep running. SIGTERM is Ctrl-C's path all the same."""
    import signal
    from tencache_ds.cli import interrupts
    before = {number: signal.signal(number, handler) for number, handler in
              ((signal.SIGHUP, signal.SIG_IGN), (signal.SIGTERM, signal.SIG_DFL))}
    try:
        replaced = interrupts.interrupting_signals()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN and signal.SIGHUP not in replaced
        assert signal.getsignal(signal.SIGTERM) == interrupts._raise_keyboard_interrupt
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def test_an_interrupted_doctor_stops_its_probe(tmp_path, monkeypatch):
    """Regression test (helper-231): doctor stopped on Ctrl-C (or SIGTERM, or a check that raised) left its probe
    running in its session of its own, measuring the drive beside the next run; the bench stops its probe so."""
    started = []

    class RecordedProbe(doctor.Probe):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(doctor, "Probe", RecordedProbe)
    monkeypatch.setattr(doctor, "check_libaio", interrupted)
    with pytest.raises(KeyboardInterrupt):
        doctor.run_checks(nvme_path=str(tmp_path / "nvme"))
    assert len(started) == 1 and started[0]._process.poll() is not None


def test_gpus_that_deepspeeds_accelerator_cannot_use_are_a_warning(monkeypatch):
    """Regression test (helper-231): NVML saw an H100, DeepSpeed chose its CPU accelerator (a CPU torch, or a CUDA
    build newer than the driver), and doctor said OK on both lines: the run would train on the CPU."""
    import types
    from tencache_ds.cli.doctor_checks import WARN, OK, check_accelerator
    accel = {"device_name": "cpu", "name": "cpu", "device_count": 1, "communication_backend": "gloo"}
    probe = types.SimpleNamespace(facts=lambda: {"accelerator": accel})
    assert check_accelerator(probe).status == OK  # no GPU: the CPU accelerator is this machine's
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "free_bytes": 80 << 30}]
    warned = check_accelerator(probe, gpus)
    assert warned.status == WARN and "this torch cannot use them" in warned.message
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # hidden on purpose (helper-232): no advice to reinstall torch
    assert check_accelerator(probe, gpus).status == OK


def test_a_crash_of_the_stock_cpu_arm_is_a_result_not_the_end_of_the_bench(tmp_path):
    """helper-241: stock CPU offload is OOM-killed in initialize on a model beyond the host's memory, and any arm but
    stock NVMe raised: the finished stock and tencache runs (minutes each) got no comparison. Its crash is recorded
    and its other repeats skipped, as stock NVMe's beside it; both crashing, or any tencache failure, still raises."""
    from tencache_ds.cli.bench import BenchError, RunSpec, run_all
    log = tmp_path / "log"
    log.write_text("RuntimeError: DataLoader worker (pid 7) is killed by signal: Killed\n")

    def specs():
        return [RunSpec(arm, repeat, [], {}, str(log), str(tmp_path / f"{arm}{repeat}"), None, str(tmp_path))
                for repeat in (1, 2) for arm in ("stock", "tencache", "stock-cpu")]

    def crashing(*arms):
        ran = []

        def execute(spec, _progress):
            ran.append(spec.label)
            if spec.arm in arms:
                spec.returncode = 137
                raise BenchError(f"{spec.label} failed")
        return execute, ran

    execute, ran = crashing("stock-cpu")
    crashed = run_all(specs(), execute, None)
    assert list(crashed) == ["stock-cpu"] and "stock-cpu-1 exited 137: RuntimeError: DataLoader" in crashed["stock-cpu"]
    assert ran == ["stock-1", "tencache-1", "stock-cpu-1", "stock-2", "tencache-2"]
    execute, _ran = crashing("stock", "stock-cpu")
    with pytest.raises(BenchError, match="both stock arms crashed"):
        run_all(specs(), execute, None)
    execute, _ran = crashing("tencache")
    with pytest.raises(BenchError, match="tencache-1 failed"):
        run_all(specs(), execute, None)
