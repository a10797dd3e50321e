"""What `gatehead bench`'s runs say: figures over runs as median/min/max, the ratios, the targets, the tables."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

SETUP_NAMES = {"a_prompt": "(a) shared, prompt-mode gate", "a_suffix": "(a') shared, suffix-mode gate",
               "b_two_engines": "(b) stock + dedicated gate", "c_ungated": "(c) no gate",
               "d_judge": "(d) prompted judge"}


def spread(runs: Sequence[Any]) -> Any:
    """Figures of several runs (one structure) -> that structure with each number as {median, min, max}."""
    first = runs[0]
    if isinstance(first, dict):
        return {k: spread([r[k] for r in runs]) for k in first if all(k in r for r in runs)}
    if isinstance(first, list):
        return [spread([r[i] for r in runs]) for i in range(min(len(r) for r in runs))]
    if isinstance(first, bool) or not isinstance(first, int | float):
        return first
    values = [float(r) for r in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ratios(setups: dict) -> dict:
    """Ratios of one run: throughput against (b), end-to-end p50 against (c), gate latency against (d)."""
    out: dict = {}
    for key in setups.get("a_suffix", setups.get("a_prompt", {})):
        if not key.startswith("single_"):
            continue
        for name in ("a_prompt", "a_suffix"):
            if name not in setups:
                continue
            if "b_two_engines" in setups:
                out[f"{key}_throughput_{name}_over_b"] = setups[name][key]["turns_per_s"] / \
                    setups["b_two_engines"][key]["turns_per_s"]
            if "c_ungated" in setups:
                out[f"{key}_e2e_p50_{name}_over_c"] = setups[name][key]["e2e_p50_ms"] / \
                    setups["c_ungated"][key]["e2e_p50_ms"]
    for name in ("a_prompt", "a_suffix", "b_two_engines"):
        if name in setups and "c_ungated" in setups and "multi_turn" in setups[name]:
            out[f"multi_turn_e2e_p50_{name}_over_c"] = [
                x["e2e_p50_ms"] / y["e2e_p50_ms"] for x, y in
                zip(setups[name]["multi_turn"]["by_turn"], setups["c_ungated"]["multi_turn"]["by_turn"], strict=True)]
    if "d_judge" in setups and "prefix_reuse" in setups["d_judge"]:
        judge = {r["target_tokens"]: r["gate_cached_prefix_ms"] for r in setups["d_judge"]["prefix_reuse"]}
        for name in ("a_prompt", "a_suffix"):
            if "prefix_reuse" in setups.get(name, {}):
                out[f"prefix_gate_cached_{name}_over_d"] = {
                    r["target_tokens"]: r["gate_cached_prefix_ms"] / judge[r["target_tokens"]]
                    for r in setups[name]["prefix_reuse"] if r["target_tokens"] in judge}
    return out


def targets(figures: dict) -> dict:
    """The suffix-mode gate's targets, judged on the medians: each {"met": bool, "values": ...}."""
    r, memory, out = figures["ratios"], figures["memory"], {}

    def medians(prefix: str) -> dict:
        return {k: v["median"] for k, v in r.items() if k.startswith(prefix) and isinstance(v, dict) and "median" in v}

    e2e = {k: v for k, v in medians("single_").items() if k.endswith("e2e_p50_a_suffix_over_c")}
    thread = [x["median"] for x in r.get("multi_turn_e2e_p50_a_suffix_over_c", [])]
    if e2e or thread:
        out["suffix_gate_adds_at_most_10pct_to_e2e_p50"] = {
            "met": all(v <= 1.10 for v in [*e2e.values(), *thread]), "single_turn": e2e, "thread_turns": thread}
    throughput = {k: v for k, v in medians("single_").items() if k.endswith("throughput_a_suffix_over_b")}
    if throughput:
        out["suffix_throughput_at_least_1.5x_two_engines"] = {"met": all(v >= 1.5 for v in throughput.values()),
                                                              "values": throughput}
    judge = {k: v["median"] for k, v in r.get("prefix_gate_cached_a_suffix_over_d", {}).items()}
    if judge:
        out["suffix_gate_latency_at_most_the_judges"] = {"met": all(v <= 1.0 for v in judge.values()),
                                                         "values": judge}
    if "kv_ratio_shared_suffix_vs_stock" in memory:
        ratio = memory["kv_ratio_shared_suffix_vs_stock"]
        out["kv_capacity_within_1pct_of_stock"] = {"met": ratio >= 0.99, "values": ratio}
    return out


def _cell(figure: Any, digits: int = 1) -> str:
    if isinstance(figure, dict) and "median" in figure:
        return f"{figure['median']:.{digits}f} ({figure['min']:.{digits}f}-{figure['max']:.{digits}f})"
    return str(figure)


def tables(figures: dict) -> str:
    """The figures as Markdown tables: medians over the runs, (min-max) beside them."""
    from gatehead.evals.run import table

    setups = figures["setups"]
    present = [s for s in SETUP_NAMES if s in setups]
    parts = []
    singles = sorted({k for s in present for k in setups[s] if k.startswith("single_")},
                     key=lambda k: int(k.removeprefix("single_c")))
    for key in singles:
        rows = [[SETUP_NAMES[s], _cell(f["turns_per_s"], 3), _cell(f["gate_mean_ms"]), _cell(f["ttft_mean_ms"]),
                 _cell(f["e2e_p50_ms"]), _cell(f["e2e_p95_ms"])]
                for s, f in ((s, setups[s][key]) for s in present if key in setups[s])]
        parts.append(f"Single-turn, concurrency {key.removeprefix('single_c')}\n\n" + table(
            ["setup", "turns/s", "gate ms", "answer TTFT ms", "e2e p50 ms", "e2e p95 ms"], rows))
    threaded = [s for s in present if "multi_turn" in setups[s]]
    if threaded:
        turns = len(setups[threaded[0]]["multi_turn"]["by_turn"])
        rows = [[i + 1] + [_cell(setups[s]["multi_turn"]["by_turn"][i][m]) for s in threaded
                           for m in ("e2e_p50_ms", "gate_mean_ms")] for i in range(turns)]
        parts.append("Multi-turn threads, per turn of the thread (e2e p50 / gate mean, ms)\n\n" + table(
            ["turn"] + [f"{SETUP_NAMES[s].split(' ')[0]} {m}" for s in threaded for m in ("e2e", "gate")], rows))
    for s in [s for s in present if "prefix_reuse" in setups[s]]:
        parts.append(f"Prefix reuse, {SETUP_NAMES[s]} (ms)\n\n" + table(
            ["gate prompt tokens", "gate, cold", "gate, prefix cached", "answer TTFT cold", "answer TTFT after gate"],
            [[_cell(r["gate_prompt_tokens"], 0), _cell(r["gate_cold_ms"]), _cell(r["gate_cached_prefix_ms"]),
              _cell(r["cold_ttft_ms"]), _cell(r["after_gate_ttft_ms"])] for r in setups[s]["prefix_reuse"]]))
    memory, mib = figures.get("memory", {}), 1 << 20
    if "weights_bytes" in memory and "stock" in memory:
        kv = [f"{name}: {memory[name]['kv_tokens']}" for name in ("shared_prompt", "shared_suffix", "stock")
              if name in memory]
        if "two_engines" in memory:
            kv.append(f"two engines: {memory['two_engines']['generator_kv_tokens']} + "
                      f"{memory['two_engines']['gate_kv_tokens']} (gate prefix caching "
                      f"{'on' if memory['two_engines']['gate_prefix_caching'] else 'off'})")
        parts.append("Memory\n\n" + table(["", "one shared engine", "two engines"], [
            ["weights MiB", memory["weights_bytes"]["one_engine"] / mib, memory["weights_bytes"]["two_engines"] / mib],
            ["engine processes RSS MiB", memory["shared_prompt"]["rss_bytes"] / mib,
             memory.get("two_engines", {}).get("rss_bytes", float("nan")) / mib]]) + "\nKV tokens: " + "; ".join(kv))
    parts.append("Ratios (median, min, max over the runs)\n\n```\n" + json.dumps(figures["ratios"], indent=1) + "\n```")
    parts.append("Targets\n\n```\n" + json.dumps(figures["targets"], indent=1) + "\n```")
    return "\n\n".join(parts) + "\n"


def _n(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _ratio(figure: dict, digits: int = 2) -> str:
    return f"{figure['median']:.{digits}f} ({figure['min']:.{digits}f}-{figure['max']:.{digits}f})"


TARGET_TEXT = {
    "suffix_gate_adds_at_most_10pct_to_e2e_p50": "(a') adds <= 10% to e2e p50 against (c)",
    "suffix_throughput_at_least_1.5x_two_engines": "(a') >= 1.5x the throughput of (b)",
    "suffix_gate_latency_at_most_the_judges": "(a') gate latency <= (d)'s after a cached prefix",
    "kv_capacity_within_1pct_of_stock": "KV capacity within 1% of stock",
}


def threads_table(figures: dict) -> str:
    """The five-turn threads' e2e p50 against (c), turn by turn, and the gate's mean ms per turn ("" if none)."""
    from gatehead.evals.run import table as markdown_table

    setups, r = figures["setups"], figures["ratios"]
    threaded = [s for s in ("a_suffix", "a_prompt", "b_two_engines") if f"multi_turn_e2e_p50_{s}_over_c" in r]
    if not threaded:
        return ""
    turns = len(r[f"multi_turn_e2e_p50_{threaded[0]}_over_c"])
    rows = [[SETUP_NAMES[s].split(" ")[0]] + [_ratio(x) for x in r[f"multi_turn_e2e_p50_{s}_over_c"]]
            + [", ".join(_n(t["gate_mean_ms"]["median"]) for t in setups[s]["multi_turn"]["by_turn"])]
            for s in threaded]
    return markdown_table(["setup"] + [f"turn {i + 1}" for i in range(turns)] + [f"gate ms, turns 1-{turns}"], rows)


def _dtype_line(figures: dict) -> str:
    """What the setups computed in: the config's dtype where recorded (since dtype auto), else bf16."""
    bf16 = figures.get("machine", {}).get("bf16")
    dtype = figures.get("config", {}).get("dtype", "bfloat16")
    return f"bf16 by {bf16}" if dtype == "bfloat16" else f"{dtype}, bf16 {bf16} on this CPU"


def readme_tables(figures: dict) -> str:
    """The README's summary of one `gatehead bench` results file (the README's figure blocks render this)."""
    from gatehead.evals.run import table as markdown_table

    setups, r = figures["setups"], figures["ratios"]
    m = figures.get("machine", {})
    minutes = figures.get("seconds", 0) / 60
    took = f"{int(minutes // 60)} h {round(minutes % 60)} min" if minutes >= 60 else f"{minutes:.0f} min"
    header = (f"`{figures['command']}`: {figures.get('date', '')[:10]}, {m.get('cpus')} cores "
              f"({_dtype_line(figures)}), {took}. Medians over {figures['config']['runs']} runs, (min-max) of "
              "the run-by-run ratios:")
    levels = sorted({int(k.removeprefix("single_c")) for s in setups.values() for k in s if k.startswith("single_")})
    parts = [header]
    rows = []
    for label, key in (("turns/s (a') / (b)", "throughput_a_suffix_over_b"), ("turns/s (a) / (b)",
                       "throughput_a_prompt_over_b"), ("e2e p50 (a') / (c)", "e2e_p50_a_suffix_over_c"),
                       ("e2e p50 (a) / (c)", "e2e_p50_a_prompt_over_c")):
        if all(f"single_c{c}_{key}" in r for c in levels):
            rows.append([label] + [_ratio(r[f"single_c{c}_{key}"]) for c in levels])
    parts.append(markdown_table([""] + [f"concurrency {c}" for c in levels], rows))
    present = [s for s in SETUP_NAMES if s in setups]
    slash = " / ".join(str(c) for c in levels)
    rows = [[SETUP_NAMES[s]] + [" / ".join(_n(setups[s][f"single_c{c}"][m]["median"], d) for c in levels)
                                 for m, d in (("turns_per_s", 3), ("gate_mean_ms", 0), ("ttft_mean_ms", 0),
                                              ("e2e_p50_ms", 0))] for s in present]
    parts.append(markdown_table([f"setup, concurrency {slash}", "turns/s", "gate ms", "answer TTFT ms",
                                 "e2e p50 ms"], rows))
    threads = threads_table(figures)
    if threads:
        parts.append("Five-turn threads, e2e p50 against (c) per turn, and the gate's mean ms per turn:\n\n" + threads)
    if "prefix_reuse" in setups.get("a_suffix", {}):
        judge = {x["target_tokens"]["median"]: x for x in setups.get("d_judge", {}).get("prefix_reuse", [])}
        prompt = {x["target_tokens"]["median"]: x for x in setups.get("a_prompt", {}).get("prefix_reuse", [])}
        over = r.get("prefix_gate_cached_a_suffix_over_d", {})
        rows = []
        for x in setups["a_suffix"]["prefix_reuse"]:
            t = x["target_tokens"]["median"]
            key = str(int(t)) if str(int(t)) in over else int(t)
            rows.append([_n(x["gate_prompt_tokens"]["median"]), _n(x["gate_cached_prefix_ms"]["median"]),
                         _n(judge[t]["gate_cached_prefix_ms"]["median"]) if t in judge else "",
                         _n(prompt[t]["gate_cached_prefix_ms"]["median"]) if t in prompt else "",
                         _ratio(over[key]) if key in over else "",
                         f"{_n(x['after_gate_ttft_ms']['median'])}, {_n(x['cold_ttft_ms']['median'])}"])
        parts.append("Gate latency after a cached prefix (ms), and the answer's time to first token right after "
                     "(a') on the same prefix against cold:\n\n" + markdown_table(
                         ["gate prompt tokens", "(a') suffix gate", "(d) prompted judge", "(a) prompt-mode gate",
                          "(a') / (d)", "answer TTFT after (a'), cold"], rows))
    memory, mib = figures.get("memory", {}), 1 << 20
    if "weights_bytes" in memory:
        line = (f"Weights: {_n(memory['weights_bytes']['one_engine'] / mib, 1)} MiB in one engine, "
                f"{_n(memory['weights_bytes']['two_engines'] / mib, 1)} MiB in two.")
        if "shared_suffix" in memory and "stock" in memory:
            line += (f" KV tokens at memory fraction {figures['config']['memory_fraction']}: suffix-mode shared "
                     f"{_n(memory['shared_suffix']['kv_tokens'])}, stock {_n(memory['stock']['kv_tokens'])} "
                     f"({memory['kv_ratio_shared_suffix_vs_stock']:.4f})")
            if "shared_prompt" in memory:
                line += (f"; prompt-mode shared {_n(memory['shared_prompt']['kv_tokens'])} "
                         f"({memory['kv_ratio_shared_prompt_vs_stock']:.4f})")
            if "two_engines" in memory:
                line += (f"; the two engines {_n(memory['two_engines']['generator_kv_tokens'])} and "
                         f"{_n(memory['two_engines']['gate_kv_tokens'])}")
            line += "."
        parts.append(line)
    met = [f"{TARGET_TEXT.get(k, k)}: {'**met**' if v['met'] else '**not met**'}"
           for k, v in figures.get("targets", {}).items()]
    if met:
        parts.append("Targets (`targets` in the JSON, on the medians): " + "; ".join(met) + ".")
    return "\n\n".join(p.strip() for p in parts) + "\n"
