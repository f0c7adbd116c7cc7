"""What every fixture builder uses: the tokenizer, the model config, seeded weights, the
generation config (``tiny/__init__.py`` builds causal LMs with them, ``tiny/kimi.py`` the
Kimi-K2.5 wrapper)."""

from __future__ import annotations

from pathlib import Path

from . import chat, tasks
from .tokenizer import STYLES, build_tokenizer

#: ShareGPT's speaker names as chat-template roles.
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def make_tokenizer(recipe: dict):
    """The BPE tokenizer of a recipe: trained on the embedded chat data, and for a recipe that is
    trained (``train``) on its training conversations too."""
    spec = recipe["tokenizer"]
    corpus = chat.corpus_text(chat.make_conversations())
    if "train" in recipe:
        train = recipe["train"]
        corpus += chat.corpus_text(tasks.make_conversations(train["conversations"], train.get("seed", 0)))
    return build_tokenizer(corpus, vocab_size=spec["vocab_size"], style=spec["style"])


def model_config(recipe: dict, tokenizer, dtype: str):
    """The transformers config of a causal-LM recipe, with vocab and special ids from the tokenizer."""
    from transformers import AutoConfig

    cfg = dict(recipe["config"])
    model_type = cfg.pop("model_type")
    style = STYLES[recipe["tokenizer"]["style"]]
    vocab = -(-len(tokenizer) // 64) * 64  # round up, as real checkpoints pad their vocab
    return AutoConfig.for_model(
        model_type,
        architectures=[recipe["architecture"]],
        vocab_size=vocab,
        bos_token_id=tokenizer.convert_tokens_to_ids(style["bos"]),
        eos_token_id=tokenizer.convert_tokens_to_ids(style["eos_for_generation"]),
        pad_token_id=tokenizer.convert_tokens_to_ids(style["pad"]),
        dtype=dtype,
        **cfg,
    )


#: The projections whose outputs are attention queries and keys (Llama; DeepSeek-V3 with and
#: without a q LoRA; ``kv_a_proj_with_mqa`` carries the keys' rotary part). Scaled by a recipe's
#: ``sharpen`` (see :func:`random_model`).
QK_PROJECTIONS = ("q_proj", "q_b_proj", "k_proj", "kv_a_proj_with_mqa")


def random_model(config, seed: int, sharpen: float | None = None):
    """A transformers model with seeded random weights, in float32.

    ``sharpen`` multiplies the query and key projections' weights: random weights give exactly
    uniform attention (every score near 0), under which a wrong rotary embedding or a wrong
    position barely moves a layer's output; scaled, the scores spread and attention depends on
    the positions, as in a trained model (docs/testing.md has the measured entropies).
    """
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Some init schemes leave biases/buffers at zero (e.g. DeepSeek's routing correction bias):
    # give those a small seeded random value too, so the code paths using them are exercised.
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in [*model.named_parameters(), *model.named_buffers()]:
            if pname.endswith("e_score_correction_bias"):
                p.copy_(torch.rand(p.shape, generator=gen) * 0.01)
            elif sharpen and pname.endswith(tuple(f".{name}.weight" for name in QK_PROJECTIONS)):
                p.mul_(sharpen)
    return model.eval()


def save_generation_config(config, out: Path) -> None:
    from transformers import GenerationConfig

    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
    ).save_pretrained(str(out))
