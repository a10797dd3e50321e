"""Readable output of agent turns: a transcript block per turn and a summary table over turns."""

from __future__ import annotations

from collections.abc import Sequence

from gatehead.agent.state import TurnResult


def _probs(probs: dict[str, float]) -> str:
    return "  ".join(f"{label}={p:.3f}" for label, p in probs.items())


def format_turn(result: TurnResult) -> str:
    """The turn as the CLI prints it: the question, each retrieval and gate call, the answer and timings."""
    lines = [f"> {result.question}"]
    for fallback in result.rewrite_fallbacks:
        lines.append(f"  not used:   {fallback['rewrite']!r} ({fallback['node']}: {fallback['reason']})")
    if result.standalone != result.question:
        lines.append(f"  standalone: {result.standalone}")
    for i, query in enumerate(result.queries):
        if i:
            lines.append(f"  rewritten:  {query}")
        if i < len(result.gates):
            gate = result.gates[i]
            lines.append(f"  gate:       {gate['decision']:<7} ({_probs(gate['probs'])})")
    if result.error:
        lines.append(f"  error:      {result.error}")
        return "\n".join(lines)
    lines.append(f"  sources:    {', '.join(result.sources) or '(none)'}")
    if result.dropped.get("turns") or result.dropped.get("passages"):
        lines.append(f"  dropped:    {len(result.dropped.get('turns', []))} earlier turns, "
                     f"passages {result.dropped.get('passages', [])} (context budget)")
    decision = result.decision + (f" ({result.refusal_reason})" if result.refusal_reason else "")
    if result.grounded is not None:
        decision += ", grounded in the cited passage" if result.grounded else ", NOT grounded in the cited passage"
    lines.append(f"  decision:   {decision}")
    lines.append(f"  answer:     {result.answer}")
    generate = [t for t in result.timings if t["node"] == "generate"]
    if generate:
        g = generate[-1]
        lines.append(f"              ({g['cached_tokens']} of {g['prompt_tokens']} prompt tokens reused from the "
                     f"gate's prefill; first token after {g['ttft'] * 1000:.0f} ms)")
    total = sum(t["seconds"] for t in result.timings)
    lines.append(f"  time:       {total:.2f} s ({', '.join(_node_times(result.timings))})")
    return "\n".join(lines)


def _node_times(timings: Sequence[dict]) -> list[str]:
    totals: dict[str, float] = {}
    for t in timings:
        totals[t["node"]] = totals.get(t["node"], 0.0) + t["seconds"]
    return [f"{node} {seconds * 1000:.0f} ms" for node, seconds in totals.items()]


def summary_table(results: Sequence[TurnResult]) -> str:
    """One row per turn: question, gate decisions in order, final decision, searches, answer, seconds."""
    rows = [("#", "question", "gates", "decision", "answer", "s")]
    for i, r in enumerate(results, 1):
        gates = " > ".join(g["decision"] for g in r.gates) or "-"
        answer = r.error and f"error: {r.error}" or r.answer
        rows.append((str(i), _clip(r.question, 44), gates, r.decision, _clip(answer, 40),
                     f"{sum(t['seconds'] for t in r.timings):.2f}"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    out = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    out.insert(1, "-+-".join("-" * w for w in widths))
    counts: dict[str, int] = {}
    for r in results:
        counts[r.decision] = counts.get(r.decision, 0) + 1
    out.append("decisions: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return "\n".join(out)


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"
