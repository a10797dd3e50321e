"""What `gatehead bench`'s runs say: figures over runs as median/min/max, the ratios, the targets, the tables."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

SETUP_NAMES = {"a_prompt": "(a) shared, prompt-mode gate", "a_suffix": "(a') shared, suffix-mode gate",
               "a_overlap": "(a'-overlap) (a'), answer beside the gate",
               "a_remote": "(a'-remote) (a') in `vllm serve`, over HTTP",
               "a_suffix_prio": "(a'-prio) (a'), vLLM's priority scheduler: the answer before new turns",
               "a_overlap_prio": "(a'-overlap-prio) (a'-overlap), vLLM's priority scheduler",
               "b_split": "(b) stock + dedicated gate, cores split",
               "b_shared": "(b) stock + dedicated gate, cores shared",
               "b_two_engines": "(b) stock + dedicated gate", "c_ungated": "(c) plugin loaded, no gate",
               "c0_stock": "(c0) stock vLLM, no gate", "d_judge": "(d) prompted judge"}
SHORT_NAMES = {"a_prompt": "(a)", "a_suffix": "(a')", "a_overlap": "(a'-overlap)", "a_remote": "(a'-remote)",
               "a_suffix_prio": "(a'-prio)",
               "a_overlap_prio": "(a'-overlap-prio)", "b_split": "(b) split",
               "b_shared": "(b) shared", "b_two_engines": "(b)", "c_ungated": "(c)", "c0_stock": "(c0)",
               "d_judge": "(d)"}
WORKLOADS = ("single", "multi", "refuse", "prefix", "memory")
GATED = ("a_prompt", "a_suffix", "a_overlap", "a_suffix_prio", "a_overlap_prio", "a_remote")
# Run only when asked for (`--setups`): the post-gate work first, where vLLM schedules by priority.
PRIORITY = ("a_suffix_prio", "a_overlap_prio")
# (b)'s bindings; "b_two_engines" is (b) in files from before both bindings ran (one binding, in the config).
TWO_ENGINES = ("b_split", "b_shared", "b_two_engines")


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


def denominator(setups: dict) -> tuple[str, str] | None:
    """(setup, its name in ratio keys) that end-to-end ratios are over: (c0), stock vLLM with no gate; in
    files from before (c0) ran, (c)."""
    if "c0_stock" in setups:
        return "c0_stock", "c0"
    return ("c_ungated", "c") if "c_ungated" in setups else None


def ratios(setups: dict) -> dict:
    """Ratios of one run: throughput against (b)'s better binding, end-to-end p50 against (c0), (c) against
    (c0) (the plugin's own cost), gate latency after a cached prefix against (d)."""
    out: dict = {}
    den = denominator(setups)
    levels = sorted({k for s in setups.values() for k in s if k.startswith("single_")})
    two = [b for b in TWO_ENGINES if b in setups]
    for key in levels:
        best = max((setups[b][key]["turns_per_s"] for b in two if key in setups[b]), default=None)
        for name in (*GATED, "c_ungated"):
            if key not in setups.get(name, {}):
                continue
            if best and name in GATED:
                out[f"{key}_throughput_{name}_over_b"] = setups[name][key]["turns_per_s"] / best
            if den and name != den[0]:
                out[f"{key}_e2e_p50_{name}_over_{den[1]}"] = setups[name][key]["e2e_p50_ms"] / \
                    setups[den[0]][key]["e2e_p50_ms"]
                if name == "c_ungated":
                    out[f"{key}_throughput_{name}_over_{den[1]}"] = setups[name][key]["turns_per_s"] / \
                        setups[den[0]][key]["turns_per_s"]
        if key in setups.get("a_remote", {}) and key in setups.get("a_suffix", {}):  # the HTTP hop's cost
            out[f"{key}_e2e_p50_a_remote_over_a_suffix"] = setups["a_remote"][key]["e2e_p50_ms"] / \
                setups["a_suffix"][key]["e2e_p50_ms"]
    for name in (*GATED, *two, "c_ungated"):
        if den and name != den[0] and "multi_turn" in setups.get(name, {}) and "multi_turn" in setups[den[0]]:
            out[f"multi_turn_e2e_p50_{name}_over_{den[1]}"] = [
                x["e2e_p50_ms"] / y["e2e_p50_ms"] for x, y in
                zip(setups[name]["multi_turn"]["by_turn"], setups[den[0]]["multi_turn"]["by_turn"], strict=True)]
    if "d_judge" in setups and "prefix_reuse" in setups["d_judge"]:
        judge = {r["target_tokens"]: r["gate_cached_prefix_ms"] for r in setups["d_judge"]["prefix_reuse"]}
        for name in ("a_prompt", "a_suffix"):
            if "prefix_reuse" in setups.get(name, {}):
                out[f"prefix_gate_cached_{name}_over_d"] = {
                    r["target_tokens"]: r["gate_cached_prefix_ms"] / judge[r["target_tokens"]]
                    for r in setups[name]["prefix_reuse"] if r["target_tokens"] in judge}
    return out


# Per target set: the bound on (a'-overlap)'s e2e p50 over (c0), the least (a'-overlap) throughput over (b)'s
# better binding at concurrency 4 and above (None: no target), the most (a') gate latency over (d)'s after a
# cached prefix and the shortest prefix it applies from.
TARGET_SETS = {"random": {"overlap_e2e": 1.05, "overlap_throughput": 1.8, "judge": 0.5, "judge_from": 1024},
               "demo": {"overlap_e2e": 1.10, "overlap_throughput": None, "judge": 1.0, "judge_from": 0}}


def targets(figures: dict) -> dict:
    """The targets of the run's target set (`figures["target_set"]`), judged on the medians: each
    {"met": bool, "values": ...}."""
    r, memory, out = figures["ratios"], figures["memory"], {}
    bounds = TARGET_SETS[figures.get("target_set", "random")]

    def medians(suffix: str) -> dict:
        return {k: v["median"] for k, v in r.items() if k.startswith("single_") and k.endswith(suffix)}

    e2e, thread = medians("e2e_p50_a_overlap_over_c0"), [x["median"] for x in r.get(
        "multi_turn_e2e_p50_a_overlap_over_c0", [])]
    if e2e or thread:
        bound = bounds["overlap_e2e"]
        out[f"overlap_e2e_p50_within_{round(100 * (bound - 1))}pct_of_stock"] = {
            "met": all(v <= bound for v in [*e2e.values(), *thread]), "single_turn": e2e, "thread_turns": thread}
    throughput = {k: v for k, v in medians("throughput_a_overlap_over_b").items()
                  if int(k.split("_")[1].removeprefix("c")) >= 4}
    if throughput and bounds["overlap_throughput"]:
        bound = bounds["overlap_throughput"]
        out[f"overlap_throughput_at_least_{bound}x_two_engines"] = {
            "met": all(v >= bound for v in throughput.values()), "values": throughput}
    judge = {k: v["median"] for k, v in r.get("prefix_gate_cached_a_suffix_over_d", {}).items()
             if float(k) >= bounds["judge_from"]}
    if judge:
        name = "suffix_gate_latency_at_most_the_judges" if bounds["judge"] == 1.0 else \
            f"suffix_gate_latency_at_most_{bounds['judge']}x_the_judges_from_{bounds['judge_from']}_tokens"
        out[name] = {"met": all(v <= bounds["judge"] for v in judge.values()), "values": judge}
    remote = medians("e2e_p50_a_remote_over_a_suffix")
    if remote:  # the gate in `vllm serve`, over HTTP: within 10% of in process, and ahead of (b) as (a') is
        ahead = medians("throughput_a_remote_over_b")
        shared = medians("throughput_a_suffix_over_b")
        out["remote_e2e_p50_within_10pct_of_in_process"] = {"met": all(v <= 1.10 for v in remote.values()),
                                                            "values": remote}
        if ahead and shared:
            margins = {k: ahead[k] / shared[k.replace("a_remote", "a_suffix")] for k in ahead
                       if k.replace("a_remote", "a_suffix") in shared}
            out["remote_lead_over_two_engines_within_10pct_of_in_process"] = {
                "met": all(v >= 0.90 for v in margins.values()), "values": margins}
    plugin = {**medians("e2e_p50_c_ungated_over_c0"), **medians("throughput_c_ungated_over_c0")}
    if plugin:
        out["plugin_cost_within_2pct"] = {"met": all(v >= 0.98 if "throughput" in k else v <= 1.02
                                                     for k, v in plugin.items()), "values": plugin}
    if "kv_ratio_shared_suffix_vs_stock" in memory:
        ratio = memory["kv_ratio_shared_suffix_vs_stock"]
        out["kv_capacity_within_1pct_of_stock"] = {"met": ratio >= 0.99, "values": ratio}
    return out


def merge(parts: Sequence[dict]) -> dict:
    """One results file of several `gatehead bench` runs of the same setups on the same machine, each over
    other workloads (or concurrency levels): each run's figures joined, then the spreads, ratios and targets
    computed again. Every ratio reads one workload's figures, which one part measured in one run. ValueError
    when the parts cannot be one measurement: another machine, model, target set, run count or setups, or a
    workload measured twice."""
    first = parts[0]

    def settings(part: dict) -> dict:  # what one measurement keeps fixed: all but the workloads and levels
        return {k: v for k, v in part["config"].items() if k not in ("workloads", "concurrency")}

    for part in parts[1:]:
        for key, value in (("machine", part.get("machine")), ("model", part.get("model")),
                           ("target_set", part.get("target_set")), ("config", settings(part))):
            if value != (first.get(key) if key != "config" else settings(first)):
                raise ValueError(f"bench results differ in {key}: {first.get(key)!r} vs {part.get(key)!r}")
        if len(part["runs"]) != len(first["runs"]) or any(set(a) != set(b) for a, b in zip(
                part["runs"], first["runs"], strict=True)):
            raise ValueError("bench results to merge need the same setups and the same number of runs")
    if sum("memory" in p["config"]["workloads"] for p in parts) > 1:
        raise ValueError("memory measured by more than one of the merged runs")
    runs = []
    for i in range(len(first["runs"])):
        run: dict[str, dict] = {setup: {} for setup in first["runs"][i]}
        for part in parts:
            for setup, figures in part["runs"][i].items():
                if twice := set(figures) & set(run[setup]):
                    raise ValueError(f"{setup}: {sorted(twice)} measured by more than one of the merged runs")
                run[setup].update(figures)
        runs.append(run)
    config = {**first["config"], "workloads": sorted({w for p in parts for w in p["config"]["workloads"]}),
              "concurrency": sorted({c for p in parts for c in p["config"]["concurrency"]})}
    merged = {**first, "command": "; ".join(p["command"] for p in parts), "date": max(p["date"] for p in parts),
              "seconds": sum(p.get("seconds", 0) for p in parts), "config": config, "runs": runs,
              "setups": spread(runs), "ratios": spread([ratios(r) for r in runs]),
              "memory": next((p["memory"] for p in parts if "memory" in p["config"]["workloads"]), {})}
    merged["targets"] = targets(merged)
    return merged


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
    for key in sorted({k for s in present for k in setups[s] if k.startswith("refuse_")},
                      key=lambda k: int(k.removeprefix("refuse_c"))):
        rows = [[SETUP_NAMES[s], _cell(f["turns_per_s"], 3), _cell(f["gate_mean_ms"]), _cell(f["e2e_p50_ms"]),
                 _cell(f["wasted_tokens_mean"]), _cell(f["wasted_tokens_max"], 0)]
                for s, f in ((s, setups[s][key]) for s in present if key in setups[s])]
        parts.append(f"Refused turns, concurrency {key.removeprefix('refuse_c')}\n\n" + table(
            ["setup", "turns/s", "gate ms", "e2e p50 ms", "wasted answer tokens, mean", "max"], rows))
    threaded = [s for s in present if "multi_turn" in setups[s]]
    if threaded:
        turns = len(setups[threaded[0]]["multi_turn"]["by_turn"])
        rows = [[i + 1] + [_cell(setups[s]["multi_turn"]["by_turn"][i][m]) for s in threaded
                           for m in ("e2e_p50_ms", "gate_mean_ms")] for i in range(turns)]
        parts.append("Multi-turn threads, per turn of the thread (e2e p50 / gate mean, ms)\n\n" + table(
            ["turn"] + [f"{SHORT_NAMES[s]} {m}" for s in threaded for m in ("e2e", "gate")], rows))
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
    "overlap_e2e_p50_within_5pct_of_stock": "(a'-overlap) e2e p50 <= 1.05x (c0), every concurrency and thread turn",
    "overlap_e2e_p50_within_10pct_of_stock": "(a'-overlap) e2e p50 <= 1.10x (c0), every concurrency and thread "
                                             "turn",
    "overlap_throughput_at_least_1.8x_two_engines": "(a'-overlap) >= 1.8x the throughput of (b)'s better binding "
                                                    "at concurrency 4 and 8",
    "suffix_gate_latency_at_most_0.5x_the_judges_from_1024_tokens": "(a') gate latency <= 0.5x (d)'s after a cached "
                                                                    "prefix of 1k tokens and more",
    "suffix_gate_latency_at_most_the_judges": "(a') gate latency <= (d)'s after a cached prefix",
    "plugin_cost_within_2pct": "(c) within 2% of (c0) in throughput and e2e p50",
    "kv_capacity_within_1pct_of_stock": "KV capacity within 1% of stock",
    # Targets of files from before (c0) and (a'-overlap) ran:
    "suffix_gate_adds_at_most_10pct_to_e2e_p50": "(a') adds <= 10% to e2e p50 against (c)",
    "suffix_throughput_at_least_1.5x_two_engines": "(a') >= 1.5x the throughput of (b)",
}


def threads_table(figures: dict) -> str:
    """The five-turn threads' e2e p50 against (c0) (in older files (c)), turn by turn, and the gate's mean ms per
    turn ("" if none)."""
    from gatehead.evals.run import table as markdown_table

    setups, r = figures["setups"], figures["ratios"]
    den = denominator(setups)
    if den is None:
        return ""
    threaded = [s for s in ("a_overlap", "a_suffix", "a_overlap_prio", "a_suffix_prio", "a_prompt", *TWO_ENGINES,
                            "c_ungated")
                if f"multi_turn_e2e_p50_{s}_over_{den[1]}" in r]
    if not threaded:
        return ""
    turns = len(r[f"multi_turn_e2e_p50_{threaded[0]}_over_{den[1]}"])
    rows = [[SETUP_NAMES[s]] + [_ratio(x) for x in r[f"multi_turn_e2e_p50_{s}_over_{den[1]}"]]
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
    setups = figures["setups"]
    levels = sorted({int(k.removeprefix("single_c")) for s in setups.values() for k in s if k.startswith("single_")})
    parts = [_header(figures), _ratios_table(figures, levels), _setups_table(setups, levels),
             _refused_table(setups, levels)]
    threads = threads_table(figures)
    if threads:
        parts.append(f"Five-turn threads, e2e p50 against ({denominator(setups)[1]}) per turn, and the gate's mean ms "
                     "per turn:\n\n" + threads)
    parts += [_prefix_table(figures), _memory_line(figures)]
    met = [f"{TARGET_TEXT.get(k, k)}: {'**met**' if v['met'] else '**not met**'}"
           for k, v in figures.get("targets", {}).items()]
    if met:
        parts.append("Targets (`targets` in the JSON, on the medians): " + "; ".join(met) + ".")
    return "\n\n".join(p.strip() for p in parts if p) + "\n"


def _header(figures: dict) -> str:
    setups, m = figures["setups"], figures.get("machine", {})
    minutes = figures.get("seconds", 0) / 60
    took = f"{int(minutes // 60)} h {round(minutes % 60)} min" if minutes >= 60 else f"{minutes:.0f} min"
    header = (f"`{figures['command']}`: {figures.get('date', '')[:10]}, {m.get('cpus')} cores "
              f"({_dtype_line(figures)}), {took}. Medians over {figures['config']['runs']} runs, (min-max) of "
              "the run-by-run ratios:")
    two = [b for b in TWO_ENGINES if b in setups]
    if "c0_stock" in setups:  # files from before (c0) ran name no binding
        if two:
            header += (" (b) is taken at its better binding at each concurrency (" + " or ".join(
                SETUP_NAMES[b].rsplit(", ", 1)[-1] for b in two) + ");")
        header += " end-to-end ratios are over (c0), stock vLLM with gatehead's plugin left out."
    return header


_RATIO_ROWS = (("turns/s (a'-overlap) / (b)", "throughput_a_overlap_over_b"),
               ("turns/s (a') / (b)", "throughput_a_suffix_over_b"),
               ("turns/s (a) / (b)", "throughput_a_prompt_over_b"),
               ("e2e p50 (a'-overlap) / (c0)", "e2e_p50_a_overlap_over_c0"),
               ("e2e p50 (a') / (c0)", "e2e_p50_a_suffix_over_c0"),
               ("e2e p50 (a'-overlap-prio) / (c0)", "e2e_p50_a_overlap_prio_over_c0"),
               ("e2e p50 (a'-prio) / (c0)", "e2e_p50_a_suffix_prio_over_c0"),
               ("e2e p50 (a) / (c0)", "e2e_p50_a_prompt_over_c0"),
               ("e2e p50 (c) / (c0): the plugin", "e2e_p50_c_ungated_over_c0"),
               ("turns/s (c) / (c0): the plugin", "throughput_c_ungated_over_c0"),
               ("e2e p50 (a') / (c)", "e2e_p50_a_suffix_over_c"),
               ("e2e p50 (a) / (c)", "e2e_p50_a_prompt_over_c"))


def _ratios_table(figures: dict, levels: list[int]) -> str:
    from gatehead.evals.run import table as markdown_table

    r = figures["ratios"]
    rows = [[label] + [_ratio(r[f"single_c{c}_{key}"]) for c in levels] for label, key in _RATIO_ROWS
            if all(f"single_c{c}_{key}" in r for c in levels)]
    return markdown_table([""] + [f"concurrency {c}" for c in levels], rows)


def _setups_table(setups: dict, levels: list[int]) -> str:
    from gatehead.evals.run import table as markdown_table

    slash = " / ".join(str(c) for c in levels)
    rows = [[SETUP_NAMES[s]] + [" / ".join(_n(setups[s][f"single_c{c}"][m]["median"], d) for c in levels)
                                 for m, d in (("turns_per_s", 3), ("gate_mean_ms", 0), ("ttft_mean_ms", 0),
                                              ("e2e_p50_ms", 0))] for s in SETUP_NAMES if s in setups]
    return markdown_table([f"setup, concurrency {slash}", "turns/s", "gate ms", "answer TTFT ms", "e2e p50 ms"], rows)


def _refused_table(setups: dict, levels: list[int]) -> str:
    from gatehead.evals.run import table as markdown_table

    refused = [s for s in ("a_suffix", "a_overlap", *PRIORITY) if all(f"refuse_c{c}" in setups.get(s, {})
                                                                      for c in levels)]
    if not refused:
        return ""
    slash = " / ".join(str(c) for c in levels)
    rows = [[SETUP_NAMES[s]] + [" / ".join(_n(setups[s][f"refuse_c{c}"][m]["median"], d) for c in levels)
                                 for m, d in (("e2e_p50_ms", 0), ("wasted_tokens_mean", 1))] for s in refused]
    return ("Refused turns (thresholds that refuse every turn): what a refused turn takes, and the decode "
            "tokens an answer started beside its gate made before the gate refused it:\n\n" + markdown_table(
                [f"setup, concurrency {slash}", "e2e p50 ms", "wasted answer tokens per turn"], rows))


def _prefix_table(figures: dict) -> str:
    from gatehead.evals.run import table as markdown_table

    setups, r = figures["setups"], figures["ratios"]
    if "prefix_reuse" not in setups.get("a_suffix", {}):
        return ""
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
    return ("Gate latency after a cached prefix (ms), and the answer's time to first token right after "
            "(a') on the same prefix against cold:\n\n" + markdown_table(
                ["gate prompt tokens", "(a') suffix gate", "(d) prompted judge", "(a) prompt-mode gate",
                 "(a') / (d)", "answer TTFT after (a'), cold"], rows))


def _memory_line(figures: dict) -> str:
    memory, mib = figures.get("memory", {}), 1 << 20
    if "weights_bytes" not in memory:
        return ""
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
    return line
