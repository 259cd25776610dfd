"""bench/records.py, the records' two forms on disk, and docs/ keeping its records archived
(scripts/archive_records.py): fast, no DeepSpeed."""
import gzip
import json
import os
import subprocess
import sys

import pytest

from tencache_ds.bench import records
from tencache_ds.bench.report_runs import load_result

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT = {"steps": [{"step": 0, "time_s": 1.5, "loss": 10.25}], "model": "gpt2-tiny"}


def write(path, value):
    with open(path, "w") as handle:
        json.dump(value, handle)
    return str(path)


def test_a_record_reads_the_same_archived_and_plain_and_the_plain_file_wins(tmp_path):
    plain = write(tmp_path / "stock-1.result.json", RESULT)
    archived = records.archive(plain)
    assert archived == plain + ".gz" and not os.path.exists(plain)
    assert records.record_exists(plain) and records.stored_path(plain) == archived
    assert records.read_json_record(plain) == RESULT == load_result(plain)
    # something wrote the plain file since (a test that edits a copied run's record): it is what is read
    write(plain, dict(RESULT, model="edited"))
    assert records.read_json_record(plain)["model"] == "edited"


def test_archiving_is_byte_for_byte_and_reproducible(tmp_path):
    text = json.dumps(RESULT, indent=1)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "bench.json").write_text(text)
        records.archive(str(tmp_path / name / "bench.json"))
    first, second = ((tmp_path / name / "bench.json.gz").read_bytes() for name in ("a", "b"))
    assert first == second  # no name or time in the header: the same record, the same bytes in git
    assert gzip.decompress(first).decode() == text


def test_a_missing_record_names_both_forms(tmp_path):
    missing = str(tmp_path / "tencache-1.result.json")
    assert not records.record_exists(missing)
    with pytest.raises(FileNotFoundError, match=r"tencache-1\.result\.json \(nor .*tencache-1\.result\.json\.gz\)"):
        records.read_json_record(missing)


def test_a_broken_record_is_a_value_error_that_names_the_file_read(tmp_path):
    """An archive cut short (a copy interrupted), a file that is not gzip and plain text that is not JSON: each a
    ValueError naming the file that was read, as load_result promises, not an EOFError or a gzip error."""
    whole = records.archive(write(tmp_path / "whole.result.json", RESULT))
    cut = tmp_path / "cut.result.json.gz"
    cut.write_bytes(open(whole, "rb").read()[:20])
    (tmp_path / "not-gzip.result.json.gz").write_text("{}")
    (tmp_path / "not-json.result.json").write_text("{not json")
    for name in ("cut", "not-gzip", "not-json"):
        plain = str(tmp_path / f"{name}.result.json")
        with pytest.raises(ValueError, match=f"{name}.result.json"):
            records.read_json_record(plain)
        with pytest.raises(ValueError, match=f"not a JSON result file: .*{name}.result.json"):
            load_result(plain)


def test_an_archive_that_fails_part_way_leaves_the_plain_record_and_nothing_beside_it(tmp_path, monkeypatch):
    plain = write(tmp_path / "bench.json", RESULT)

    def disk_full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records, "replace_durably", disk_full)
    with pytest.raises(OSError, match="No space left"):
        records.archive(plain)
    assert os.listdir(tmp_path) == ["bench.json"] and records.read_json_record(plain) == RESULT


def test_glob_finds_each_record_once_by_its_plain_name(tmp_path):
    records.archive(write(tmp_path / "stock-cpu-1.result.json", RESULT))
    write(tmp_path / "stock-cpu-2.result.json", RESULT)
    records.archive(write(tmp_path / "stock-cpu-3.result.json", RESULT))
    write(tmp_path / "stock-cpu-3.result.json", RESULT)  # both forms: one name
    write(tmp_path / "stock-1.result.json", RESULT)
    assert records.glob_records(str(tmp_path), "stock-cpu-*.result.json") == [
        str(tmp_path / f"stock-cpu-{n}.result.json") for n in (1, 2, 3)]
    (tmp_path / "stock-cpu-4.result.json").mkdir()  # a folder of that name is no record
    assert records.glob_records(str(tmp_path / "absent"), "*.json") == []
    assert records.glob_records(str(tmp_path), "stock-cpu-4*") == []


def test_the_archive_script_archives_only_records_and_its_check_lists_what_is_left(tmp_path):
    run = tmp_path / "run"
    (run / "gpt2-tiny-auto").mkdir(parents=True)
    write(run / "gpt2-tiny-auto" / "tencache-1.result.json", RESULT)
    write(run / "gpt2-tiny-auto" / "bench.json", {"comparison": {}})
    write(run / "machine.json", {"drives": 1})  # a command's argument (--machine): stays plain
    script = [sys.executable, os.path.join(REPO, "scripts", "archive_records.py")]
    check = subprocess.run(script + ["--check", str(run)], capture_output=True, text=True)
    assert check.returncode == 1 and "tencache-1.result.json" in check.stdout and "bench.json" in check.stdout
    # a folder beside one inside it (each record archived once: the second archive found its plain file gone)
    subprocess.run(script + [str(run), str(run / "gpt2-tiny-auto")], check=True, capture_output=True)
    assert sorted(os.listdir(run / "gpt2-tiny-auto")) == ["bench.json.gz", "tencache-1.result.json.gz"]
    assert (run / "machine.json").exists()
    assert subprocess.run(script + ["--check", str(run)], capture_output=True).returncode == 0


def test_docs_keeps_its_records_archived():
    """No plain bench.json or result file in docs/ (the working tree's, committed or not): a bench or validation
    folder added with plain records fails here, with the command that archives them."""
    check = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "archive_records.py"), "--check",
                            os.path.join(REPO, "docs")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr


def test_the_tracked_tree_stays_within_what_the_device_tool_sends():
    """The device tool sends the working tree to a GPU machine only up to 64 MiB (the ninth lease's first call was
    refused at 74 MiB); 60 leaves room for the set-up's .gpu/ folder. Whatever grows the tree (logs, figures, records
    named otherwise) fails here first."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.decode().strip()}")
    paths = [os.path.join(REPO, name) for name in listed.stdout.decode().split("\0") if name]
    total = sum(os.path.getsize(path) for path in paths if os.path.isfile(path))
    assert total < 60 * 2**20, f"the tracked files come to {total / 2**20:.1f} MiB"
