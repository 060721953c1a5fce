"""Smoke tests of the measurement commands (the measurements themselves are not tests): the benchmark command on
tiny sizes, and the GPU check's dry run on a machine without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(command: list[str], **environment) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **environment})


def test_the_benchmark_command_prints_and_writes_every_ratio(tmp_path):
    output = tmp_path / "results.json"
    completed = run(["bash", "benchmarks/run.sh", "--quick", "--only", "data", "generation", "--output", str(output)])
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    results = json.loads(output.read_text())
    rows = {row["name"]: row for row in results["rows"]}
    compared = [row for row in rows.values() if row["baseline"] is not None]
    assert len(compared) == 3 and all(row["ratio"] > 0 for row in compared)
    assert any(name.startswith("validate the answer matrix") for name in rows)
    for row in compared:
        assert f"{row['ratio']:.2f}" in completed.stdout  # the table shows each ratio


@pytest.mark.skipif(run([sys.executable, "-c", "import torch, sys; sys.exit(torch.cuda.is_available())"]).returncode,
                    reason="a GPU is visible: the check would really run")
def test_the_gpu_check_falls_back_to_a_dry_run_without_a_gpu(tmp_path):
    out = tmp_path / "gpu-check"
    completed = run(["bash", "benchmarks/gpu_check.sh"], OUT=str(out), HIDDEN_SIZES="1024,1024", BATCH_SIZE="512")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "dry run" in completed.stdout
    assert "0.01 GFLOP per sample" in completed.stdout  # 6 x (6*1024 + 1024*1024 + 1024) weights
    torchrun = next(line for line in completed.stdout.splitlines() if "torch.distributed.run" in line)
    assert "--nproc-per-node 1" in torchrun and "--gpu --bf16" in torchrun and "--hidden-sizes 1024,1024" in torchrun
    assert not out.exists()  # a dry run writes nothing


def test_the_gpu_check_reports_throughput_and_mfu_from_the_loop_metrics(tmp_path):
    metrics = {"world_size": 1, "samples_per_second": 1000.0, "final": {"train_loss": 0.1},
               "epochs": [{"train_seconds": 2.0}, {"train_seconds": 1.0}]}
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    completed = run([sys.executable, "-m", "benchmarks.gpu_check", "report", "--metrics", str(tmp_path / "metrics.json"),
                     "--hidden-sizes", "1000", "--peak-tflops", "0.0001", "--device-name", "test GPU",
                     "--output", str(tmp_path / "report.json")],
                    PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    assert completed.returncode == 0, completed.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    # 6 FLOPs per weight per sample, (6 * 1000 + 1000 * 1) weights, 1000 samples/s: 42 MFLOP/s of a 100 MFLOP/s peak
    assert report["achieved_tflops"] == pytest.approx(42e-6)
    assert report["mfu"] == pytest.approx(0.42)
    assert "MFU 42.0%" in completed.stdout
