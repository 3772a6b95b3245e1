"""The random programs that hold GPU mode to CPU mode (tests/recorder/random_programs.py).

On the CPU: the same seed draws the same program, every action is drawn, and a program's race
set is the same on every run (the verdict is a property of the program). On a GPU (marked):
GPU mode and CPU mode report the same race set for each of a fixed sample of programs;
``tools/recorder_mode_fuzz.py`` runs many more and shrinks a difference.
"""

from __future__ import annotations

import pytest
import torch

from tests.recorder.random_programs import ACTIONS, random_program, run_steps

GPU_SAMPLE = range(0, 120)


def test_a_seed_draws_one_program_and_every_action_is_drawn():
    assert random_program(7) == random_program(7)
    assert random_program(7) != random_program(8)
    drawn = {step.action for seed in range(200) for step in random_program(seed)}
    assert drawn == set(ACTIONS)


@pytest.mark.parametrize("seed", range(0, 200, 20))
def test_a_programs_race_set_is_the_same_on_every_run(seed):
    steps = random_program(seed, 12)
    assert run_steps(steps, "cpu") == run_steps(steps, "cpu")


def test_the_sample_has_racy_and_race_free_programs():
    verdicts = [bool(run_steps(random_program(seed, 10), "cpu")) for seed in range(40)]
    assert any(verdicts) and not all(verdicts)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("seed", GPU_SAMPLE)
def test_gpu_mode_reports_the_race_set_of_cpu_mode(seed):
    steps = random_program(seed, 10)
    assert run_steps(steps, "gpu") == run_steps(steps, "cpu")
