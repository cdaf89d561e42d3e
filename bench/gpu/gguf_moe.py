#!/usr/bin/env python3
"""Write a random-weight ``qwen35moe`` GGUF (Qwen3.5 / Qwen3-Next hybrid MoE) for GPU benchmarks.

The layout is llama.cpp's ``qwen35moe`` architecture (``src/models/qwen35moe.cpp``): Gated
DeltaNet linear-attention layers and, every ``full_attention_interval``-th layer, a gated
full-attention layer with partial IMRoPE; every layer has a routed MoE FFN (softmax router,
top-k, weights renormalised) plus a sigmoid-gated shared expert.  The weights are random and the
output is gibberish, but the engine runs the real code paths: expert routing, recurrent state,
KV cache, context checkpoints.

Shapes:

* ``full``: Qwen3-Next-80B-A3B-like.  48 layers, n_embd 2048, 512 experts (10 used) of ff 512,
  a shared expert of ff 512, 16 query / 2 KV heads of 256, n_rot 64, linear attention with 16
  key heads and 32 value heads of 128.  The 2-D and 3-D matrices are Q4_0, about 80 B
  parameters and 45 GB on disk.
* ``tiny``: the same layout at toy size (4 layers, n_embd 64, 8 experts, 2 used) for CPU tests.

Speed: the tensor infos are declared with ``GGUFWriter.add_tensor_info`` (no data), the writer
writes header, key/values and tensor infos, and then the tensor data is copied into the file
through a shared memory map by a pool of threads (numpy copies release the GIL; ``pwrite`` into
one tmpfs file would serialise on the inode lock).  One random buffer is generated per distinct
(shape, initialisation) and reused for every tensor of that shape, so generation costs ~1 GB of
random bytes for the full shape and the rest is memory bandwidth.  Measured on a 16-core H200
host into /dev/shm: the full shape in 16-17 s (random buffers ~5 s, 45 GB of data in ~11 s at
~4 GB/s with the default 8 threads; 4 threads ~3 GB/s, 1 thread ~1 GB/s, 16 threads no faster).

Q4_0 blocks: 32 weights as 4-bit codes q in 0..15 plus one fp16 scale d, value ``d * (q - 8)``
(18 bytes per block).  The codes are random bytes; d has a random sign (so the -0.5 mean of
``q - 8`` cancels) and a magnitude chosen so a matrix has RMS ~ 1/sqrt(fan_in): about 0.005 for
fan-in 2048 and 0.01 for 512.  Activations keep unit scale through every projection.

Alignment (GGUF v3): every tensor's offset, relative to the start of the data section, is a
multiple of ``general.alignment`` (32 when the key is absent, as here), and the data section
itself starts at the next multiple of the alignment after the tensor infos.  ``GGUFWriter``
writes the offsets (each tensor's size padded up to the alignment) and the padding before the
data section; this script places each tensor at the same offsets and pre-sizes the file, so the
padding bytes are zeros.

Only numpy and llama.cpp's ``gguf-py`` are needed: ``--llama-tree`` is a llama.cpp source tree,
whose ``gguf-py`` goes on ``sys.path`` and whose ``models/ggml-vocab-qwen2.gguf`` provides the
tokenizer (every ``tokenizer.ggml.*`` key is copied; the chat template is plain ChatML).

Usage::

    python bench/gpu/gguf_moe.py OUT.gguf --shape full|tiny --llama-tree PATH
        [--seed N] [--ctx N] [--layers N] [--threads N] [--dry-run]
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf_moe_layout import (
    Q4_0_BLOCK_BYTES,
    QK4_0,
    SHAPES,
    Bytes,
    DType,
    Init,
    MoeDims,
    Summary,
    TensorSpec,
    build_specs,
    is_recurrent,
    make_buffer,
    summarize,
)

REPO = Path(__file__).resolve().parents[2]

if TYPE_CHECKING:
    import gguf

# Bump when the generated file changes for the same arguments.
GENERATOR_VERSION = 1

ARCH = "qwen35moe"
VOCAB_FILE = Path("models") / "ggml-vocab-qwen2.gguf"

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


# -- tokenizer copy ------------------------------------------------------------------------------


def copy_tokenizer(writer: gguf.GGUFWriter, vocab_path: Path) -> int:
    """Copy every ``tokenizer.ggml.*`` key; return the vocabulary size: the tests' tiny-model
    generator's (``tests/real/gguf_qwen35.py``), one reader for both. Imported here, once ``gguf`` is
    importable (``import_gguf``)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.real.gguf_qwen35 import copy_tokenizer as copy

    return copy(writer, vocab_path)


# -- writing -------------------------------------------------------------------------------------


def add_attention_keys(writer: gguf.GGUFWriter, d: Any, n_ff: int) -> None:
    """The Qwen3.5 hybrid's size, attention and RoPE keys, for the dense writer (``gguf_dense.py``)
    too: ``d`` is a ``MoeDims`` or a ``DenseDims`` (the same field names)."""
    writer.add_context_length(d.context_length)
    writer.add_embedding_length(d.n_embd)
    writer.add_block_count(d.n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(d.n_head)
    writer.add_head_count_kv(d.n_head_kv)
    writer.add_key_length(d.head_dim)
    writer.add_value_length(d.head_dim)
    writer.add_rope_dimension_count(d.n_rot)
    writer.add_rope_dimension_sections(list(d.rope_sections))
    writer.add_rope_freq_base(d.rope_freq_base)
    writer.add_layer_norm_rms_eps(d.rms_eps)


def add_ssm_keys(writer: gguf.GGUFWriter, d: Any) -> None:
    """The Gated DeltaNet keys and the full-attention interval (``d`` as in ``add_attention_keys``)."""
    writer.add_ssm_conv_kernel(d.ssm_d_conv)
    writer.add_ssm_inner_size(d.ssm_d_inner)
    writer.add_ssm_state_size(d.ssm_d_state)
    writer.add_ssm_time_step_rank(d.ssm_dt_rank)
    writer.add_ssm_group_count(d.ssm_n_group)
    writer.add_full_attention_interval(d.full_attention_interval)


def add_metadata(writer: gguf.GGUFWriter, dims: MoeDims, name: str) -> None:
    import gguf

    d = dims
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # n_ff: only a fallback for the expert sizes in the loader; written so it is not reported as 0
    add_attention_keys(writer, d, d.n_ff_exp)
    writer.add_expert_count(d.n_expert)
    writer.add_expert_used_count(d.n_expert_used)
    writer.add_expert_feed_forward_length(d.n_ff_exp)
    writer.add_expert_shared_feed_forward_length(d.n_ff_shexp)
    add_ssm_keys(writer, d)


def declare_tensors(writer: gguf.GGUFWriter, specs: list[TensorSpec]) -> None:
    """Tensor infos only (no data).  ``add_tensor_info`` takes the numpy-order shape (ggml's ne
    reversed); for a quantised type given as uint8 the last dimension is in bytes."""
    import gguf

    for spec in specs:
        shape = list(reversed(spec.ne))
        if spec.dtype == "q4_0":
            shape[-1] = shape[-1] // QK4_0 * Q4_0_BLOCK_BYTES
            writer.add_tensor_info(
                spec.name, shape, np.dtype(np.uint8), spec.nbytes, raw_dtype=gguf.GGMLQuantizationType.Q4_0
            )
        else:
            writer.add_tensor_info(spec.name, shape, np.dtype(np.float32), spec.nbytes)


def _pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 10**9 else f"{n / 1e6:.2f} M"


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _copy_into(dest: Bytes, offset: int, data: Bytes, chunk: int = 64 << 20) -> int:
    """Copy ``data`` into ``dest[offset:]`` (numpy releases the GIL for the copies)."""
    for start in range(0, data.nbytes, chunk):
        stop = min(start + chunk, data.nbytes)
        np.copyto(dest[offset + start : offset + stop], data[start:stop])
    return data.nbytes


def write_data(
    path: Path, data_start: int, file_size: int, jobs: Iterator[tuple[int, Bytes]], threads: int
) -> None:
    """Size the file to ``file_size`` and copy each (offset, bytes) job into it through a shared
    memory map, ``threads`` copies at a time, printing progress."""
    total = file_size - data_start
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, file_size)
        with mmap.mmap(fd, file_size, access=mmap.ACCESS_WRITE) as mm:
            dest = np.frombuffer(mm, dtype=np.uint8)
            done = 0
            started = time.monotonic()
            next_report = started + 2.0
            try:
                with ThreadPoolExecutor(max_workers=threads) as pool:
                    pending: set[Future[int]] = set()
                    for offset, data in jobs:
                        pending.add(pool.submit(_copy_into, dest, offset, data))
                        while len(pending) >= 2 * threads:
                            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                            done += sum(f.result() for f in finished)
                            now = time.monotonic()
                            if now >= next_report:
                                next_report = now + 2.0
                                rate = done / max(now - started, 1e-9)
                                print(
                                    f"  {_gb(done)} / {_gb(total)} ({100 * done / total:.0f}%), "
                                    f"{rate / 1e9:.2f} GB/s",
                                    flush=True,
                                )
                    for future in pending:
                        done += future.result()
            finally:
                del dest  # the map cannot close while a numpy view of it exists
        elapsed = time.monotonic() - started
        print(f"  data: {_gb(done)} in {elapsed:.1f} s ({done / max(elapsed, 1e-9) / 1e9:.2f} GB/s)")
    finally:
        os.close(fd)


def write_moe_gguf(
    path: Path,
    *,
    dims: MoeDims,
    shape_name: str,
    llama_tree: Path,
    seed: int = 0,
    threads: int = 8,
    dry_run: bool = False,
) -> Summary:
    """Write the model to ``path`` (atomically, via ``path.tmp``), or with ``dry_run`` only print
    what would be written.  ``gguf`` must be importable (see ``import_gguf``)."""
    import gguf

    dims.check()
    vocab_path = llama_tree / VOCAB_FILE
    name = f"turnout-random-qwen35moe-{shape_name}-seed{seed}"
    started = time.monotonic()

    writer = gguf.GGUFWriter(None, ARCH)
    add_metadata(writer, dims, name)
    n_vocab = copy_tokenizer(writer, vocab_path)
    writer.add_chat_template(CHAT_TEMPLATE)
    specs = build_specs(dims, n_vocab)
    declare_tensors(writer, specs)

    summary = summarize(specs, dims)
    total, _shared, per_expert, n_expert = writer.get_total_parameter_count()
    if total != summary.params or n_expert != dims.n_expert or per_expert * n_expert != summary.expert_params:
        raise AssertionError(f"parameter counts disagree with gguf-py: {writer.get_total_parameter_count()}")
    print_summary(name, dims, n_vocab, summary, writer.data_alignment)
    if dry_run:
        return summary

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    free = free_bytes(path.parent)
    if free < summary.data_bytes:
        raise OSError(f"{path.parent} has {_gb(free)} free, the model needs {_gb(summary.data_bytes)}")

    # header, key/values, tensor infos (with each offset padded to the alignment), then the
    # padding up to the data section, which starts at a multiple of the alignment
    writer.write_header_to_file(tmp)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    assert writer.fout is not None
    assert len(writer.fout) == 1
    fout = writer.fout[0]
    writer.write_padding(fout, fout.tell())
    data_start = fout.tell()
    writer.close()
    alignment = writer.data_alignment
    assert data_start % alignment == 0
    offsets: list[int] = []
    end = data_start
    for spec in specs:
        offsets.append(end)
        end += _pad(spec.nbytes, alignment)
    print(f"  header + metadata: {data_start / 1e6:.1f} MB ({time.monotonic() - started:.1f} s)")

    rng = np.random.default_rng(seed)
    buffers: dict[tuple[DType, Init, tuple[int, ...]], Bytes] = {}
    gen_started = time.monotonic()
    for spec in specs:
        if spec.data_key not in buffers:
            buffers[spec.data_key] = make_buffer(rng, spec)
    print(
        f"  random buffers: {len(buffers)} ({_gb(summary.buffer_bytes)}) in "
        f"{time.monotonic() - gen_started:.1f} s"
    )

    write_data(
        tmp,
        data_start,
        end,
        ((offset, buffers[spec.data_key]) for offset, spec in zip(offsets, specs, strict=True)),
        threads,
    )
    tmp.replace(path)
    print(f"{path}: {_gb(path.stat().st_size)} in {time.monotonic() - started:.1f} s")
    return summary


def free_bytes(directory: Path) -> int:
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def print_summary(name: str, dims: MoeDims, n_vocab: int, s: Summary, alignment: int) -> None:
    d = dims
    n_attn = sum(not is_recurrent(il, d) for il in range(d.n_layer))
    print(f"{name} ({ARCH}, generator v{GENERATOR_VERSION})")
    print(
        f"  layers {d.n_layer} ({d.n_layer - n_attn} Gated DeltaNet + {n_attn} full attention), "
        f"n_embd {d.n_embd}, vocab {n_vocab}, ctx {d.context_length}"
    )
    print(
        f"  experts {d.n_expert} ({d.n_expert_used} used) of ff {d.n_ff_exp}, shared expert ff "
        f"{d.n_ff_shexp}; attention {d.n_head} q / {d.n_head_kv} kv heads x {d.head_dim}, n_rot "
        f"{d.n_rot} {list(d.rope_sections)}; linear attention {d.ssm_n_group} k / {d.ssm_dt_rank} v "
        f"heads x {d.ssm_d_state}, conv {d.ssm_d_conv}"
    )
    print(
        f"  tensors {s.n_tensors} ({s.n_q4_0} Q4_0, {s.n_f32} F32), {s.n_buffers} distinct random "
        f"buffers ({_gb(s.buffer_bytes)}), alignment {alignment}"
    )
    print(f"  tensor data {s.data_bytes / 1e9:.3f} GB ({s.data_bytes / 2**30:.3f} GiB)")
    print(
        f"  params {_count(s.params)} (experts {_count(s.expert_params)}, embeddings "
        f"{_count(s.embedding_params)}); active per token {_count(s.active_params)} "
        f"({_count(s.active_params - s.embedding_params)} without embeddings)"
    )


def import_gguf(llama_tree: Path) -> None:
    """Put ``<llama_tree>/gguf-py`` first on ``sys.path`` (checked, so a wrong tree fails early)."""
    gguf_py = llama_tree / "gguf-py"
    if not (gguf_py / "gguf" / "gguf_writer.py").is_file():
        raise SystemExit(f"{llama_tree} is not a llama.cpp tree: no gguf-py/gguf/gguf_writer.py")
    if not (llama_tree / VOCAB_FILE).is_file():
        raise SystemExit(f"{llama_tree} has no {VOCAB_FILE}")
    sys.path.insert(0, str(gguf_py))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--llama-tree", type=Path, required=True, help="llama.cpp source tree")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ctx", type=int, default=None, help="context_length (training context)")
    parser.add_argument("--layers", type=int, default=None, help="override the shape's layer count")
    parser.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1), help="copy threads")
    parser.add_argument("--dry-run", action="store_true", help="print the summary, write nothing")
    args = parser.parse_args(argv)

    dims = SHAPES[args.shape]
    if args.ctx is not None:
        dims = replace(dims, context_length=args.ctx)
    if args.layers is not None:
        dims = replace(dims, n_layer=args.layers)
    import_gguf(args.llama_tree.expanduser().resolve())
    write_moe_gguf(
        args.out,
        dims=dims,
        shape_name=args.shape,
        llama_tree=args.llama_tree.expanduser().resolve(),
        seed=args.seed,
        threads=max(1, args.threads),
        dry_run=args.dry_run,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
