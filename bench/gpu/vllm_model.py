"""Write a model folder of the real Qwen3.5-27B shape for vLLM 0.25 (issue #63), on the device machine.

    python3 bench/gpu/vllm_model.py /dev/shm/q27                # config + tokenizer: --load-format dummy
    python3 bench/gpu/vllm_model.py /dev/shm/q27 --weights      # + random bf16 safetensors (~54 GB)

After ``../shared/gpu/make_27b_shape_model.py`` (the recipe that served vLLM 0.25 here), with two changes:

* the tokenizer's ids 1000.. are the words of ``turnout calibrate``'s word list, so that its prompts
  (``/tokenize`` of those words, then sampled) draw on many ids; with every word unknown they would all
  be one id, and every "fresh" prompt would be a cached one;
* ``--weights`` writes random weights under the checkpoint's own names, so that a level-2 sleep can be
  woken with ``reload_weights`` (the dummy loader cannot reload: "Model reloading with 'dummy' format").
  The names and shapes are those of transformers' ``Qwen3_5ForConditionalGeneration`` built on the meta
  device from the same config, the vision tower left out (``--language-model-only`` builds none). Values
  are uniform in [-1e-3, 1e-3], as vLLM's dummy loader draws them, generated on the GPU.
"""

from __future__ import annotations

import argparse
import ast
import json
import time
from pathlib import Path
from typing import Any

V = 248_320
SPECIAL = {248044: "<|endoftext|>", 248045: "<|im_start|>", 248046: "<|im_end|>"}
WORD_BASE = 1000
SHARD_BYTES = 4 << 30

TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "architectures": ["Qwen3_5ForCausalLM"],
    "hidden_size": 5120,
    "num_hidden_layers": 64,
    "intermediate_size": 17408,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
    "vocab_size": V,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attn_output_gate": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "partial_rotary_factor": 0.25,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
    "tie_word_embeddings": False,
    "mamba_ssm_dtype": "float32",
    "dtype": "bfloat16",
    "use_cache": True,
    "eos_token_id": 248044,
}
VISION_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5",
    "depth": 27,
    "hidden_size": 1152,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 5120,
    "num_position_embeddings": 2304,
    "initializer_range": 0.02,
    "deepstack_visual_indexes": [],
}
CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "text_config": TEXT_CONFIG,
    "vision_config": VISION_CONFIG,
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


def calibrate_words() -> list[str]:
    """``backends.calibrate.engines.WORDS``, read from its source (the device lacks turnout's imports)."""
    source = (Path(__file__).resolve().parents[2] / "backends" / "calibrate" / "engines.py").read_text()
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "WORDS" for t in node.targets):
            return str(ast.literal_eval(node.value)).split()
    raise SystemExit("WORDS not found in backends/calibrate/engines.py")


def vocabulary() -> dict[str, int]:
    """``t0`` .. ``t248319``, the Qwen special ids by their names, calibrate's words at 1000.."""
    words = dict.fromkeys(calibrate_words())  # in order, once each
    vocab = {SPECIAL.get(i, f"t{i}"): i for i in range(V)}
    for offset, word in enumerate(words):
        del vocab[f"t{WORD_BASE + offset}"]
        vocab[word] = WORD_BASE + offset
    assert len(vocab) == V
    return vocab


def write_folder(out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(CONFIG, indent=1))
    tok = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL.values()])
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": "t0",
        "model_max_length": 262144,
        "chat_template": TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))


def weight_shapes(out: Path) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensor names and shapes, from transformers' model on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(out)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    return {
        name: tuple(tensor.shape)
        for name, tensor in model.state_dict().items()
        if ".visual." not in name and not name.startswith("visual.")
    }


def write_weights(out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    started = time.monotonic()
    shapes = weight_shapes(out)
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = 2 * int(torch.tensor(shape).prod().item()) if shape else 2
        if size and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    weight_map: dict[str, str] = {}
    total = 0
    for index, names in enumerate(shards):
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {
            name: torch.empty(shapes[name], dtype=torch.bfloat16, device="cuda").uniform_(-1e-3, 1e-3).cpu()
            for name in names
        }
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        weight_map.update(dict.fromkeys(names, file))
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index_file, indent=1))
    print(
        f"weights: {len(shapes)} tensors, {total / 1e9:.1f} GB in {len(shards)} shards, "
        f"{time.monotonic() - started:.0f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path)
    parser.add_argument("--weights", action="store_true", help="write random safetensors too (~54 GB)")
    args = parser.parse_args()
    write_folder(args.out)
    if args.weights:
        write_weights(args.out)
    print("wrote", args.out, sorted(p.name for p in args.out.iterdir())[:6], "...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
