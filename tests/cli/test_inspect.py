"""`tencache-ds profile show` and `tencache-ds plan` on profile files written by the profile module itself (real
files, a fresh interpreter per command, as a user runs them), and their frozen option sets."""
import json
import os
import subprocess
import sys

import pytest

from tencache_ds.cli.main import build_parser
from tencache_ds.profile.step_profile import StepProfile
from tencache_ds.profile.steady import SteadyTimings
from tencache_ds.profile.store import fingerprint, read_sections, save_section, save_steady

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20

FROZEN_OPTIONS = {
    ("profile",): ["--help", "-h"],
    ("profile", "show"): ["--first", "--help", "--json", "-h"],
    ("plan",): ["--first", "--help", "--host-cache-bytes", "--in-flight-bytes", "--json", "--read-bandwidth", "-h"],
}


def run_cli(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", "from tencache_ds.cli.main import main; main()", *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def profile_file(tmp_path):
    """A params section as a demand-fetched training step records it (forward 1 2 3, backward 3 2 1; each read
    of 1 MiB takes 10 ms and is waited for; 20 ms of compute between accesses) and an untimed optimizer section
    of four 4 MiB tensors."""
    keys = [1, 2, 3, 3, 2, 1]
    nbytes = [MIB] * 6
    offsets = [0.02 + i * 0.03 for i in range(6)]  # each gap: 10 ms waiting for the previous read + 20 ms compute
    reads = [0.01, 0.01, 0.01, None, 0.01, 0.01]   # the turnaround's second use of 3 was a hit
    stalls = [0.0, 0.01, 0.01, 0.01, 0.0, 0.01, 0.01]
    params = StepProfile(tuple(keys), tuple(nbytes), tuple(offsets), tuple(reads), tuple(stalls), 0.2)
    path = str(tmp_path / "profile.json")
    save_section(path, "params", fingerprint([[1, 1]]), params, {"dtype": "torch.bfloat16", "world_size": 1})
    save_section(path, "optimizer", fingerprint([["m", 1]]),
                 StepProfile.untimed(["m", "exp_avg", "exp_avg_sq", "grad"], [4 * MIB] * 4), {"dtype": "fp32"})
    return path


def test_profile_show_summarises_sequence_sizes_and_timings(profile_file):
    result = run_cli("profile", "show", profile_file, "--first", "4")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "[params]" in out and "[optimizer]" in out
    assert "6 accesses, 3 distinct tensors; first 4: 1 2 3 3" in out
    assert "1.00 MiB x 3" in out and "dtype=torch.bfloat16" in out
    assert "5 of 6 accesses read NVMe: 5.00 MiB in 0.0500 s of read times (100.00 MiB/s a read" in out
    assert "step 0.2000 s = compute 0.1500 s + I/O wait 0.0500 s" in out
    assert "repeats    none timed (the timings above are the recorded step's, the run's first)" in out
    save_steady(profile_file, "params", fingerprint([[1, 1]]),
                SteadyTimings(steps=4, step_s=0.12, compute_s=0.1, stall_s=0.02, read_bytes=3 * MIB, read_s=0.03,
                              reads=3))
    out = run_cli("profile", "show", profile_file).stdout
    assert ("repeats    median of 4 timed: step 0.1200 s = compute 0.1000 s + I/O wait 0.0200 s; 3 reads, 3.00 MiB "
            "in 0.0300 s") in out

    data = json.loads(run_cli("profile", "show", profile_file, "--json").stdout)
    params = data["sections"]["params"]
    assert params["accesses"] == 6 and params["distinct_keys"] == 3 and params["first_keys"] == [1, 2, 3, 3, 2, 1]
    assert params["read_bytes"] == 5 * MIB and params["compute_s"] == pytest.approx(0.15)
    assert params["size_histogram"] == {str(MIB): 3}
    assert data["sections"]["optimizer"]["reads"] == 0
    assert params["steady"]["steps"] == 4 and data["sections"]["optimizer"]["steady"] is None


def test_plan_reports_residency_leads_and_step_time(profile_file):
    # 3 MiB of host tier: the params (3 MiB, 3 bytes saved per byte) take it all; optimizer state streams
    result = run_cli("plan", profile_file, "--host-cache-bytes", "3MiB", "--read-bandwidth", "100MiB/s", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["host_tier_split"] == {"params": 3 * MIB, "optimizer": 0}
    params, optimizer = data["sections"]["params"], data["sections"]["optimizer"]
    assert params["held_tensors"] == 3 and params["reads"] == 0
    assert params["predicted_step_s"] == pytest.approx(params["compute_s"]) == pytest.approx(0.15)
    # every optimizer tensor is read, back to back with no compute between: the device is the bound
    assert optimizer["reads"] == 4 and optimizer["read_s"] == pytest.approx(0.16)
    assert optimizer["io_bound_s"] == pytest.approx(0.16) and optimizer["predicted_step_s"] >= 0.16 - 1e-9
    # with two sections, each one's compute holds the other's waits: the bound is its reads alone (helper-199: the
    # params' "bound" was its whole recorded step, the update's reads in it)
    assert params["io_bound_s"] == 0 and params["io_bound_of"] == optimizer["io_bound_of"] == "reads"
    streamed = json.loads(run_cli("plan", profile_file, "--host-cache-bytes", "0", "--read-bandwidth", "100MiB/s",
                                  "--json").stdout)["sections"]["params"]
    assert streamed["io_bound_s"] == pytest.approx(streamed["read_s"]), streamed
    assert 0 < streamed["read_s"] < streamed["compute_s"], streamed  # (max(compute, reads) would be the compute)

    # no host tier, measured bandwidth (100 MiB/s), 1 MiB in flight: every read of the params one access ahead
    streaming = run_cli("plan", profile_file, "--in-flight-bytes", "1MiB")
    assert streaming.returncode == 0, streaming.stderr
    # the optimizer section measured no read: it is planned at the params' measured bandwidth (same device)
    assert "read times at the other sections' measured bandwidth" in streaming.stdout
    assert "6 of 6 accesses read NVMe" in streaming.stdout
    assert "0 of 3 tensors (0 B) stay in host memory" in streaming.stdout
    # 3 and 0 follow their own use; every read is started within the step that uses it, as the run plans them
    # (helper-234: 1:1 was printed, a read at the previous step's last access), the first two in the update before
    assert "position:lead 0:0, 1:0, 2:1, 3:0, 4:1, 5:1; started in the previous step's update: positions 0 1" \
        in streaming.stdout
    # the optimizer's reads ahead are not planned from the profile: no leads for it (they were printed)
    assert "leads      none planned: the run reads the next sub-groups' state ahead" in streaming.stdout
    assert "predicted" in streaming.stdout and "reads one after another" in streaming.stdout
    # measured read times overlap (reads in flight together): their sum is no bound, and is not called one; a drive's
    # rate gives one (helper-186's review: the "I/O bound" exceeded the step it was recorded in)
    assert "I/O bound" not in streaming.stdout and "no bound" in streaming.stdout
    measured = json.loads(run_cli("plan", profile_file, "--json").stdout)
    assert all(section["io_bound_s"] is None for section in measured["sections"].values())


def test_plan_weighs_a_second_optimizers_section_as_an_optimizers(tmp_path, profile_file):
    """Engines trained at once each profile their optimizer in a section of their own ("optimizer-2": profiling.
    profile_section); it saves as many bytes per held byte as "optimizer" (a tie, split in the file's order)."""
    path = str(tmp_path / "two-optimizers.json")
    for section in ("params", "optimizer-2", "optimizer"):  # the second optimizer's section first in the file
        saved = read_sections(profile_file)[section.partition("-")[0]]
        save_section(path, section, saved.fingerprint, saved.step, saved.facts)
    data = json.loads(run_cli("plan", path, "--host-cache-bytes", "19MiB", "--read-bandwidth", "100MiB/s",
                              "--json").stdout)
    assert data["host_tier_split"] == {"params": 3 * MIB, "optimizer-2": 16 * MIB, "optimizer": 0}


def test_a_profile_without_measured_reads_needs_a_bandwidth_unless_nothing_is_read(tmp_path):
    path = str(tmp_path / "untimed.json")
    save_section(path, "optimizer", "f", StepProfile.untimed(["m", "v"], [MIB, MIB]))
    result = run_cli("plan", path)
    assert result.returncode == 1 and "[optimizer] cannot plan: no read bandwidth given" in result.stdout
    held = run_cli("plan", path, "--host-cache-bytes", "2MiB")  # all held: nothing to read, nothing to plan
    assert held.returncode == 0 and "0 of 2 accesses read NVMe" in held.stdout


def test_bad_files_and_arguments_are_reported_not_crashed(tmp_path):
    old = tmp_path / "v1.json"
    old.write_text(json.dumps({"version": 1, "sections": {"params": {"fingerprint": "f", "order": [1]}}}))
    result = run_cli("profile", "show", str(old))
    assert result.returncode == 1 and "format version 1" in result.stderr
    missing = run_cli("plan", str(tmp_path / "absent.json"))
    assert missing.returncode == 1 and "cannot read profile" in missing.stderr
    typo = run_cli("plan", str(old), "--read-bandwidth", "fast")
    assert typo.returncode == 2 and "--read-bandwidth" in typo.stderr
    # another JSON file (a run's result), and a profile no run has saved a section into (helper-244's review: "format
    # version None", and an empty report with exit 0)
    foreign = tmp_path / "result.json"
    foreign.write_text(json.dumps({"losses": [1.0]}))
    result = run_cli("profile", "show", str(foreign))
    assert result.returncode == 1 and "not a tencache profile (no \"version\" key)" in result.stderr
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"version": 2, "sections": {}}))
    for command in (("profile", "show"), ("plan",)):
        result = run_cli(*command, str(empty))
        assert result.returncode == 1 and "holds no section" in result.stderr, (command, result.stderr)


@pytest.mark.parametrize("command", sorted(FROZEN_OPTIONS))
def test_option_sets_are_frozen(command):
    parser = build_parser()
    for name in command:
        subparsers = next(action for action in parser._actions if action.dest in ("command", "profile_action"))
        parser = subparsers.choices[name]
    options = sorted(flag for action in parser._actions for flag in action.option_strings)
    assert options == sorted(FROZEN_OPTIONS[command])
