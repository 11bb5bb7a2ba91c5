"""scripts/gpu_check.sh fits the GPU machine's loan: its timeouts sum to under 7 minutes, it can
run twice on one machine, and a failing part makes it exit non-zero (checked with a stand-in
for each command, on the CPU)."""
import os
import re
import subprocess

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_the_timeouts_sum_to_under_seven_minutes_and_no_run_name_is_fixed():
    text = SCRIPT.read_text()
    seconds = [int(s) for s in re.findall(r"^check \S+ (\d+) ", text, re.M)]
    assert len(seconds) == 6 and sum(seconds) < 420
    assert "run_name=" not in text and "data=tang+song" in text


def test_a_failing_part_fails_the_script_after_the_rest_ran(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, status in (("nvidia-smi", 0), ("python", 0)):
        (bin_dir / name).write_text(f"#!/bin/sh\necho \"$0 $*\"\nexit {status}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    ok = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True, text=True)
    assert ok.returncode == 0 and "every part passed" in ok.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["attention.txt", "gpu.txt", "mfu.txt", "pytest.txt",
                                                                    "sampling.txt", "train.txt"]
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    bad = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and "failed: gpu (exit 9)" in bad.stderr
    assert "benchmarks/train_run.py small-gpu-tang-song" in (tmp_path / "out" / "train.txt").read_text()
