"""Every command that takes --seed refuses one outside [0, 2**32) with one line, before any work or output."""

from __future__ import annotations

import pytest

from pulseinfer.cli import EXIT_BAD_INPUT, main

# command → arguments it needs besides --seed and --out (none is read: --seed is checked first)
COMMANDS = {
    "search": ["--space", "pulseinfer", "--trials", "1", "--no-progress"],
    "calibrate": [],
    "accuracy": [],
    "engine-bench": [],
    "validate": ["--profile", "nosuch"],
}


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_seed_out_of_range_exits_2_with_one_line_and_no_output(tmp_path, capsys, command, seed):
    """Issue 30: ``search --seed -1`` made the study journal, then Optuna's sampler raised a traceback."""
    out = tmp_path / "out"
    assert main([command, *COMMANDS[command], "--seed", seed, "--out", str(out)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err == f"error: --seed {seed}: expected an integer in [0, 2**32)\n"
    assert not out.exists()


def test_the_largest_seed_passes_the_check():
    from pulseinfer.commands import check_seed

    check_seed(0)
    check_seed(2**32 - 1)
