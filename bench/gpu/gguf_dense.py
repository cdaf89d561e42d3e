#!/usr/bin/env python3
"""Write a random-weight dense ``qwen35`` GGUF (Qwen3.5 hybrid: Gated DeltaNet + gated attention) of
the 27B's real shape, in F16, Q8_0 or Q4_0, for the GPU benchmark of issue #63.

The layout is llama.cpp's ``qwen35`` architecture (``src/models/qwen35.cpp``), the same one the tests'
tiny model uses (``tests/real/gguf_qwen35.py``), at the widths of the model vLLM serves in
``bench/gpu/vllm_model.py``:

* ``27b``: 64 layers (48 Gated DeltaNet, 16 full attention), hidden 5120, FFN 17408, attention 24
  query / 4 KV heads of 256 (n_rot 64, IMRoPE sections 11/11/10), linear attention 16 key / 48 value
  heads of 128, conv kernel 4, untied output head, vocabulary padded to 248,320 (vLLM's
  ``vocab_size``) so the embeddings weigh what vLLM's do: F16 is vLLM's bf16 in bytes (~54 GB),
  Q8_0 its fp8 (~29 GB), Q4_0 what a 16 GB pair of cards would hold (~15 GB).
* ``tiny``: the same layout at toy size (4 layers, n_embd 64), vocabulary padded to 152,064, for
  the CPU test that serves it (``tests/real/test_gguf_dense.py``).

Every 2-D matrix (embeddings and output head included) is in the chosen format; vectors and the small
``ssm_conv1d`` / ``ssm_alpha`` / ``ssm_beta`` are F32, as llama-quantize leaves them. Values have RMS
1/sqrt(fan_in) (embeddings 0.5). To write tens of GB in seconds, each tensor's bytes repeat a random
pool of at most 16M values (whole quantisation blocks), one pool per distinct (format, shape): the
engine's speed does not depend on the values, only on their being finite. The file is written
through ``gguf_moe.write_data`` (a shared memory map, several copy threads).

The tokenizer is llama.cpp's ``models/ggml-vocab-qwen2.gguf`` (151,936 tokens); the padding tokens
``<|turnout_pad_N|>`` are of type UNUSED, never produced by the tokenizer.

Usage::

    python bench/gpu/gguf_dense.py OUT.gguf --shape 27b|tiny --format f16|q8_0|q4_0 --llama-tree PATH
        [--seed N] [--ctx N] [--threads N] [--dry-run]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from gguf_moe import _gb, _pad, add_attention_keys, add_ssm_keys, free_bytes, import_gguf, write_data
from gguf_moe_layout import QK4_0, Bytes, f32_random, q4_0_random
from gguf_moe_layout import TensorSpec as MoeTensorSpec

if TYPE_CHECKING:
    import gguf

REPO = Path(__file__).resolve().parents[2]
GENERATOR_VERSION = 1
ARCH = "qwen35"
VOCAB_FILE = Path("models") / "ggml-vocab-qwen2.gguf"
POOL = 1 << 24  # values in one random pool
Q8_0_BLOCK_BYTES = 34  # fp16 scale + 32 int8 codes
Q8_0_CODE_RMS = math.sqrt((256**2 - 1) / 12)  # int8 codes uniform in -128..127
Q4_0_BLOCK_BYTES = 18
Format = Literal["f16", "q8_0", "q4_0", "f32"]
FORMATS: tuple[Format, ...] = ("f16", "q8_0", "q4_0")
FILE_TYPES = {"f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0", "q4_0": "MOSTLY_Q4_0"}


@dataclass(frozen=True)
class DenseDims:
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rope_sections: tuple[int, int, int, int]
    ssm_d_conv: int
    ssm_d_state: int
    ssm_n_group: int
    ssm_dt_rank: int
    n_vocab: int  # the padded vocabulary (at least the tokenizer's)
    full_attention_interval: int = 4
    rope_freq_base: float = 10_000_000.0
    rms_eps: float = 1e-6
    context_length: int = 262_144

    @property
    def ssm_d_inner(self) -> int:
        return self.ssm_d_state * self.ssm_dt_rank


SHAPES: dict[str, DenseDims] = {
    "27b": DenseDims(64, 5120, 17408, 24, 4, 256, 64, (11, 11, 10, 0), 4, 128, 16, 48, 248_320),
    "tiny": DenseDims(4, 64, 128, 4, 2, 32, 16, (3, 3, 2, 0), 4, 16, 2, 4, 152_064, context_length=4096),
}


@dataclass(frozen=True)
class Spec:
    """One tensor; ``ne`` in ggml's order (ne0, the input dimension, first)."""

    name: str
    ne: tuple[int, ...]
    fmt: Format
    init: str  # linear, embed, norm, conv, dt_bias, ssm_a

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def nbytes(self) -> int:
        n = self.n_elements
        return {
            "f16": 2 * n,
            "f32": 4 * n,
            "q8_0": n // 32 * Q8_0_BLOCK_BYTES,
            "q4_0": n // 32 * Q4_0_BLOCK_BYTES,
        }[self.fmt]


def is_recurrent(il: int, d: DenseDims) -> bool:
    return (il + 1) % d.full_attention_interval != 0


def build_specs(d: DenseDims, fmt: Format) -> list[Spec]:
    """Every tensor ``qwen35.cpp`` loads (untied head, no MTP layers), in file order."""
    m, f32 = fmt, "f32"
    out = [
        Spec("token_embd.weight", (d.n_embd, d.n_vocab), m, "embed"),
        Spec("output_norm.weight", (d.n_embd,), f32, "norm"),
        Spec("output.weight", (d.n_embd, d.n_vocab), m, "linear"),
    ]
    key_dim, value_dim = d.ssm_d_state * d.ssm_n_group, d.ssm_d_inner
    conv_dim, q_dim, kv_dim = 2 * key_dim + value_dim, d.head_dim * d.n_head, d.head_dim * d.n_head_kv
    for il in range(d.n_layer):
        b = f"blk.{il}"
        out += [Spec(f"{b}.attn_norm.weight", (d.n_embd,), f32, "norm")]
        out += [Spec(f"{b}.post_attention_norm.weight", (d.n_embd,), f32, "norm")]
        if is_recurrent(il, d):
            out += [
                Spec(f"{b}.attn_qkv.weight", (d.n_embd, conv_dim), m, "linear"),
                Spec(f"{b}.attn_gate.weight", (d.n_embd, value_dim), m, "linear"),
                Spec(f"{b}.ssm_conv1d.weight", (d.ssm_d_conv, conv_dim), f32, "conv"),
                Spec(f"{b}.ssm_dt.bias", (d.ssm_dt_rank,), f32, "dt_bias"),
                Spec(f"{b}.ssm_a", (d.ssm_dt_rank,), f32, "ssm_a"),
                Spec(f"{b}.ssm_beta.weight", (d.n_embd, d.ssm_dt_rank), f32, "linear"),
                Spec(f"{b}.ssm_alpha.weight", (d.n_embd, d.ssm_dt_rank), f32, "linear"),
                Spec(f"{b}.ssm_norm.weight", (d.ssm_d_state,), f32, "norm"),
                Spec(f"{b}.ssm_out.weight", (value_dim, d.n_embd), m, "linear"),
            ]
        else:
            out += [
                Spec(f"{b}.attn_q.weight", (d.n_embd, 2 * q_dim), m, "linear"),  # query + gate
                Spec(f"{b}.attn_k.weight", (d.n_embd, kv_dim), m, "linear"),
                Spec(f"{b}.attn_v.weight", (d.n_embd, kv_dim), m, "linear"),
                Spec(f"{b}.attn_output.weight", (q_dim, d.n_embd), m, "linear"),
                Spec(f"{b}.attn_q_norm.weight", (d.head_dim,), f32, "norm"),
                Spec(f"{b}.attn_k_norm.weight", (d.head_dim,), f32, "norm"),
            ]
        out += [
            Spec(f"{b}.ffn_gate.weight", (d.n_embd, d.n_ff), m, "linear"),
            Spec(f"{b}.ffn_up.weight", (d.n_embd, d.n_ff), m, "linear"),
            Spec(f"{b}.ffn_down.weight", (d.n_ff, d.n_embd), m, "linear"),
        ]
    return out


def make_buffer(rng: np.random.Generator, spec: Spec) -> Bytes:
    """``spec``'s bytes: a random pool of whole blocks, repeated to the tensor's size."""
    if spec.fmt == "f32":
        return f32_random(rng, MoeTensorSpec(spec.name, spec.ne, "f32", spec.init))  # type: ignore[arg-type]
    rms = 0.5 if spec.init == "embed" else 1.0 / math.sqrt(spec.ne[0])
    n = spec.n_elements
    pool_n = min(n, POOL)
    if spec.fmt == "f16":
        pool = (rng.standard_normal(pool_n) * rms).astype("<f2").view(np.uint8)
    elif spec.fmt == "q4_0":
        pool = q4_0_random(rng, pool_n, rms)
    else:
        blocks = pool_n // 32
        pool = np.empty((blocks, Q8_0_BLOCK_BYTES), dtype=np.uint8)
        scale = rng.uniform(0.75, 1.25, blocks) * rms / Q8_0_CODE_RMS
        scale[rng.random(blocks) < 0.5] *= -1.0
        pool[:, :2] = scale.astype("<f2").view(np.uint8).reshape(blocks, 2)
        pool[:, 2:] = np.frombuffer(rng.bytes(blocks * 32), dtype=np.uint8).reshape(blocks, 32)
        pool = pool.reshape(-1)
    data = np.resize(pool, spec.nbytes)
    assert data.nbytes == spec.nbytes
    return data


def copy_padded_tokenizer(writer: gguf.GGUFWriter, vocab_path: Path, n_vocab: int) -> int:
    """Copy every ``tokenizer.ggml.*`` key, padding the per-token arrays to ``n_vocab`` with UNUSED
    ``<|turnout_pad_N|>`` tokens; return the tokenizer's own size."""
    import gguf

    sys.path.insert(0, str(REPO))
    from tests.real.gguf_qwen35 import read_gguf_metadata

    keys = read_gguf_metadata(vocab_path)
    own = next(len(v) for k, v, _, _ in keys if k == gguf.Keys.Tokenizer.LIST)
    if n_vocab < own:
        raise ValueError(f"n_vocab {n_vocab} is below the tokenizer's {own}")
    pad = n_vocab - own
    extra: dict[str, list[object]] = {
        gguf.Keys.Tokenizer.LIST: [f"<|turnout_pad_{i}|>" for i in range(pad)],
        gguf.Keys.Tokenizer.TOKEN_TYPE: [int(gguf.TokenType.UNUSED)] * pad,
        gguf.Keys.Tokenizer.SCORES: [0.0] * pad,
    }
    for key, value, vtype, sub in keys:
        if not key.startswith("tokenizer.ggml."):
            continue
        if key in extra and isinstance(value, list) and len(value) == own:
            value = value + extra[key]
        writer.add_key_value(key, value, vtype, sub)
    return own


def write_dense_gguf(
    path: Path,
    *,
    dims: DenseDims,
    shape: str,
    fmt: Format,
    llama_tree: Path,
    seed: int = 0,
    threads: int = 8,
    dry_run: bool = False,
) -> int:
    """Write the model to ``path`` (atomically, via ``path.tmp``); return its tensor bytes."""
    import gguf
    from gguf_moe import CHAT_TEMPLATE

    started = time.monotonic()
    name = f"turnout-random-qwen35-{shape}-{fmt}-seed{seed}"
    writer = gguf.GGUFWriter(None, ARCH)
    d = dims
    writer.add_name(name)
    writer.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES[fmt]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_attention_keys(writer, d, d.n_ff)
    add_ssm_keys(writer, d)
    own = copy_padded_tokenizer(writer, llama_tree / VOCAB_FILE, d.n_vocab)
    writer.add_chat_template(CHAT_TEMPLATE)

    specs = build_specs(d, fmt)
    raw = {"f16": None, "q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
    for spec in specs:
        shape_np = list(reversed(spec.ne))
        if spec.fmt in ("q8_0", "q4_0"):
            shape_np[-1] = spec.nbytes // math.prod(shape_np[:-1])
            writer.add_tensor_info(
                spec.name, shape_np, np.dtype(np.uint8), spec.nbytes, raw_dtype=raw[spec.fmt]
            )
        else:
            dtype = np.dtype(np.float16 if spec.fmt == "f16" else np.float32)
            writer.add_tensor_info(spec.name, shape_np, dtype, spec.nbytes)
    data_bytes = sum(s.nbytes for s in specs)
    params = sum(s.n_elements for s in specs)
    n_attn = sum(not is_recurrent(il, d) for il in range(d.n_layer))
    print(f"{name} ({ARCH}, generator v{GENERATOR_VERSION})")
    print(
        f"  layers {d.n_layer} ({d.n_layer - n_attn} Gated DeltaNet + {n_attn} attention), "
        f"n_embd {d.n_embd}, ffn {d.n_ff}, attention {d.n_head}/{d.n_head_kv} x {d.head_dim}, "
        f"linear attention {d.ssm_n_group}/{d.ssm_dt_rank} x {d.ssm_d_state}, "
        f"vocab {d.n_vocab} ({own} + padding)"
    )
    print(
        f"  params {params / 1e9:.2f} B; tensor data {_gb(data_bytes)} ({data_bytes / 2**30:.2f} GiB), {fmt}"
    )
    if dry_run:
        return data_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    if free_bytes(path.parent) < data_bytes:
        raise OSError(
            f"{path.parent} has {_gb(free_bytes(path.parent))} free, the model needs {_gb(data_bytes)}"
        )
    tmp = path.with_name(path.name + ".tmp")
    writer.write_header_to_file(tmp)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    assert writer.fout is not None
    assert len(writer.fout) == 1
    fout = writer.fout[0]
    writer.write_padding(fout, fout.tell())
    data_start = fout.tell()
    writer.close()
    offsets, end = [], data_start
    for spec in specs:
        offsets.append(end)
        end += _pad(spec.nbytes, writer.data_alignment)

    rng = np.random.default_rng(seed)
    buffers: dict[tuple[str, str, tuple[int, ...]], Bytes] = {}
    gen = time.monotonic()
    for spec in specs:
        key = (spec.fmt, spec.init, spec.ne)
        if key not in buffers:
            buffers[key] = make_buffer(rng, spec)
    print(f"  random buffers: {len(buffers)} in {time.monotonic() - gen:.1f} s")
    jobs = ((o, buffers[(s.fmt, s.init, s.ne)]) for o, s in zip(offsets, specs, strict=True))
    write_data(tmp, data_start, end, jobs, threads)
    tmp.replace(path)
    print(f"{path}: {_gb(path.stat().st_size)} in {time.monotonic() - started:.1f} s")
    return data_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--format", choices=FORMATS, required=True)
    parser.add_argument("--llama-tree", type=Path, required=True, help="llama.cpp source tree")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ctx", type=int, default=None, help="context_length (training context)")
    parser.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1), help="copy threads")
    parser.add_argument("--dry-run", action="store_true", help="print the summary, write nothing")
    args = parser.parse_args(argv)
    dims = SHAPES[args.shape]
    if args.ctx is not None:
        dims = DenseDims(**{**dims.__dict__, "context_length": args.ctx})
    for width in (dims.n_embd, dims.n_ff, dims.head_dim * dims.n_head, dims.ssm_d_inner):
        if width % QK4_0:
            raise SystemExit(f"width {width} is not a multiple of the 32-value block")
    tree = args.llama_tree.expanduser().resolve()
    import_gguf(tree)
    write_dense_gguf(
        args.out,
        dims=dims,
        shape=args.shape,
        fmt=args.format,
        llama_tree=tree,
        seed=args.seed,
        threads=max(1, args.threads),
        dry_run=args.dry_run,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
