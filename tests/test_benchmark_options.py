"""The benchmark scripts refuse bad options with a clear error, before measuring anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CPU = Path(__file__).resolve().parent.parent / "benchmarks" / "cpu.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CPU), *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.timeout(90)
def test_cpu_only_scaling_needs_workers():
    done = _run("--only", "scaling")
    assert done.returncode == 2
    assert "--only scaling needs --workers" in done.stderr
    assert "machine:" not in done.stdout  # nothing was measured


@pytest.mark.timeout(90)
def test_cpu_only_names_its_choices():
    done = _run("--only", "lockstepp")
    assert done.returncode == 2
    assert "invalid choice" in done.stderr
    assert "lockstepp" in done.stderr
    for part in ("lockstep", "pipelined", "scaling", "parent"):  # quoted or not, by Python version
        assert part in done.stderr.split("choose from", 1)[1]


INSTRUCTIONS = CPU.parent / "instructions.py"


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cases", "sync8,fast"], "--cases: expected some of sync8,async8,yield64"),
        (["--steps", "1000"], "--steps: expected FEW,MANY with 0 <= FEW < MANY"),
        (["--steps", "10,5"], "--steps: expected FEW,MANY"),
    ],
)
def test_instructions_refuses_bad_options_before_running_valgrind(args, says):
    done = subprocess.run(
        [sys.executable, str(INSTRUCTIONS), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert says in done.stderr
    assert "callgrind)" not in done.stdout  # nothing was measured
