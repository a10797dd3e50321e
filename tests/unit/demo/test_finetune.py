"""The generator's LoRA merge: the exact sum, the same bytes under every CPU capability, clear refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gatehead.demo.base import merge


def tiny_llama_with_lora(root: Path) -> tuple[Path, Path]:
    """A tiny tied-embedding Llama and a random LoRA on its attention and MLP, as PEFT saves them."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    base, lora = root / "base", root / "lora"
    base.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              str(base / "model.safetensors"), metadata={"format": "pt"})
    (base / "config.json").write_text(config.to_json_string())
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape))
    peft.save_pretrained(lora)
    return base, lora


def test_the_merge_is_the_exact_sum_and_the_same_bytes_at_every_cpu_capability(tmp_path: Path) -> None:
    base, lora = tiny_llama_with_lora(tmp_path)
    digest = merge(base, lora, tmp_path / "merged")
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    weights = load_file(str(base / "model.safetensors"))
    adapter = load_file(str(lora / "adapter_model.safetensors"))
    a = adapter["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"].double()
    b = adapter["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"].double()
    exact = weights["model.layers.1.mlp.down_proj.weight"].double() + 2.0 * (b @ a)
    assert torch.equal(merged["model.layers.1.mlp.down_proj.weight"], exact.float())  # one rounding, to nearest
    assert torch.equal(merged["model.layers.0.mlp.up_proj.weight"], weights["model.layers.0.mlp.up_proj.weight"])
    assert (tmp_path / "merged" / "config.json").is_file()
    assert json.loads((tmp_path / "merged" / "provenance.json").read_text())["weights_sha256"] == digest
    # Another process whose torch kernels run at the lowest capability writes the same bytes.
    code = ("import sys; from pathlib import Path; from gatehead.demo.base import merge; "
            "print(merge(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    done = subprocess.run([sys.executable, "-c", code, str(base), str(lora), str(tmp_path / "again")], env=env,
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == digest


def test_a_lora_for_weights_the_base_lacks_is_refused(tmp_path: Path) -> None:
    base, lora = tiny_llama_with_lora(tmp_path)
    weights = load_file(str(base / "model.safetensors"))
    weights.pop("model.layers.1.self_attn.q_proj.weight")
    save_file(weights, str(base / "model.safetensors"))
    with pytest.raises(ValueError, match="the base does not have"):
        merge(base, lora, tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_the_reply_loss_is_the_models_own_loss_on_the_replies(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from gatehead.demo.finetune import _reply_loss

    base, _ = tiny_llama_with_lora(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    rows = [(list(range(10, 40)), 22), (list(range(50, 67)), 9), (list(range(3, 9)), 5)]  # left-padded together
    with torch.no_grad():
        batched = _reply_loss(model, rows, 0, "cpu", cpu_bf16=False)
        total = count = 0.0
        for seq, start in rows:  # one at a time, unpadded, through the model's own loss
            labels = torch.tensor([seq])
            labels[0, :start] = -100
            total += model(input_ids=torch.tensor([seq]), labels=labels).loss * (len(seq) - start)
            count += len(seq) - start
    assert torch.allclose(batched, total / count, rtol=1e-5)


def test_the_training_loop_follows_its_schedule_and_lowers_the_replies_loss(tmp_path: Path) -> None:
    """`_train` takes `max_steps` steps on the warm-up-then-cosine schedule and the replies' loss falls;
    a timed run fixes its total once, during warm-up, from the rate of its steps."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from gatehead.demo.finetune import FinetuneConfig, _reply_loss, _Schedule, _train

    base, _ = tiny_llama_with_lora(tmp_path)
    schedule = _Schedule(warmup=4, total=20)
    assert [round(schedule(s), 3) for s in (0, 3, 4, 12, 20)] == [0.25, 1.0, 1.0, 0.5, 0.0]
    torch.manual_seed(0)
    rows = [([1 + i % 5, 2, 3, 4, 5, 10 + i % 5, 20 + i % 5], 5) for i in range(40)]  # the reply: the first token's
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        before = _reply_loss(model, rows, 0, "cpu", cpu_bf16=False).item()
    config = FinetuneConfig(rank=4, alpha=8, learning_rate=1e-2, batch_size=8, warmup_steps=10, max_steps=60)
    logged: list[str] = []
    steps, log_rows = _train(model, rows, 0, "cpu", config, _Schedule(10, 60), 0.0, logged.append)
    with torch.no_grad():
        after = _reply_loss(model.eval(), rows, 0, "cpu", cpu_bf16=False).item()
    assert steps == 60 and log_rows[-1]["step"] == 60 and after < before - 0.3  # 4.56 -> 3.92 here
    timed = _Schedule(10, 1000)
    import time

    steps, _ = _train(model.train(), rows, 0, "cpu", FinetuneConfig(batch_size=8, warmup_steps=10, seconds=0.5),
                      timed, time.time(), logged.append)
    assert 9 <= steps == timed.total < 1000 and any("steps in all" in line for line in logged)
