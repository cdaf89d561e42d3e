"""Write a tiny random-weight Hugging Face model directory for the real-vLLM tests.

Standalone: it needs torch, safetensors, tokenizers and transformers, which the dedicated vLLM venv
has (the project venv does not), so run it with that venv's python::

    <vllm-venv-python> tests/real/hf_tiny.py OUT_DIR --arch qwen3next|qwen3 --seed 0

Architectures:

* ``qwen3next`` -> ``Qwen3NextForCausalLM``, the hybrid one: Gated DeltaNet (linear attention)
  layers, one full-attention layer and sparse-MoE feed-forward blocks.  vLLM's CPU gated-delta-net
  op needs linear key/value head dims of 64 and ``--dtype bfloat16``; the model class needs at
  least one MoE layer.  A Mamba state page per layer (float32 SSM state ``2 * 64 * 64 * 4`` bytes
  plus the conv state) fills 35 attention tokens (``2 * 4 kv heads * 64 * 2`` bytes each), so with
  ``--block-size 32`` vLLM raises the attention block to 64 tokens (and logs it); with CPU's
  default of 128 tokens it keeps 128 and pads the Mamba page instead.
* ``qwen3`` -> ``Qwen3ForCausalLM``, dense, for contrast.

The weights come from the transformers model class's own initialiser under ``torch.manual_seed``,
saved in bfloat16 by ``save_pretrained`` (which writes the checkpoint layout vLLM loads, e.g. one
tensor per expert).  The tokenizer is a byte-level BPE trained locally (no hub access) on a small
built-in text, with the ChatML special tokens; the chat template accepts string or list-form
``content``.  Same seed and version -> same files.  Writing takes a few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

GENERATOR_VERSION = 1
ARCHES = ("qwen3next", "qwen3")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BPE_VOCAB_SIZE = 1024
MAX_POSITIONS = 4096

# ChatML. vLLM hands the template list-form content ([{"type": "text", "text": ...}]).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

CORPUS = """\
The router sends each request to the replica that is most likely to answer it quickly.
A gateway keeps a table of backends, their health, their queue depth and their cache state.
When a conversation grows turn by turn, the prefix of the prompt stays the same, so the
server that saw the previous turn can reuse the key and value blocks it already computed.
The scheduler batches prompts, the model runs a forward pass, and tokens stream back.
Hello, how are you today? I am fine, thank you. What is the weather like in the mountains?
It is cold and clear; the snow is deep and the wind is light. Tell me a short story.
Once upon a time a small model answered questions with random words, and everyone laughed.
System: you are a helpful assistant. User: count from one to ten. Assistant: one two three
four five six seven eight nine ten. Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14159.
Metrics such as requests running, requests waiting and cache usage guide the routing policy.
Tokens, prompts, completions, latency, throughput, timeouts, retries and errors are counted.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
def main(): return [x * 2 for x in range(10) if x % 3 == 0]  # code, punctuation, symbols
"""


def _qwen3next_config(vocab_size: int, max_positions: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "partial_rotary_factor": 0.25,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 64,  # the CPU gated-delta-net op needs 64 (32 fails at the first prefill)
        "linear_value_head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],  # every layer MoE: Qwen3NextForCausalLM needs at least one
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "norm_topk_prob": True,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }


def _qwen3_config(vocab_size: int, max_positions: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }


def build_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained on ``CORPUS``; the special tokens get ids 0, 1, 2."""
    from tokenizers import (  # type: ignore[import-not-found]  # the vLLM venv has it
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def _tokenizer_config(max_positions: int) -> dict[str, Any]:
    added = {
        str(i): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, tok in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_positions,
        "split_special_tokens": False,
        "errors": "replace",
        "chat_template": CHAT_TEMPLATE,
    }


def write_model(
    out_dir: Path, arch: str = "qwen3next", seed: int = 0, max_positions: int = MAX_POSITIONS
) -> Path:
    """Write the model directory ``out_dir`` atomically (a temporary sibling, then a rename);
    ``max_positions`` is the window vLLM derives from it (``--max-model-len`` may not exceed it)."""
    import torch  # type: ignore[import-not-found]  # the vLLM venv has it
    import transformers  # type: ignore[import-not-found]

    if arch not in ARCHES:
        raise ValueError(f"unknown arch {arch!r}; choose one of {ARCHES}")
    tokenizer = build_tokenizer()
    vocab_size = tokenizer.get_vocab_size()
    eos_id = tokenizer.token_to_id("<|im_end|>")
    pad_id = tokenizer.token_to_id("<|endoftext|>")
    config_of = _qwen3next_config if arch == "qwen3next" else _qwen3_config
    fields = config_of(vocab_size, max_positions)
    fields.update(bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id)
    config_cls = transformers.Qwen3NextConfig if arch == "qwen3next" else transformers.Qwen3Config
    model_cls = transformers.Qwen3NextForCausalLM if arch == "qwen3next" else transformers.Qwen3ForCausalLM
    config_fields = {k: v for k, v in fields.items() if k not in ("architectures", "model_type")}
    config = config_cls(**config_fields)
    config.architectures = fields["architectures"]

    torch.manual_seed(seed)
    model = model_cls(config).to(torch.bfloat16)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False
    )

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(
            json.dumps(_tokenizer_config(max_positions), indent=2) + "\n"
        )
        special_map = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
        (tmp / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
        (tmp / "generation_config.json").write_text(
            json.dumps({"eos_token_id": eos_id, "pad_token_id": pad_id, "do_sample": False}, indent=2) + "\n"
        )
        meta = {
            "generator_version": GENERATOR_VERSION,
            "arch": arch,
            "seed": seed,
            "max_positions": max_positions,
        }
        (tmp / "turnout_tiny.json").write_text(json.dumps(meta, indent=2) + "\n")
        tmp.chmod(0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--arch", choices=ARCHES, default="qwen3next")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=MAX_POSITIONS)
    args = parser.parse_args(argv)
    print(write_model(args.out_dir, arch=args.arch, seed=args.seed, max_positions=args.max_positions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
