"""Hand-written threads through the whole agent (`gatehead eval threads`): does a conversation keep its subject?

Each thread of `demo/threads-handwritten.jsonl` (`gatehead.demo.threads`) is asked turn by turn on one
agent thread, threads side by side. A turn is right when the user got what the line expects: for
`answer`, decision `answer` and the expected value in the reply (citations, case and spacing aside);
for `refuse`, a refusal (`refuse` or `not_found`); for `clarify`, the question back. Every follow-up's
standalone rewrite is read for names it adds: a capitalised word or order code found neither in the
thread so far nor in the new message. Both the rewrite the model wrote and the one the agent used are
counted (the agent's safeguard replaces a rewrite that adds a name). This reads a test set: on a
committed model, once (the ledger records every reading).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gatehead.demo.tasks import normalize  # how the demo's figures compare values: citations, case, spacing aside

_NAME = re.compile(r"\b(?:[A-Za-z]{2}-\d{3}|[A-Z][A-Za-z]+)\b")  # order codes first: "BG-165", not "BG"


def added_names(rewrite: str, seen: str) -> list[str]:
    """Names in `rewrite` that `seen` (the thread so far and the new message) lacks, case aside.

    The first word of the rewrite is not a name for this purpose: a question may begin with any word."""
    start = len(rewrite) - len(rewrite.lstrip(" \t\n\"'(¿¡"))
    low = seen.lower()
    return [m.group() for m in _NAME.finditer(rewrite) if m.start() != start and m.group().lower() not in low]


def right(expect: str, value: str, decision: str, answer: str) -> bool:
    if expect == "answer":
        return decision == "answer" and normalize(value) in normalize(answer)
    if expect == "refuse":
        return decision in ("refuse", "not_found")
    return decision == "clarify"


async def _thread(agent, thread, run: str) -> list[dict]:
    rows, seen = [], ""
    for i, turn in enumerate(thread.turns):
        started = time.perf_counter()
        result = await agent.ask(turn.message, f"threads-{run}-{thread.thread_id}")
        context = f"{seen} {turn.message}"
        fallbacks = getattr(result, "rewrite_fallbacks", [])  # an agent without the rewrite safeguard has none
        written = [f["rewrite"] for f in fallbacks if f.get("node") == "contextualize"]
        follow_up = i > 0 and result.standalone != turn.message
        rows.append({
            "thread": thread.thread_id, "turn": i + 1, "message": turn.message, "case": turn.case,
            "expect": turn.expect, "value": turn.value, "decision": result.decision, "answer": result.answer,
            "refusal_reason": getattr(result, "refusal_reason", ""), "grounded": getattr(result, "grounded", None),
            "standalone": result.standalone,
            "right": right(turn.expect, turn.value, result.decision, result.answer),
            "names_added_by_model": sorted({n for text in written or ([result.standalone] if follow_up else [])
                                            for n in added_names(text, context)}),
            "names_added_used": sorted(set(added_names(result.standalone, context))) if i > 0 else [],
            "fallbacks": fallbacks, "error": result.error,
            "seconds": round(time.perf_counter() - started, 3)})
        seen = f"{context} {result.answer}"
    return rows


def score(rows: Sequence[dict]) -> dict[str, Any]:
    """The figures of a run's turns."""
    def rate(selected: Sequence[dict]) -> dict:
        return {"turns": len(selected), "right": sum(r["right"] for r in selected),
                "rate": round(sum(r["right"] for r in selected) / len(selected), 4) if selected else None}

    answerable = [r for r in rows if r["expect"] == "answer"]
    return {
        "turns": len(rows), "threads": len({r["thread"] for r in rows}),
        "right_value_on_answerable": rate(answerable),
        "refused_where_expected": rate([r for r in rows if r["expect"] == "refuse"]),
        "asked_back_where_expected": rate([r for r in rows if r["expect"] == "clarify"]),
        "follow_ups_on_answerable": rate([r for r in answerable if r["turn"] > 1]),
        "by_case": {case: rate([r for r in rows if r["case"] == case])
                    for case in sorted({r["case"] for r in rows if r["case"]})},
        "rewrites_adding_a_name": {"model": sum(bool(r["names_added_by_model"]) for r in rows),
                                   "used": sum(bool(r["names_added_used"]) for r in rows)},
        "answers_flagged_ungrounded": sum(r["grounded"] is False for r in rows),
        "decisions": dict(Counter(r["decision"] for r in rows)),
        "missed_answerable_by_cause": miss_causes([r for r in answerable if not r["right"]]),
        "errors": sum(bool(r["error"]) for r in rows),
    }


def run_threads(config, out: Path, threads_path: Path | None = None, store_config=None, concurrency: int = 4,
                min_right: float | None = None):
    """The threads eval on the engine `config` names and the demo index (or `store_config`); an `Outcome`.
    It passes when no turn failed and, with `min_right`, the answerable turns' rate reaches it."""
    import json
    import uuid

    from gatehead.agent import Agent, AgentConfig
    from gatehead.agent.checkpoint import open_checkpointer
    from gatehead.demo.index import open_demo_store
    from gatehead.demo.sealed import unseal
    from gatehead.demo.threads import THREADS, load_threads
    from gatehead.evals.run import Outcome, table
    from gatehead.retrieval.embedder import Embedder
    from gatehead.retrieval.store import Store
    from gatehead.runtime.engine import SharedEngine

    adapter = Path(config.adapter) if config.adapter else None
    threads = load_threads(unseal(threads_path or THREADS, Path(config.model), adapter))
    # The demo index, built afresh in the run's folder (an embedded store is one process's at a time).
    store = Store(store_config, Embedder()) if store_config is not None else open_demo_store(out / "store")
    engine = SharedEngine(config)

    async def run_all() -> list[dict]:
        await engine.warm_up()
        gate = asyncio.Semaphore(concurrency)
        run = uuid.uuid4().hex[:8]
        async with open_checkpointer(":memory:") as saver:
            agent = Agent(engine, store, AgentConfig(), saver)

            async def one(thread) -> list[dict]:
                async with gate:
                    return await _thread(agent, thread, run)

            return [row for rows in await asyncio.gather(*(one(t) for t in threads)) for row in rows]

    try:
        rows = asyncio.run(run_all())
    finally:
        engine.shutdown()
        store.close()
    out.mkdir(parents=True, exist_ok=True)
    (out / "turns.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    figures = score(rows)
    rate = figures["right_value_on_answerable"]["rate"] or 0.0
    passed = figures["errors"] == 0 and (min_right is None or rate >= min_right)
    lines = [("right value, answerable turns", f"{rate:.3f}"),
             ("refused where expected", str(figures["refused_where_expected"]["rate"])),
             ("asked back where expected", str(figures["asked_back_where_expected"]["rate"])),
             ("model rewrites adding a name", str(figures["rewrites_adding_a_name"]["model"])),
             ("used rewrites adding a name", str(figures["rewrites_adding_a_name"]["used"]))]
    report = "# Threads\n\n" + table(["figure", "value"], lines) + "\n"
    misses = [r for r in rows if not r["right"]][:40]
    result = {"figures": figures, "misses": misses, "threads_file": str(threads_path or THREADS)}
    return Outcome(passed, result, report, summary={"right_value": rate, **figures["rewrites_adding_a_name"]})


MISS_CAUSES = {("answer", ""): "answered with another value", ("refuse", "gate"): "refused by the gate",
               ("refuse", "generated"): "refused by the generator", ("clarify", ""): "asked back"}


def miss_causes(misses: Sequence[dict]) -> dict[str, int]:
    """What became of the missed turns that expected an answer: {cause: turns}, in `MISS_CAUSES`' order
    (any other outcome, such as a search that found nothing, counted as "other")."""
    counts = dict.fromkeys(MISS_CAUSES.values(), 0)
    for row in misses:
        if row["expect"] == "answer":
            cause = MISS_CAUSES.get((row["decision"], row.get("refusal_reason") or ""), "other")
            counts[cause] = counts.get(cause, 0) + 1
    return {cause: n for cause, n in counts.items() if n}
