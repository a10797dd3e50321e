"""The views of `gatehead figures` envelopes that the pages' figure blocks render: a table (and its first
line: command, date, machine) per kind of results. The bench's tables live with the bench
(`benchmarks.bench_report`); the rest read the evals', the demo kit's and the tests' results as written."""

from __future__ import annotations


def _bench_view(envelopes: list[dict]) -> str:
    """One `gatehead bench` envelope, or several of one bench split over workloads (merged: one table). The parts
    measure one model; they may come from several commits (five parts take longer than a working session), and
    the table then ends with a line naming each part's commit."""
    from gatehead.benchmarks.bench_report import merge, readme_tables

    if len(envelopes) == 1:
        return readme_tables(_as_shown(envelopes[0]))
    for e in envelopes[1:]:
        if e["fingerprints"] != envelopes[0]["fingerprints"]:
            raise ValueError(f"{e['item']} measured {e['fingerprints']}, {envelopes[0]['item']} "
                             f"{envelopes[0]['fingerprints']}: one bench's parts measure one model")
    return readme_tables(merge([_as_shown(e) for e in envelopes])) + _commits_line(envelopes)


def _commits_line(envelopes: list[dict]) -> str:
    """Where a bench's parts were measured at more than one commit: which part at which, and the commands that
    show what changed between them. No ratio spans two commits: each reads one workload of one part."""
    at: dict[str, list[str]] = {}
    for e in envelopes:
        at.setdefault(e["commit"][:7], []).append(e["item"])
    if len(at) == 1:
        return ""
    first, *later = at
    parts = "; ".join(f"{', '.join(items)} at {commit}" for commit, items in at.items())
    diffs = ", ".join(f"`git diff --stat {first} {commit} -- . ':!docs' ':!tests'`" for commit in later)
    return (f"\n*The parts were measured at {len(at)} commits ({parts}); every ratio reads one part. What changed "
            f"between them: {diffs}.*\n")


def _as_shown(e: dict) -> dict:
    """A bench envelope's results with the command as the envelope shows it (its own names the run's temporary
    output file)."""
    return {**e["results"], "command": e["command"]}


def _threads_view(envelopes: list[dict]) -> str:
    from gatehead.benchmarks.bench_report import threads_table

    [e] = envelopes
    results = _as_shown(e)
    return f"`{results['command']}`, {results['date'][:10]}:\n\n" + threads_table(results)


def _eval_figures(r: dict) -> str:
    """One eval's result.json in a line: the figures its rule judges."""
    if r["eval"] == "stability":
        return "; ".join(f"{name}: {v['shared_vs_stock']['differing']} of {v['shared_vs_stock']['requests']} requests "
                         f"differ, max abs dlogprob {v['shared_vs_stock']['max_abs_dlogprob']:.3g} (stock repeats "
                         f"{v['stock_vs_stock']['differing']})" for name, v in r["variants"].items() if v.get("judged"))
    if r["eval"] == "agreement":
        return "; ".join(f"{name}: {p['flips']} flip{'' if p['flips'] == 1 else 's'}, "
                         f"max abs dp {_small(p['max_dp'], '.4f')}" for name, p in r["pairs"].items())
    if r["eval"] == "kv":
        c, w, mib = r["capacity"], r["weights_bytes"], 1 << 20
        return (f"stock {c['stock']['tokens']:,} tokens, shared {c['shared']['tokens']:,} ({r['kv_ratio']:.4f}); "
                f"weights {w['one_engine'] / mib:.1f} MiB in one engine, {w['two_engines'] / mib:.1f} MiB in two")
    if r["eval"] == "dataset":
        recall = ", ".join(f"{k} {v:.3f}" for k, v in r["classes"]["recall"].items())
        answers = r.get("answers") or {}
        em = f"; answer EM {answers['exact_match']:.3f} over {answers['scored']}" if answers.get("scored") else ""
        return (f"{r['questions']} questions: accuracy {r['accuracy']:.3f}, recall {recall}, ECE {r['ece']:.3f}, "
                f"AURC {r['aurc']:.3f}, planted-instruction flips {r['injection_flip_rate']:.3f}{em}")
    if r["eval"] == "threads":
        f = r["figures"]
        return (f"{f['threads']} threads, {f['turns']} turns: right value {_rate(f['right_value_on_answerable'])} of "
                f"answerable turns, rewrites adding a name {f['rewrites_adding_a_name']['used']} used "
                f"({f['rewrites_adding_a_name']['model']} written)")
    raise ValueError(f"no README line for eval {r['eval']!r}")


def _rate(x: dict) -> str:
    return f"{x['rate']:.1%} ({x['right']} of {x['turns']})" if x["turns"] else "- (0 turns)"


def _threads_eval_view(envelopes: list[dict]) -> str:
    """`gatehead eval threads`: the hand-written threads through the whole agent, a row per figure."""
    from gatehead.evals.run import table

    [e] = envelopes
    f = e["results"]["figures"]
    rows = [["right value, answerable turns", _rate(f["right_value_on_answerable"])],
            ["right value, answerable follow-ups", _rate(f["follow_ups_on_answerable"])],
            ["refused where expected", _rate(f["refused_where_expected"])],
            ["asked back where expected (nothing to refer to)", _rate(f["asked_back_where_expected"])],
            *[[f"case: {case}", _rate(x)] for case, x in f["by_case"].items()],
            ["rewrites adding a name: written by the model / used", f"{f['rewrites_adding_a_name']['model']} / "
             f"{f['rewrites_adding_a_name']['used']}"],
            ["answers flagged `grounded: false`", f["answers_flagged_ungrounded"]],
            ["turns that failed", f["errors"]]]
    from gatehead.demo.targets import outcome_line, threads_targets
    from gatehead.evals.threads import miss_causes

    missed = f["right_value_on_answerable"]["turns"] - f["right_value_on_answerable"]["right"]
    # Counted over every turn since the figures hold it; before, over the misses the envelope lists (at most 40).
    misses = [m for m in e["results"].get("misses", []) if m["expect"] == "answer"]
    by_cause = f.get("missed_answerable_by_cause", miss_causes(misses))
    causes = ", ".join(f"{n} {cause}" for cause, n in by_cause.items())
    listed = "" if sum(by_cause.values()) == missed else " (of those the file lists)"
    return (_measured(e) + f"; {f['threads']} threads, {f['turns']} turns.\n\n" + table(["figure", "value"], rows)
            + (f"\nThe {missed} missed answerable turns{listed}: {causes}.\n" if causes else "")
            + outcome_line(threads_targets(f)))


def _evals_view(envelopes: list[dict]) -> str:
    from gatehead.evals.run import table

    rows = [[e["item"], e["results"]["verdict"], _eval_figures(e["results"]), e["date"][:10],
             f"{e['machine']['cpus']} cores, {_bf16(e)}"] for e in envelopes]
    return table(["item", "verdict", "figures", "measured", "machine"], rows)


def _measured(e: dict) -> str:
    """An envelope's command, date and machine, as a table's first line begins."""
    return f"`{e['command']}`: {e['date'][:10]}, {e['machine']['cpus']} cores ({_bf16(e)})"


def _bf16(e: dict) -> str:
    """The host's bf16 path, as a figure's machine is described."""
    path = e["machine"]["bf16"]
    return "no native bf16: dtype auto runs fp32" if path == "emulated" else f"bf16 by {path}"


def _ttft_view(envelopes: list[dict]) -> str:
    from gatehead.evals.run import table

    [e] = envelopes
    r = e["results"]
    rows = [[name.replace("_", " "), w["requests"], f"{w['prompt_tokens_mean']:.0f}", f"{w['cached_tokens_mean']:.0f}",
             f"{w['cold_ttft_ms_median']:.1f}", f"{w['after_gate_ttft_ms_median']:.1f}", f"{w['ratio_of_medians']:.2f}"]
            for name, w in r.items() if isinstance(w, dict) and "ratio_of_medians" in w]
    return (_measured(e) + ", "
            f"{r.get('mode', '')}, {r.get('block_size')}-token blocks.\n\n" + table(
                ["workload", "requests", "prompt tokens", "read from the gate's prefill", "TTFT cold ms",
                 "TTFT after the gate ms", "ratio"], rows))


def _suffix_latency_view(envelopes: list[dict]) -> str:
    from gatehead.evals.run import table

    [e] = envelopes
    r = e["results"]
    rows = [[f"{name} mode", g["prompt_tokens"], g["cached_tokens"][0], f"{g['median_s']:.3f}", f"{g['spread_s']:.3f}"]
            for name, g in r["gates"].items()]
    return (_measured(e) + "; "
            f"prompt mode / suffix mode {r['median_ratio_prompt_over_suffix']:.1f}x.\n\n" + table(
                ["gate", "prompt tokens", "read from the cache", "median s", "spread s"], rows))


def _turn_cost_view(envelopes: list[dict]) -> str:
    """`benchmarks/turn_cost.py`: per turn, what each setup cost; then what a gated turn adds against (c0)."""
    from gatehead.benchmarks.turn_cost import SETUP_NAMES, breakdown_table
    from gatehead.evals.run import table

    [e] = envelopes
    r, rows = e["results"], []
    for setup, levels in r["against_c0"].items():
        for level, d in levels.items():
            rows.append([SETUP_NAMES[setup], level[1:], _spread(d["e2e_ratio"], ".2f"), _spread(d["wall_ratio"], ".2f"),
                         *(_signed(d[name]) for name in ("wall_ms", "more_steps_ms", "slower_steps_ms")),
                         f"{d['branch_ms']['median']:.1f}",
                         *(_signed(d[name], 1) for name in ("steps", "prompt_tokens_computed", "generation_tokens")),
                         _signed(d["front_cpu_ms"])])
    c = r["config"]
    extra = table(["setup", "c", "e2e p50 / (c0)", "wall per turn / (c0)", "extra wall ms per turn",
                   "from more steps", "from slower steps", "branch ms", "engine steps", "prefilled tokens",
                   "sampled tokens", "front-end CPU ms"], rows)
    return (_measured(e) + f"; {c['dtype']}, {c['questions']} turns per concurrency, medians over {c['runs']} runs. "
            "Per turn:\n\n" + breakdown_table(r) + "\nWhat a gated turn adds against (c0), run by run:\n\n" + extra)


def _signed(figure: dict, digits: int = 0) -> str:
    value = round(figure["median"], digits)
    return f"{value + 0.0:+,.{digits}f}"  # + 0.0: no "-0"


def _demo_turns_view(envelopes: list[dict]) -> str:
    """`benchmarks/demo_turns.py`: the demo as a user meets it, a row per gate mode, and its turn targets."""
    from gatehead.evals.run import table

    [e] = envelopes
    r = e["results"]
    # Issue 43, item 6: 1.5 s where bf16 is native, 2.5 s on an AVX2-only CPU. Judged by the dtype the run
    # took (dtype auto takes bf16 only where the CPU, or the kind it ran as, computes it), so a CPU without
    # native bf16 (AVX2 or AVX-512F only, real or emulated) gets 2.5 s.
    native = r["dtype"].startswith("bfloat16")
    bound = 1.5 if native else 2.5

    def cell(m: dict) -> str:
        return f"{m['median']:.3f} s ({m['min']:.3f}-{m['max']:.3f})"

    rows, verdicts = [], []
    for name, setup in r["setups"].items():
        m = setup["medians"]
        turn, first = m["answered_turn_median_seconds"]["median"], m["first_turn_seconds"]["median"]
        gate, _, vllm_binding = name.partition(":")  # "suffix:vllm-binding": under vLLM's own CPU binding
        label = f"{gate} mode" + (", vLLM's CPU binding" if vllm_binding else "")
        rows.append([label, cell(m["gate_median_seconds"]), cell(m["answered_turn_median_seconds"]),
                     f"{first:.3f} s", f"{first / turn:.2f}x", f"{m['ready_seconds']['median']:.1f} s"])
        if not vllm_binding:  # the demo's targets are the demo's own set-up's
            verdicts.append(f"{label}: answered turn {turn:.3f} s ({'met' if turn <= bound else '**missed**'}), "
                            f"first turn {first / turn:.2f}x ({'met' if first <= 2 * turn else '**missed**'})")
    runs, kind = len(next(iter(r["setups"].values()))["runs"]), "bf16 native" if native else "no native bf16"
    return (_measured(e) + f"; {r['dtype']}; {runs} runs per mode, interleaved, medians (min-max).\n\n"
            + table(["gate", "gate call", "answered turn", "first turn after ready", "first turn / answered median",
                     "ready"], rows)
            + f"\nTargets: a median answered turn <= {bound:g} s on this CPU ({kind}) and the first turn after "
            "ready <= 2x it: " + "; ".join(verdicts) + ".\n")


def _guard_view(envelopes: list[dict]) -> str:
    from gatehead.evals.run import table

    [e] = envelopes
    r = e["results"]
    rows = [[name.replace("_", " "), x["outputs"], x["tripped"], "-"] for name, x in r.items()
            if name.startswith("clean_")]
    rows += [[name.removeprefix("fault_").replace("_", " ") + " (injected)", x["outputs"], x["detected"],
              f"{x['detected'] / x['outputs']:.1%}" if x["outputs"] else "-"] for name, x in r.items()
             if name.startswith("fault_")]
    rows += [[name.removeprefix("engine_kv_") + " KV blocks (engine fault)", x["outputs"],
              f"{x['detected']} of {x['changed']} changed answers",
              f"{x['detected'] / x['changed']:.1%}" if x["changed"] else "-"] for name, x in r.items()
             if name.startswith("engine_kv_")]
    took = f"{e['seconds'] / 60:.0f} min"
    return (_measured(e) + ", "
            f"{took}; improbable run: {r['guard']['improbable_run']} tokens below logprob "
            f"{r['guard']['improbable_logprob']}.\n\n"
            + table(["outputs", "n", "guard tripped / detected", "detection rate"], rows))


SET_NAMES = {"template": "template", "phrased": "phrased, unseen families", "out_of_scope": "out of scope (refused)",
             "handwritten": "typed by hand"}


def _demo_sets_view(envelopes: list[dict]) -> str:
    """`python -m gatehead.demo.build evaluate`'s figures, a row per evaluation set."""
    from gatehead.evals.run import table

    [e] = envelopes
    results = e["results"]
    rows = []
    for name, v in results["sets"].items():
        gate, recall = v["gate"], v["gate"]["recall"]
        answered = f"{v['answer_exact_match']:.1%} ({v['answerable']})" if v["answerable"] else ""
        recalls = (" / ".join(f"{100 * recall[c]:.1f}" for c in ("answer", "refuse", "search")) + "%"
                   if v["answerable"] else "")
        rows.append([f"{results['split']}: {SET_NAMES.get(name, name)}", v["questions"], f"{gate['accuracy']:.1%}",
                     answered, recalls])
    from gatehead.demo.targets import demo_sets_targets, outcome_line

    return (f"`{results['command']}` ({results['device']}):\n\n"
            + table(["set", "questions", "gate accuracy", "answer exact match", "recall answer / refuse / search"],
                    rows) + outcome_line(demo_sets_targets(results)))


def _small(x: float, fmt: str) -> str:
    """`x` in `fmt`, or in two significant digits where `fmt` would show a nonzero value as zero."""
    return f"{x:.1e}" if 0 < abs(x) < 1e-4 else f"{x:{fmt}}"


def _figure_cell(value) -> str:
    """One recorded test figure (tests/conftest.py `record_figure`) in a table cell, by its shape."""
    if isinstance(value, dict) and "shared_vs_stock" in value:  # a StabilityResult
        a, b = value["shared_vs_stock"], value["stock_vs_stock"]
        return (f"{a['differing']} of {a['requests']} requests differ, max |dlogprob| {a['max_abs_dlogprob']:.3g} "
                f"(stock vs stock: {b['differing']} differ)" + ("" if value["passed"] else "; **fails**"))
    if isinstance(value, dict) and "mix_a" in value:  # an Agreement
        mix = ", ".join(f"{k} {n}" for k, n in sorted(value["mix_a"].items()))
        return (f"{value['flips']} flip{'' if value['flips'] == 1 else 's'} of {value['n']}, max / mean |dp| "
                f"{_small(value['max_dp'], '.4f')} / {_small(value['mean_dp'], '.5f')} ({mix})")
    if isinstance(value, dict) and value and all(isinstance(v, list) and len(v) == 2 for v in value.values()):
        return "; ".join(f"{name}: {_small(fig, '.4f')}{' <=' if fig <= bound else ' **>**'} "
                         f"{_small(bound, '.4f')}" for name, (fig, bound) in value.items())  # (figure, bound) pairs
    if isinstance(value, dict) and "within_noise" in value:
        return (f"{value['flips']} flips of {value['gates']}; {value['within_noise']} gates lie within bf16's noise "
                f"({_small(value['noise'], '.4f')}) of a threshold")
    if isinstance(value, dict) and "preemptions" in value and "max_dp" in value:
        return f"max |dp| {value['max_dp']:.2g}, {value['preemptions']} preemptions"
    if isinstance(value, dict):
        return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in value.items())
    return str(value)


def _bf16_path(e: dict) -> str:
    isa, dtype = e["results"].get("cpu_isa"), e["results"].get("dtype")  # dtype: recorded since dtype auto
    if isa in ("avx512", "avx2") and dtype == "float32":
        kind = {"avx512": "AVX-512F", "avx2": "AVX2"}[isa]
        return f"fp32 as an {kind} CPU (on a host with {_bf16(e)})"
    emulated = isa == "avx512"
    return f"emulated bf16 (on a host with {_bf16(e)})" if emulated else _bf16(e)


def _outcomes(e: dict) -> str:
    counts: dict[str, int] = {}
    for outcome in e["results"].get("tests", {}).values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "no tests recorded"


def _tests_view(envelopes: list[dict], prefix: str) -> str:
    """Figures recorded by tests, keys under `prefix`: a row each, a column per envelope (a kind of bf16). A key
    whose label differs between runs (an fp32 run compares HF fp64 where a bf16 run compares HF bf16) is a
    row per label, each filled by the runs that measured that."""
    from gatehead.evals.run import table

    rows_of: dict[tuple[str, str], None] = {}
    for e in envelopes:
        for key, figure in e["results"]["figures"].items():
            if key.startswith(prefix):
                rows_of.setdefault((key, figure["label"]))

    def cell(e: dict, key: str, label: str) -> str:
        figure = e["results"]["figures"].get(key)
        return _figure_cell(figure["value"]) if figure and figure["label"] == label else "-"
    order = list(dict.fromkeys(key for key, _ in rows_of))  # a key's rows together, keys as first recorded
    rows = [[label] + [cell(e, key, label) for e in envelopes]
            for key, label in sorted(rows_of, key=lambda row: order.index(row[0]))]
    header = "\n".join(f"- {_bf16_path(e)}: " + _measured(e) + f"; tests {_outcomes(e)}" for e in envelopes)
    return header + "\n\n" + table(["check", *(_bf16_path(e) for e in envelopes)], rows)


def _soak_view(envelopes: list[dict]) -> str:
    from gatehead.evals.run import table

    [e] = envelopes
    figures = e["results"]["figures"]
    load, alone = figures["soak/load"]["value"], figures["soak/alone"]["value"]
    rows = [[what, n] for what, n in sorted(load["outcomes"].items())]
    return (_measured(e) + f"; tests {_outcomes(e)}. {load['clients']} clients for {load['soak_seconds']:.0f} s: "
            f"{load['completed']:,} requests completed, {load['preemptions']:,} preemptions, "
            f"{load['pressure_generations']} pressure generations, {load['canary_checks']} canary checks "
            f"({load['canary_failed_checks']} failed). Against the same requests alone ({alone['compared']:,} "
            f"compared): gate max |dp| {alone['gate_max_dp']:.2g}, generations differing "
            f"{alone['generations_differing_otherwise']} "
            f"(at a near tie: {alone['generations_differing_at_a_near_tie']})."
            "\n\n" + table(["requests", "n"], rows))


def _mode(results: dict) -> str:
    return "suffix mode" if "adapter-suffix" in results["command"] else "prompt mode"


def _gate_modes_view(envelopes: list[dict]) -> str:
    """Gate accuracy and refuse recall per evaluation set, a column per `demo.build evaluate` envelope."""
    from gatehead.evals.run import table

    many = [e["results"] for e in envelopes]
    sets = [name for name in many[0]["sets"] if all(name in r["sets"] for r in many)]
    rows = [[SET_NAMES.get(name, name), many[0]["sets"][name]["questions"]]
            + [f"{r['sets'][name]['gate']['accuracy']:.1%}, {r['sets'][name]['gate']['recall']['refuse']:.1%}"
               for r in many] for name in sets]
    sources = "; ".join(f"{_mode(r)}: `{r['command']}` ({r['device']})" for r in many)
    return (sources + "\n\n" + table([f"{many[0]['split']} set", "questions",
                                        *(f"{_mode(r)}: accuracy, refuse recall" for r in many)], rows))


def _spread(m: dict | float, fmt: str) -> str:
    """A median with its (min-max), as `benchmarks/gpu_branch.py --combine` writes them; a bare number is a
    value every run gave alike (to the digits recorded), shown as it is."""
    if not isinstance(m, dict):
        return f"{m:{fmt}} (every run)"
    return f"{m['median']:{fmt}} ({m['min']:{fmt}}-{m['max']:{fmt}})"


def _suffix_target_line(rows: list[dict]) -> str:
    """The suffix branch's target, <= 1% of a dedicated gate's full forward, judged on the medians."""
    def judged(key: str) -> str:
        medians = [(t["cached_prefix_tokens"], t[key]["median"] if isinstance(t[key], dict) else t[key]) for t in rows]
        return ", ".join(f"{n:,} tokens {m:.2%} " + ("(met)" if m <= 0.01 else "(**missed**)") for n, m in medians)
    return (f"Target (suffix branch <= 1% of the dedicated full forward, medians): as a CUDA graph "
            f"{judged('ratio_cuda_graph')}; eager {judged('ratio')}.")


def _gpu_branch_view(envelopes: list[dict]) -> str:
    """`benchmarks/gpu_branch.py`'s combined runs: the branch against a dedicated gate at a 27B-like shape."""
    from gatehead.evals.run import table

    [e] = envelopes
    r = e["results"]
    prompt = table(["gate prompt", "dedicated full forward ms", "shared engine's branch ms", "ratio"],
                   [[f"{t['prompt_tokens']:,} tokens", _spread(t["dedicated_full_forward"], ".1f"),
                     _spread(t["shared_branch_marginal"], ".2f"), _spread(t["ratio"], ".3f")] for t in r["timings_ms"]])
    suffix = table(["cached prefix", "dedicated, full", "dedicated, prefix cached", "suffix branch, eager", "/ full",
                    "/ prefix cached", "CUDA graph", "/ full"],
                   [[f"{t['cached_prefix_tokens']:,} tokens", _spread(t["dedicated_full_forward"], ".1f"),
                     _spread(t["dedicated_prefix_cached"], ".1f"), _spread(t["suffix_branch"], ".2f"),
                     _spread(t["ratio"], ".4f"), _spread(t["ratio_to_prefix_cached"], ".3f"),
                     _spread(t["suffix_branch_cuda_graph"], ".2f"), _spread(t["ratio_cuda_graph"], ".4f")]
                    for t in r["suffix_mode_ms"]])
    batched = table(["8 gate prompts of", "sequential ms", "batched ms", "ratio",
                     "max \\|logit\\| batched vs sequential"],
                    [[f"{min(b['prompt_tokens']):,}-{max(b['prompt_tokens']):,} tokens",
                      _spread(b["sequential"], ".1f"),
                      _spread(b["batched"], ".1f"), _spread(b["ratio"], ".2f"),
                      f"{b['max_abs_logit_batched_vs_sequential']['max']:.3f}"]
                     for b in r["batched_prompt_mode_ms"].values()])
    shape, w = r["shape"], r["weights_gib"]
    return (f"{e['date'][:10]}, commit {e['commit'][:7]}: {r['gpu']}, torch {r['torch']}; "
            f"{r['parameters_billion']} B parameters ({shape['num_hidden_layers']} "
            f"layers, hidden {shape['hidden_size']}), k={r['k']}, LoRA r={r['lora_rank']}; medians (min-max) over "
            f"{r['runs']} runs, each the median of 5 repeats. Prompt-mode gate (the branch over every tapped row):"
            "\n\n" + prompt + "\nSuffix-mode gate after a cached prefix (ms):\n\n" + suffix
            + "\n" + _suffix_target_line(r["suffix_mode_ms"])
            + "\n\nBatched prompt-mode branch, one pass against one after another:\n\n" + batched
            + f"\nWeights: one shared engine {w['one_shared_engine']} GiB, generation beside a dedicated gate engine "
            f"{w['two_engines']} GiB.\n")


# Every view renders `gatehead figures` envelopes: one, or several (comma-separated sources) where it says so.
VIEWS = {"bench": _bench_view, "bench-threads": _threads_view, "demo-sets": _demo_sets_view,
         "gpu-branch": _gpu_branch_view, "gate-modes": _gate_modes_view, "evals": _evals_view,
         "threads-eval": _threads_eval_view, "agent-ttft": _ttft_view, "suffix-latency": _suffix_latency_view,
         "turn-cost": _turn_cost_view,
         "guard-rates": _guard_view, "demo-turns": _demo_turns_view, "tests-tiny": lambda e: _tests_view(e, "tiny/"),
         "tests-demo": lambda e: _tests_view(e, "demo/"), "soak": _soak_view,
         "tests-vllm-serve": lambda e: _tests_view(e, "vllm-serve/")}
