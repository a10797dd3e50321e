"""A byte-level BPE tokenizer trained from text, carrying gatehead's reserved tokens and a ChatML template:
the tokenizer of models built from scratch (tiny test and benchmark models, the first demo model)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gatehead.gate.adapter import DEFAULT_ACTION_TOKENS, DEFAULT_SUFFIX

RESERVED_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", DEFAULT_SUFFIX, *DEFAULT_ACTION_TOKENS)
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(out_dir: Path, vocab_size: int, texts: Iterable[str], split_digits: bool = False):
    """Train and save a byte-level BPE tokenizer with gatehead's reserved tokens and a ChatML template.

    `texts` is the training text; `split_digits` makes every digit its own token, so numbers are spelled
    from ten common tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]) \
        if split_digits else byte_level
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(RESERVED_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=list(RESERVED_TOKENS[1:]),
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return tokenizer
