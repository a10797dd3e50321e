"""The demo's generator: a LoRA fine-tune of the pretrained base on `gatehead.demo.tasks`, and its validation.

`finetune` trains a LoRA on every linear layer of the base (SmolLM2-135M-Instruct, `gatehead.demo.base`)
on the demo's tasks: a short answer with its `[n]` citation, the refusal sentence, the standalone
rewrite of a search question or a follow-up. Loss is on the reply alone (the base already reads).
Prompts are laid out by `gatehead.gate.prompt`, exactly as the engine and the agent lay them out.
The committed LoRA is folded into the base at setup by `gatehead.demo.base.merge` (the `merge` stage here
runs it), the same bytes on every machine (`MERGED_SHA256`). `validate` measures the generator alone on
validation rows (batched greedy decoding).
Training needs PyTorch and PEFT only (CUDA if present); nothing here starts vLLM.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from gatehead.demo.base import GENERATOR_DIR
from gatehead.gate.adapter import DEFAULT_TARGET_MODULES


@dataclass(frozen=True)
class FinetuneConfig:
    """The generator's LoRA and its data."""

    rank: int = 32
    alpha: int = 64
    dropout: float = 0.05
    target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES
    learning_rate: float = 3e-4
    epochs: int = 2
    batch_size: int = 32
    warmup_steps: int = 100
    weight_decay: float = 0.0
    knowledge_bases: int = 30  # synthetic knowledge bases beside the labelled training split
    conversations: int = 400  # follow-up exchanges per synthetic knowledge base (`conversation_examples`)
    real_conversations: int = 3000  # follow-up exchanges over the training split's own products
    labelled_repeats: int = 1  # times each labelled training row (real retrieval, people's phrasings) is seen
    seed: int = 0
    max_steps: int | None = None  # stop early (smoke runs)
    # Train for about this many seconds (a CPU's run): the step count is fixed from the rate of steps 3-8,
    # before warm-up ends, so the run equals one given that count as max_steps (training.json records it).
    seconds: float | None = None
    cpu_bf16: bool = False  # on CPU, compute under bf16 autocast as on CUDA (native on AMX and AVX-512 BF16)
    save_dtype: str = "bfloat16"  # the committed LoRA's dtype (the merge reads it as it is)

    def __post_init__(self) -> None:
        if self.seconds is not None and self.warmup_steps < 9:
            raise ValueError("FinetuneConfig.seconds needs warmup_steps >= 9: the step count is fixed during warm-up")


def _train_view(kb):
    """The knowledge base as training may see it: training-split products and documents only, and products
    that do not exist named with invented stems (the real ghost names are asked in held-out sets)."""
    from gatehead.demo.kb import KnowledgeBase, invented_stems

    ghosts = tuple(f"{stem} Lantern" for stem in invented_stems(random.Random("train-ghosts"), 20, True))
    return KnowledgeBase(tuple(d for d in kb.docs if d.split == "train"),
                         tuple(p for p in kb.products if p.split == "train"),
                         tuple(p for p in kb.policies if p.split == "train"), ghosts, kb.seed)


def examples(config: FinetuneConfig, data_dir: Path, smoke: bool = False) -> list:
    """Every training example: labelled rows, synthetic knowledge bases and follow-up conversations."""
    from gatehead.demo import SEED
    from gatehead.demo.kb import build_kb, invented_stems
    from gatehead.demo.splits import handwritten_texts, training_records
    from gatehead.demo.tasks import conversation_examples, training_examples

    records = training_records(data_dir, phrasings=True)[:40 if smoke else None]
    bases = 1 if smoke else config.knowledge_bases
    out = training_examples(records * config.labelled_repeats, bases, config.seed, same_category=True,
                            wide_names=True, phrasings=True, exclude=handwritten_texts())
    r = random.Random(f"conversations-{config.seed}")
    for i in range(bases):  # the same synthetic knowledge bases `training_examples` drew, with their ghosts
        stems = invented_stems(random.Random(f"{config.seed}-{i}"), 80, True)
        kb = build_kb(seed=1000 + config.seed * 100 + i, products=40, stems=stems[:60], ghost_stems=stems[60:],
                      policies=False)
        out += conversation_examples(kb, r, 20 if smoke else config.conversations)
    real = _train_view(build_kb(SEED))
    out += conversation_examples(real, r, 20 if smoke else config.real_conversations)
    r.shuffle(out)
    return out


def finetune(base_dir: Path, out_dir: Path, config: FinetuneConfig, data_dir: Path | None = None,
             smoke: bool = False, log=print) -> dict:
    """Trains the generator's LoRA on `base_dir`; writes it (fp32) and `training.json` to `out_dir`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gatehead.demo.splits import DATA_DIR
    from gatehead.demo.train import encode

    started = time.time()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    items = examples(config, data_dir or DATA_DIR, smoke)
    data = encode(items, tokenizer, 2048)
    log(f"{len(data)} examples, {sum(len(ids) for ids, _ in data)} tokens")
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    lora = LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                      target_modules=list(config.target_modules), task_type="CAUSAL_LM")
    model = get_peft_model(model, lora).to(device)
    per_epoch = -(-len(data) // config.batch_size)
    schedule = _Schedule(config.warmup_steps,
                         per_epoch * config.epochs if config.max_steps is None else config.max_steps)
    step, rows = _train(model, data, tokenizer.pad_token_id, device, config, schedule, started, log)
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to("cpu", dtype=getattr(torch, config.save_dtype)).save_pretrained(out_dir)
    config_file = out_dir / "adapter_config.json"
    settings = json.loads(config_file.read_text())
    settings["base_model_name_or_path"] = "smollm2-135m-instruct (gatehead.demo.base)"  # no path of this machine
    config_file.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    report = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
              "seconds": round(time.time() - started, 1), "config": asdict(config), "examples": len(data),
              "steps": step, "log": rows}
    (out_dir / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


class _Schedule:
    """The learning rate's factor: linear warm-up, then a cosine to 0 at `total` steps (a timed run fixes
    `total` during warm-up, where the factor does not depend on it)."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup, self.total = warmup, total

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        return 0.5 * (1 + math.cos(math.pi * (step - self.warmup) / max(1, self.total - self.warmup)))


def _train(model, data, pad: int, device: str, config: FinetuneConfig, schedule: _Schedule, started: float, log):
    """The optimisation: batches of similar lengths in a seeded order, epoch after epoch, until the schedule's
    total (fixed from the step rate where `config.seconds` is given); returns (steps taken, loss log rows)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    r = random.Random(config.seed)
    step, running, rows, timed_from = 0, 0.0, [], started
    model.train()
    while step < schedule.total:
        order = sorted(range(len(data)), key=lambda j: (len(data[j][0]), r.random()))
        batches = [order[i:i + config.batch_size] for i in range(0, len(order), config.batch_size)]
        r.shuffle(batches)
        for idx in batches:
            if step >= schedule.total:
                break
            loss = _reply_loss(model, [data[j] for j in idx], pad, device, config.cpu_bf16)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            running += loss.detach()
            step += 1
            if config.seconds is not None and step in (3, 8):
                if step == 3:
                    timed_from = time.time()
                else:  # still warming up: the schedule so far does not depend on the total
                    per_step = (time.time() - timed_from) / 5
                    schedule.total = max(9, min(schedule.total,
                                                int((config.seconds - (time.time() - started)) / per_step) + 8))
                    log(f"{per_step:.1f} s a step: {schedule.total} steps in all")
            if step % 100 == 0 or step == schedule.total:
                mean = running.item() / (step % 100 or 100)
                rows.append({"step": step, "loss": round(mean, 5), "seconds": round(time.time() - started, 1)})
                log(f"step {step}/{schedule.total}  loss {mean:.4f}  {time.time() - started:.0f}s")
                running = 0.0
    return step, rows


def _reply_loss(model, rows: Sequence[tuple[list[int], int]], pad: int, device: str, cpu_bf16: bool):
    """Mean next-token loss over the replies of `rows` ((ids, reply start) each).

    Left-padded, so every reply ends at the batch's last position and only the last `keep` positions'
    logits are computed (the output layer over 49 k tokens is a quarter of a 300-token example's work).
    Positions count from each sequence's first real token, as the engine counts them."""
    import torch

    length = max(len(seq) for seq, _ in rows)
    keep = max(len(seq) - start for seq, start in rows) + 1
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    reply = torch.zeros((len(rows), length), dtype=torch.bool)
    for row, (seq, start) in enumerate(rows):
        ids[row, length - len(seq):] = torch.tensor(seq)
        mask[row, length - len(seq):] = 1
        reply[row, length - len(seq) + start:] = True
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda" or cpu_bf16)
    with autocast:
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                       logits_to_keep=keep).logits  # [B, keep, V]: positions length-keep .. length-1
    targets, wanted = ids[:, length - keep + 1:].to(device), reply[:, length - keep + 1:].to(device)
    losses = torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), targets, reduction="none")
    return losses[wanted].mean()


def _generate(model, tokenizer, prompts: Sequence[Sequence[int]], max_new: int = 40, batch: int = 64) -> list[str]:
    """Greedy replies, batched with left padding."""
    import torch

    eos = tokenizer.eos_token_id
    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    replies: dict[int, str] = {}
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        length = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), length), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(idx), length), dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, length - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[row, length - len(prompts[i]):] = 1
        with torch.no_grad():
            made = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new,
                                  do_sample=False, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
        for row, i in enumerate(idx):
            new = made[row, length:].tolist()
            replies[i] = tokenizer.decode(new[:new.index(eos)] if eos in new else new, skip_special_tokens=True)
    return [replies[i] for i in range(len(prompts))]


class _StockVLLM:
    """Greedy replies from stock vLLM (gatehead's plugin left out): the fast path on a CPU."""

    def __init__(self, model_dir: Path, tokenizer) -> None:
        from vllm import LLM

        from gatehead.runtime.cpu_setup import cpu_set_up
        from gatehead.runtime.dtype import resolve_dtype
        from gatehead.runtime.plugin import stock_vllm

        self.tokenizer = tokenizer
        with stock_vllm(), cpu_set_up():
            self.llm = LLM(model=str(model_dir), dtype=resolve_dtype("auto"), enforce_eager=True, max_model_len=2048,
                           kv_cache_memory_bytes=1 << 30, seed=0)

    def replies(self, prompts: Sequence[Sequence[int]], max_new: int = 40) -> list[str]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_new)
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        return [o.outputs[0].text for o in outputs]

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()


def validate(model_dir: Path, data_dir: Path | None = None, split: str = "val", conversations: int = 300,
             engine: str = "hf") -> dict:
    """The generator alone on `split`'s labelled rows (gold decisions): answer exact match, refusals,
    search rewrites, and follow-ups over `split`'s own products (rewrite exact match, answer exact match).
    `engine`: "hf" (transformers, batched; CUDA if present) or "vllm" (stock vLLM in the dtype `auto` picks)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gatehead.demo.splits import DATA_DIR

    data_dir = data_dir or DATA_DIR
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if engine == "vllm":
        stock = _StockVLLM(model_dir, tokenizer)
        generate, close = stock.replies, stock.close
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()

        def generate(prompts):
            return _generate(model, tokenizer, prompts)

        def close():
            return None
    try:
        return _validate(generate, tokenizer, data_dir, split, conversations)
    finally:
        close()


def _validate(generate, tokenizer, data_dir: Path, split: str, conversations: int) -> dict:
    from gatehead.agent.prompts import ANSWER_SYSTEM, REFUSAL, REWRITE_SYSTEM
    from gatehead.demo import SEED
    from gatehead.demo.kb import KnowledgeBase, build_kb
    from gatehead.demo.splits import read_jsonl
    from gatehead.demo.tasks import conversation_examples, normalize
    from gatehead.gate.adapter import DEFAULT_SUFFIX
    from gatehead.gate.data import parse_example
    from gatehead.gate.prompt import PromptBuilder, PromptConfig

    builders = {system: PromptBuilder(tokenizer, DEFAULT_SUFFIX, PromptConfig(max_context=2048, system=system))
                for system in (ANSWER_SYSTEM, REWRITE_SYSTEM)}
    figures: dict[str, dict] = {}
    for name, file in (("template", f"{split}.jsonl"), ("phrased", f"phrased-{split}.jsonl")):
        rows = read_jsonl(data_dir / file)
        parsed = [(row, parse_example(row, f"{name}:{i}")) for i, row in enumerate(rows)]
        answerable = [(r, e) for r, e in parsed if e.label == "answer"]
        refusing = [(r, e) for r, e in parsed if e.label == "refuse"]
        searching = [(r, e) for r, e in parsed if e.label == "search"]
        prompts = [builders[ANSWER_SYSTEM].build(e.question, e.passages).answer for _, e in answerable + refusing]
        prompts += [builders[REWRITE_SYSTEM].build(e.question, e.passages).answer for _, e in searching]
        replies = generate(prompts)
        a, f = len(answerable), len(refusing)
        rewritten = [normalize(x) == normalize(r["rewrite"])
                     for x, (r, _) in zip(replies[a + f:], searching, strict=True)]
        hits = [normalize(x) == normalize(r["answer"]) for x, (r, _) in zip(replies[:a], answerable, strict=True)]
        cites = ["[" in x for x in replies[:a]]
        figures[name] = {"answerable": a, "answer_exact_match": sum(hits) / max(a, 1),
                         "cited": sum(cites) / max(a, 1),
                         "refused_on_refuse": sum(x.strip() == REFUSAL for x in replies[a:a + f]) / max(f, 1),
                         "rewrite_exact_match": sum(rewritten) / max(len(rewritten), 1),
                         "misses": [{"q": r["question"], "gold": r["answer"], "got": x} for x, (r, _), ok in
                                    zip(replies[:a], answerable, hits, strict=True) if not ok][:12]}
    kb = build_kb(SEED)
    view = KnowledgeBase(tuple(d for d in kb.docs if d.split == split),
                         tuple(p for p in kb.products if p.split == split), (), kb.ghosts, kb.seed)
    follow = conversation_examples(view, random.Random(f"validate-{split}"), conversations)
    prompts = [builders[e.system].build(e.question, e.passages, e.conversation).answer for e in follow]
    replies = generate(prompts)
    rewrites = [(e, x) for e, x in zip(follow, replies, strict=True) if e.system == REWRITE_SYSTEM]
    answers = [(e, x) for e, x in zip(follow, replies, strict=True) if e.system == ANSWER_SYSTEM]
    figures["follow_ups"] = {
        "rewrites": len(rewrites),
        "rewrite_exact_match": sum(normalize(x) == normalize(e.target) for e, x in rewrites) / max(len(rewrites), 1),
        "answers": len(answers),
        "answer_exact_match": sum(normalize(x) == normalize(e.target) for e, x in answers) / max(len(answers), 1),
        "rewrite_misses": [{"q": e.question, "turns": [t.text for t in e.conversation], "gold": e.target, "got": x}
                           for e, x in rewrites if normalize(x) != normalize(e.target)][:12]}
    return figures


def score(figures: dict) -> float:
    """How `choose` ranks generators on validation: the mean of the phrased set's answer exact match and
    refusals and the follow-ups' rewrite and answer exact match (the people-facing tasks, equally weighted)."""
    phrased, follow = figures["phrased"], figures["follow_ups"]
    return (phrased["answer_exact_match"] + phrased["refused_on_refuse"] + follow["rewrite_exact_match"]
            + follow["answer_exact_match"]) / 4


def choose(base_dir: Path, config: FinetuneConfig, work: Path, committed: Path = GENERATOR_DIR) -> dict:
    """Trains a candidate generator (`work/candidate`), merges it and the `committed` one into the base
    (`work/merged-committed`, `work/merged-candidate`), validates both on val and names the better by `score`.
    The candidate replaces nothing: committing it (and `MERGED_SHA256`) is the maintainer's step."""
    from gatehead.demo.base import merge

    finetune(base_dir, work / "candidate", config)
    figures: dict = {"rule": " ".join(score.__doc__.split()), "merged": {}}
    for name, lora in (("committed", committed), ("candidate", work / "candidate")):
        figures["merged"][name] = merge(base_dir, lora, work / f"merged-{name}")
        started = time.time()
        figures[name] = validate(work / f"merged-{name}")
        figures[name].update(seconds=round(time.time() - started, 1), score=score(figures[name]))
    figures["choice"] = "candidate" if figures["candidate"]["score"] > figures["committed"]["score"] else "committed"
    (work / "validation.json").write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")
    return figures


def sha256_dir(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gatehead.demo.finetune", description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["train", "merge", "validate", "choose"])
    parser.add_argument("--base", type=Path, help="the base directory (default: gatehead.demo.base's)")
    parser.add_argument("--out", type=Path, default=GENERATOR_DIR,
                        help="train: the LoRA's directory; choose: the work directory (candidate, merges, figures)")
    parser.add_argument("--merged", type=Path, help="merge: where the merged model goes; validate: the model")
    parser.add_argument("--config", default="{}", help="train, choose: FinetuneConfig fields as JSON")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="validate: transformers or stock vLLM")
    parser.add_argument("--json-out", type=Path, help="validate: also write the figures to this file")
    args = parser.parse_args(argv)
    if args.stage == "train":
        from gatehead.demo.base import ensure_base

        base = args.base or ensure_base()
        report = finetune(base, args.out, FinetuneConfig(**json.loads(args.config)), smoke=args.smoke)
        print(json.dumps({k: report[k] for k in ("seconds", "examples", "steps")}))
    elif args.stage == "choose":
        from gatehead.demo.base import ensure_base

        if args.out == GENERATOR_DIR:
            parser.error("choose needs --out, a work directory (the committed generator stays as it is)")
        figures = choose(args.base or ensure_base(), FinetuneConfig(**json.loads(args.config)), args.out)
        print(json.dumps({k: figures[k] for k in ("merged", "choice")} | {
            name: round(figures[name]["score"], 4) for name in ("committed", "candidate")}))
    elif args.stage == "merge":
        from gatehead.demo.base import ensure_base, merge

        print(merge(args.base or ensure_base(), args.out, args.merged))
    else:
        import sys

        from gatehead.demo.base import WEIGHTS, sha256_file
        from gatehead.provenance import described_commit, machine

        started = time.time()
        sets = validate(args.merged, engine=args.engine)
        figures = {"command": "python -m gatehead.demo.finetune " + " ".join(sys.argv[1:]),
                   "commit": described_commit(),
                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
                   "weights_sha256": sha256_file(args.merged / WEIGHTS), "engine": args.engine,
                   "seconds": round(time.time() - started, 1), "sets": sets}
        text = json.dumps(figures, indent=2, ensure_ascii=False)
        if args.json_out:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            args.json_out.write_text(text + "\n", encoding="utf-8")
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
