"""``pulseinfer.progress``: the one progress helper every command uses (tqdm on stderr, or nothing)."""

from __future__ import annotations

import pytest

from pulseinfer.progress import Bar, TaskBars


def test_hidden_bar_writes_nothing(capsys):
    with Bar(3, "x", "unit", hidden=True) as bar:
        bar.advance()
        bar.reach(2)
        bar.note("n")
        bar.stage("s")
    assert bar.n == 0
    assert capsys.readouterr() == ("", "")


def test_bar_draws_on_stderr_and_fills_up_on_a_clean_exit(capsys):
    with Bar(4, "trials", "trial") as bar:
        bar.reach(1)
        bar.reach(1)  # a repeated count does not move the bar
        seen = bar.n
    assert seen == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "trials" in captured.err and "4/4" in captured.err


def test_bar_is_closed_but_not_filled_when_the_block_raises(capsys):
    with pytest.raises(KeyboardInterrupt), Bar(4, "plan", "cell") as bar:
        bar.advance()
        raise KeyboardInterrupt
    assert bar.n == 0  # closed
    assert "4/4" not in capsys.readouterr().err


def test_reach_never_passes_the_total():
    with Bar(3, "x", "unit") as bar:
        bar.reach(7)
        assert bar.n == 3


def test_stages_complete_one_unit_per_later_stage():
    with Bar(3, "calibrate", "stage") as bar:
        counts = []
        for name in ("copy", "recall", "compute"):
            bar.stage(name)
            counts.append(bar.n)
    assert counts == [0, 1, 2]


def test_task_bars_give_one_bar_per_task_closed_at_its_last_item(capsys):
    with TaskBars("req") as start:
        for policy in ("sglang", "pulseinfer"):
            on_finish = start(policy, 2)
            on_finish(object())
            on_finish(object())
    err = capsys.readouterr().err
    assert "sglang" in err and "pulseinfer" in err and "2/2" in err


def test_hidden_task_bars_give_no_callback_factory():
    with TaskBars("req", hidden=True) as start:
        assert start is None
