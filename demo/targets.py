"""The demo model's targets on its held-out test sets (issue 43), judged on the figures as written.

`demo_sets_targets` reads `gatehead.demo.evaluate`'s figures of the test split; `threads_targets` reads
`gatehead eval threads`' figures. Each gives (what, target, figure, met) rows, and `outcome_line` says in a
line which hold and by how much the others miss: the pages render that line under the tables
(`gatehead.figures.views`), so no sentence about an outcome is typed by hand.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    what: str
    bound: float  # a rate (0-1) that the figure must reach, or a count it must not exceed
    figure: float | None  # None: not measured in these figures
    at_most: bool = False  # a count: the figure must be <= bound

    @property
    def met(self) -> bool | None:
        if self.figure is None:
            return None
        return self.figure <= self.bound if self.at_most else self.figure >= self.bound - 1e-12

    def text(self) -> str:
        bound = f"{self.bound:.0%}" if float(round(self.bound * 100, 6)).is_integer() else f"{self.bound:.1%}"
        target = f"<= {self.bound:g}" if self.at_most else f">= {bound}"
        if self.figure is None:
            return f"{self.what} {target}: not in these figures"
        if self.at_most:
            verdict = "met" if self.met else "**missed**"
            return f"{self.what} <= {self.bound:g}: {verdict} ({self.figure:g})"
        if self.met:
            return f"{self.what} >= {bound}: met ({self.figure:.1%})"
        return (f"{self.what} >= {bound}: **missed** by {100 * (self.bound - self.figure):.1f} points "
                f"({self.figure:.1%})")


# The template set: "no more than 1 point below today's" at the filing, the 12.8 M model's 98.2%.
TEMPLATE_GATE_FLOOR = 0.982 - 0.01


def _support_exact_match(sets: dict) -> float | None:
    """Answer exact match on support-article questions, pooled over the sets that break it down."""
    rows = [s["by_document"]["support"] for s in sets.values() if "support" in s.get("by_document", {})]
    answerable = sum(r["answerable"] for r in rows)
    return sum(r["answer_exact_match"] * r["answerable"] for r in rows) / answerable if answerable else None


def demo_sets_targets(results: dict) -> list[Outcome]:
    """The targets on `demo.build evaluate --split test`'s sets (empty for another split: targets are
    judged on the test sets, read once)."""
    if results.get("split") != "test":
        return []
    sets = results["sets"]

    def gate(name: str) -> float | None:
        return sets[name]["gate"]["accuracy"] if name in sets else None

    def exact(name: str) -> float | None:
        return sets[name]["answer_exact_match"] if name in sets and sets[name].get("answerable") else None

    return [Outcome("phrased, unseen families: gate", 0.93, gate("phrased")),
            Outcome("phrased: answer exact match", 0.85, exact("phrased")),
            Outcome("typed by hand: gate", 0.90, gate("handwritten")),
            Outcome("typed by hand: answer exact match", 0.85, exact("handwritten")),
            Outcome("support-article questions: answer exact match", 0.85, _support_exact_match(sets)),
            Outcome("out of scope: refused", 0.95, gate("out_of_scope")),
            Outcome("template: gate (1 point below the 12.8 M model's 98.2%)", TEMPLATE_GATE_FLOOR, gate("template"))]


def threads_targets(figures: dict) -> list[Outcome]:
    """The targets on the hand-written threads (`gatehead eval threads`)."""
    return [Outcome("threads: right value on answerable turns", 0.85, figures["right_value_on_answerable"]["rate"]),
            Outcome("threads: rewrites adding a name, used", 0, figures["rewrites_adding_a_name"]["used"],
                    at_most=True)]


def outcome_line(outcomes: list[Outcome]) -> str:
    """One line under a table: each target and whether it holds, or by how much it misses."""
    if not outcomes:
        return ""
    return "\nTargets: " + "; ".join(o.text() for o in outcomes) + ".\n"
