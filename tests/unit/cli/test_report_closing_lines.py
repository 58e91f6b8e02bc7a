"""What geotrain report says at its end. The site named as holding the others back is qualified in a run that ended
early: its waits come from the steps completed before the end, not from the step the run ended in (issue 49's audit:
a site slowed 100000x after 1 s ended the run at --comm-timeout, and the report named the other site, by the noise of
the steps before). Notes on the run's files without a skipped line are notes, not "skipped 0 unreadable lines"."""

from geotrain.cli.output import Output
from geotrain.cli.report_cmd import _closing_lines

SLOW = {"site": "fast", "wait_pct": 3.0, "compute_s": 0.2, "others_wait_pct": 40.0, "others_compute_s": 0.1}


def test_a_run_that_ended_early_says_the_site_is_named_from_the_steps_before(capsys):
    _closing_lines(Output(), SLOW, {}, None, None, None, ended_early=True)
    line = capsys.readouterr().out.strip()
    assert line.startswith("in the steps completed before the run ended (see 'incomplete' below), fast holds the "
                           "others back: its ranks wait 3% of the step")


def test_a_whole_run_names_the_site_plainly(capsys):
    _closing_lines(Output(), SLOW, {}, None, None, None)
    assert capsys.readouterr().out.startswith("fast holds the others back: its ranks wait 3% of the step")


def test_notes_without_a_skipped_line_are_notes_not_zero_skipped_lines(capsys):
    from geotrain.cli.report_cmd import _health_lines

    _health_lines(Output(), {"incomplete": None, "skipped_lines": 0, "notes": ["run.json: missing"]})
    assert capsys.readouterr().out == "note: run.json: missing\n"
    _health_lines(Output(), {"incomplete": None, "skipped_lines": 2, "notes": ["rank-0.jsonl line 3: not JSON"]})
    assert capsys.readouterr().out == "skipped 2 unreadable lines: rank-0.jsonl line 3: not JSON\n"


def test_the_per_rank_table_of_many_ranks_lists_those_that_wait_most(capsys):
    from geotrain.cli.report_cmd import MAX_RANK_ROWS, _split_tables

    def entry(rank: int, wait: float) -> dict:
        return {"rank": rank, "site": "s", "stage": 0, "replica": rank, "ranks": [rank], "step_s": 1.0,
                "compute_s": 0.5, "comm_s": 0.1, "wait_s": wait, "compute_pct": 50, "comm_pct": 10, "wait_pct": 40,
                "bytes_intra": 0, "bytes_inter": 0}

    ranks = [entry(rank, 0.4 if rank != 2999 else 0.9) for rank in range(3000)]
    split = {"steps_used": [1, 5], "sites": [{**entry(0, 0.4), "site": "s"}], "ranks": ranks}
    _split_tables(Output(), split, "wall")
    printed = capsys.readouterr().out
    assert f"the {MAX_RANK_ROWS} of 3000 ranks that wait most" in printed
    assert "2999" in printed and printed.count("\n") < 3 * MAX_RANK_ROWS
