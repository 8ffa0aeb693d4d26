"""Small Hugging Face language models with random weights, for the generate rows of
``normlab bench --suite blocks``: GPT-2 (LayerNorm) and Llama (RMSNorm), d_model 512, 4 layers,
8 heads, a vocabulary of 1000 (``--quick``: 2 layers). Built from configs alone (nothing is
downloaded); transformers is optional: without it these rows are reported as skipped."""

from __future__ import annotations

import copy

import torch

from normlab.tools.conversion import convert

GENERATE_TOKENS = 64  # new tokens per generate call, batch 1, greedy
PROMPT_TOKENS = 8
VOCAB = 1000


def available() -> bool:
    """Whether transformers imports (the models come from it)."""
    try:
        import transformers  # noqa: F401
    except Exception:  # an ImportError, or a transformers broken against this torch
        return False
    return True


def build(name: str, d_model: int, layers: int, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.nn.Module]:
    """``{"torch": model, "normlab": convert(deepcopy(model))}`` in eval mode, same weights."""
    import transformers

    torch.manual_seed(seed)
    if name == "GPT2Generate":
        cfg = transformers.GPT2Config(n_embd=d_model, n_layer=layers, n_head=8, vocab_size=VOCAB,
                                      n_positions=PROMPT_TOKENS + GENERATE_TOKENS + 8)
        model = transformers.GPT2LMHeadModel(cfg)
    elif name == "LlamaGenerate":
        cfg = transformers.LlamaConfig(hidden_size=d_model, intermediate_size=-(-(8 * d_model // 3) // 64) * 64,
                                       num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                                       vocab_size=VOCAB, max_position_embeddings=PROMPT_TOKENS + GENERATE_TOKENS + 8)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        raise ValueError(f"normlab bench: unknown model {name!r}; expected GPT2Generate or LlamaGenerate")
    model = model.to(dtype).eval()
    return {"torch": model, "normlab": convert(copy.deepcopy(model)).eval()}


def prompt(seed: int = 0) -> torch.Tensor:
    """A (1, PROMPT_TOKENS) prompt of token ids drawn from ``seed``."""
    return torch.randint(1, VOCAB, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(seed))


def generate(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Greedy decoding of exactly GENERATE_TOKENS new tokens with the key/value cache."""
    with torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=GENERATE_TOKENS,
                              min_new_tokens=GENERATE_TOKENS, do_sample=False, pad_token_id=0)
