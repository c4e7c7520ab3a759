"""benchmarks.alltoall_fidelity: the inventory of a log folder, with and without all-to-all runs
(its own small logs in a temporary folder: the repository does not depend on the shared ones)."""

from __future__ import annotations

from benchmarks import alltoall_fidelity


def write(folder, name: str, first: str, body: str = "") -> None:
    (folder / name).write_text(f"# SOURCE: {first}\n{body}")


def test_no_all_to_all_run_is_said_and_nothing_scored(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    write(logs, "a-all_reduce_perf.txt", "a blog; HARDWARE: 8x H100")
    write(logs, "b.txt", "a thread", "# Collective test starting: all_gather_perf\n")
    assert alltoall_fidelity.main([str(logs), "-o", str(tmp_path / "results")]) == 0
    report = (tmp_path / "results" / "alltoall-fidelity" / "README.md").read_text()
    assert "No `alltoall_perf` run among them" in report
    assert "| b.txt | all_gather |" in report


def test_all_to_all_runs_are_listed(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    write(logs, "c.txt", "a cluster; HARDWARE: 2x8 H100", "# Collective test starting: alltoall_perf\n")
    assert alltoall_fidelity.main([str(logs), "-o", str(tmp_path / "results")]) == 0
    report = (tmp_path / "results" / "alltoall-fidelity" / "README.md").read_text()
    assert "All-to-all runs found" in report and "c.txt" in report


def test_a_missing_folder_is_a_usage_error(tmp_path, capsys):
    assert alltoall_fidelity.main([str(tmp_path / "absent"), "-o", str(tmp_path)]) == 2
    assert "give the folder of nccl-tests logs" in capsys.readouterr().err
