"""The demo's targets are judged from the figures as written, and the pages' line says which hold."""

from __future__ import annotations

import json

from gatehead.demo.targets import TEMPLATE_GATE_FLOOR, Outcome, demo_sets_targets, outcome_line, threads_targets
from gatehead.figures import ROOT


def _set(accuracy: float, exact: float | None = None, answerable: int = 10, **extra) -> dict:
    return {"gate": {"accuracy": accuracy}, "answer_exact_match": exact or 0.0, "answerable": answerable if exact
            is not None else 0, **extra}


def test_the_test_sets_targets_hold_or_say_by_how_much_they_miss() -> None:
    support = {"support": {"answerable": 4, "answer_exact_match": 1.0}}
    results = {"split": "test", "sets": {
        "template": _set(0.99, 0.98), "phrased": _set(0.95, 0.80, by_document={**support}),
        "out_of_scope": _set(0.94), "handwritten": _set(0.91, 0.86, by_document={
            "support": {"answerable": 6, "answer_exact_match": 0.5}})}}
    met = {o.what: o.met for o in demo_sets_targets(results)}
    assert met == {"phrased, unseen families: gate": True, "phrased: answer exact match": False,
                   "typed by hand: gate": True, "typed by hand: answer exact match": True,
                   "support-article questions: answer exact match": False,  # (4 + 3) of 10, pooled
                   "out of scope: refused": False, "template: gate (1 point below the 12.8 M model's 98.2%)": True}
    line = outcome_line(demo_sets_targets(results))
    assert "phrased: answer exact match >= 85%: **missed** by 5.0 points (80.0%)" in line
    assert "support-article questions: answer exact match >= 85%: **missed** by 15.0 points (70.0%)" in line
    assert f"gate (1 point below the 12.8 M model's 98.2%) >= {TEMPLATE_GATE_FLOOR:.1%}: met (99.0%)" in line
    assert demo_sets_targets({**results, "split": "val"}) == [] and outcome_line([]) == ""  # judged on test only


def test_the_threads_targets_and_an_unmeasured_figure() -> None:
    figures = {"right_value_on_answerable": {"rate": 0.9}, "rewrites_adding_a_name": {"used": 1}}
    assert [o.met for o in threads_targets(figures)] == [True, False]
    assert "rewrites adding a name, used <= 0: **missed** (1)" in outcome_line(threads_targets(figures))
    assert Outcome("x", 0.5, None).met is None and "not in these figures" in Outcome("x", 0.5, None).text()
    assert Outcome("n", 0, None, at_most=True).text() == "n <= 0: not in these figures"


def test_the_pages_render_the_line_from_the_committed_envelopes() -> None:
    """Wherever a page renders the threads or the test sets, the targets' line is the envelope's own."""
    from gatehead.figures.views import VIEWS

    envelope = json.loads((ROOT / "docs/figures/demo-test.json").read_text())
    line = outcome_line(demo_sets_targets(envelope["results"]))
    assert line.startswith("\nTargets: phrased, unseen families: gate >= 93%: ") and line.count(": met (") + line.count(
        "**missed**") == 7  # every target judged, none left unmeasured
    assert VIEWS["demo-sets"]([envelope]).endswith(line)
