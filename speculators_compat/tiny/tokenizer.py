"""A byte-level BPE tokenizer trained offline on the embedded chat corpus, with a chat template.

Two template styles, so that speculators' assistant-span detection is exercised on both
families of markers it meets in practice:

- ``kimi``: Kimi-K2 style role markers (``<|im_user|>user<|im_middle|>...<|im_end|>``),
- ``llama3``: Llama-3 style headers (``<|start_header_id|>assistant<|end_header_id|>``).
"""

from __future__ import annotations

STYLES: dict[str, dict] = {
    "kimi": {
        "bos": "[BOS]",
        "eos": "[EOS]",
        "pad": "[PAD]",
        "extra": [
            "<|im_end|>",
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
            "<|media_begin|>",
            "<|media_content|>",
            "<|media_end|>",
            "<|media_pad|>",
        ],
        # The end-of-turn marker is what generation stops on.
        "eos_for_generation": "<|im_end|>",
        "template": (
            "{%- for message in messages -%}"
            "{%- if message['role'] == 'system' -%}"
            "<|im_system|>system<|im_middle|>{{ message['content'] }}<|im_end|>"
            "{%- elif message['role'] == 'user' -%}"
            "<|im_user|>user<|im_middle|>{{ message['content'] }}<|im_end|>"
            "{%- else -%}"
            "<|im_assistant|>assistant<|im_middle|>{{ message['content'] }}<|im_end|>"
            "{%- endif -%}"
            "{%- endfor -%}"
            "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
        ),
    },
    "llama3": {
        "bos": "<|begin_of_text|>",
        "eos": "<|end_of_text|>",
        "pad": "<|finetune_right_pad_id|>",
        "extra": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "eos_for_generation": "<|eot_id|>",
        "template": (
            "{{ bos_token }}"
            "{%- for message in messages -%}"
            "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
            "{{ message['content'] | trim }}<|eot_id|>"
            "{%- endfor -%}"
            "{%- if add_generation_prompt -%}"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
            "{%- endif -%}"
        ),
    },
}


def special_tokens(style: str) -> list[str]:
    spec = STYLES[style]
    return [spec["bos"], spec["eos"], spec["pad"], *spec["extra"]]


def build_tokenizer(corpus: list[str], vocab_size: int, style: str):
    """Train a byte-level BPE on ``corpus`` and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if style not in STYLES:
        raise ValueError(f"unknown tokenizer style {style!r}; choose one of {sorted(STYLES)}")
    spec = STYLES[style]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens(style),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=spec["bos"],
        eos_token=spec["eos"],
        pad_token=spec["pad"],
        additional_special_tokens=spec["extra"],
        model_max_length=4096,
    )
    fast.chat_template = spec["template"]
    return fast
