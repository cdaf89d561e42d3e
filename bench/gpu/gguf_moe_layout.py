"""The random-weight ``qwen35moe`` model's layout and data for ``bench/gpu/gguf_moe.py``, with numpy
only (no ``gguf``): the hyperparameters (``MoeDims``) and the named shapes (``SHAPES``), every tensor
the loader requires in file order (``TensorSpec``, ``build_specs``), the parameter and size counts
(``Summary``, ``summarize``), and each tensor's random bytes (``make_buffer``: Q4_0 blocks or F32
values, scaled as the script's docstring says).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

QK4_0 = 32  # weights per Q4_0 block
Q4_0_BLOCK_BYTES = 18  # fp16 scale + 16 bytes of 4-bit codes
# RMS of (q - 8) for q uniform in 0..15: sqrt(mean of squares of -8..7) = sqrt(21.5)
Q4_0_CODE_RMS = math.sqrt(21.5)


@dataclass(frozen=True)
class MoeDims:
    """Hyperparameters.  The constraints come from the qwen35moe loader and graph."""

    n_layer: int
    n_embd: int
    # gated full attention: the Q projection carries query + gate (2 * head_dim * n_head)
    n_head: int
    n_head_kv: int
    head_dim: int  # key_length == value_length (the graph asserts it)
    n_rot: int  # partial rotary
    rope_sections: tuple[int, int, int, int]  # IMRoPE, sums to n_rot / 2
    # routed experts + one shared expert
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    # Gated DeltaNet: head_k_dim == head_v_dim == ssm_d_state, n_k_heads == ssm_n_group,
    # n_v_heads == ssm_dt_rank, ssm_d_inner == head_v_dim * n_v_heads.
    ssm_d_conv: int
    ssm_d_state: int
    ssm_n_group: int
    ssm_dt_rank: int
    full_attention_interval: int = 4
    rope_freq_base: float = 10_000_000.0
    rms_eps: float = 1e-6
    context_length: int = 4096

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
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError("need 0 < n_expert_used <= n_expert")
        if self.n_layer < 1:
            raise ValueError("n_layer must be >= 1")
        # Q4_0 blocks run along ne0 (the input dimension) of every quantised matrix
        for name, value in (
            ("n_embd", self.n_embd),
            ("n_ff_exp", self.n_ff_exp),
            ("n_ff_shexp", self.n_ff_shexp),
            ("head_dim * n_head", self.head_dim * self.n_head),
            ("ssm_d_inner", self.ssm_d_inner),
        ):
            if value % QK4_0:
                raise ValueError(f"{name} = {value} must be a multiple of {QK4_0} (Q4_0 block)")


SHAPES: dict[str, MoeDims] = {
    # Qwen3-Next-80B-A3B (config.json): hidden 2048, 48 layers, 512 experts / 10 per token,
    # moe_intermediate 512, shared expert 512, 16 x 256 query heads, 2 KV heads, partial rotary
    # 0.25 (n_rot 64), linear attention 16 key heads / 32 value heads of 128, conv kernel 4.
    "full": MoeDims(
        n_layer=48,
        n_embd=2048,
        n_head=16,
        n_head_kv=2,
        head_dim=256,
        n_rot=64,
        rope_sections=(11, 11, 10, 0),
        n_expert=512,
        n_expert_used=10,
        n_ff_exp=512,
        n_ff_shexp=512,
        ssm_d_conv=4,
        ssm_d_state=128,
        ssm_n_group=16,
        ssm_dt_rank=32,
        context_length=262_144,
    ),
    "tiny": MoeDims(
        n_layer=4,
        n_embd=64,
        n_head=4,
        n_head_kv=2,
        head_dim=32,
        n_rot=16,
        rope_sections=(3, 3, 2, 0),
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=64,
        n_ff_shexp=64,
        ssm_d_conv=4,
        ssm_d_state=16,
        ssm_n_group=2,
        ssm_dt_rank=4,
        context_length=4096,
    ),
}

Init = Literal["linear", "embed", "norm", "conv", "dt_bias", "ssm_a"]
DType = Literal["q4_0", "f32"]
Bytes = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class TensorSpec:
    """One tensor.  ``ne`` is ggml's order (ne0 first: the input dimension of a matrix)."""

    name: str
    ne: tuple[int, ...]
    dtype: DType
    init: Init
    expert: bool = False  # routed-expert tensor: ne[-1] is the expert dimension

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def nbytes(self) -> int:
        if self.dtype == "q4_0":
            return self.n_elements // QK4_0 * Q4_0_BLOCK_BYTES
        return self.n_elements * 4

    @property
    def data_key(self) -> tuple[DType, Init, tuple[int, ...]]:
        """Tensors with the same key share one random buffer."""
        return (self.dtype, self.init, self.ne)


def is_recurrent(il: int, dims: MoeDims) -> bool:
    # The loader's rule when no recurrent_layers array is given (qwen35moe.cpp load_arch_hparams).
    return (il + 1) % dims.full_attention_interval != 0


def build_specs(dims: MoeDims, n_vocab: int) -> list[TensorSpec]:
    """Every tensor ``llama_model_qwen35moe::load_arch_tensors`` requires (no MTP layers), in file
    order.  Matrices are Q4_0 except the router (``ffn_gate_inp``, kept F32 as llama-quantize
    does) and the small ``ssm_alpha`` / ``ssm_beta`` / ``ssm_conv1d``; vectors are F32."""
    d = dims
    q4: DType = "q4_0"
    f32: DType = "f32"
    out = [
        TensorSpec("token_embd.weight", (d.n_embd, n_vocab), q4, "embed"),
        TensorSpec("output_norm.weight", (d.n_embd,), f32, "norm"),
        # untied head, as in Qwen3-Next
        TensorSpec("output.weight", (d.n_embd, n_vocab), q4, "linear"),
    ]
    key_dim = d.ssm_d_state * d.ssm_n_group
    value_dim = d.ssm_d_inner
    conv_dim = 2 * key_dim + value_dim
    q_dim = d.head_dim * d.n_head
    kv_dim = d.head_dim * d.n_head_kv
    for il in range(d.n_layer):
        blk = f"blk.{il}"
        out.append(TensorSpec(f"{blk}.attn_norm.weight", (d.n_embd,), f32, "norm"))
        out.append(TensorSpec(f"{blk}.post_attention_norm.weight", (d.n_embd,), f32, "norm"))
        if is_recurrent(il, d):
            out += [
                TensorSpec(f"{blk}.attn_qkv.weight", (d.n_embd, conv_dim), q4, "linear"),
                TensorSpec(f"{blk}.attn_gate.weight", (d.n_embd, value_dim), q4, "linear"),
                TensorSpec(f"{blk}.ssm_conv1d.weight", (d.ssm_d_conv, conv_dim), f32, "conv"),
                TensorSpec(f"{blk}.ssm_dt.bias", (d.ssm_dt_rank,), f32, "dt_bias"),
                TensorSpec(f"{blk}.ssm_a", (d.ssm_dt_rank,), f32, "ssm_a"),
                TensorSpec(f"{blk}.ssm_beta.weight", (d.n_embd, d.ssm_dt_rank), f32, "linear"),
                TensorSpec(f"{blk}.ssm_alpha.weight", (d.n_embd, d.ssm_dt_rank), f32, "linear"),
                TensorSpec(f"{blk}.ssm_norm.weight", (d.ssm_d_state,), f32, "norm"),
                TensorSpec(f"{blk}.ssm_out.weight", (value_dim, d.n_embd), q4, "linear"),
            ]
        else:
            out += [
                TensorSpec(f"{blk}.attn_q.weight", (d.n_embd, 2 * q_dim), q4, "linear"),  # query + gate
                TensorSpec(f"{blk}.attn_k.weight", (d.n_embd, kv_dim), q4, "linear"),
                TensorSpec(f"{blk}.attn_v.weight", (d.n_embd, kv_dim), q4, "linear"),
                TensorSpec(f"{blk}.attn_output.weight", (q_dim, d.n_embd), q4, "linear"),
                TensorSpec(f"{blk}.attn_q_norm.weight", (d.head_dim,), f32, "norm"),
                TensorSpec(f"{blk}.attn_k_norm.weight", (d.head_dim,), f32, "norm"),
            ]
        out += [
            TensorSpec(f"{blk}.ffn_gate_inp.weight", (d.n_embd, d.n_expert), f32, "linear"),
            TensorSpec(f"{blk}.ffn_gate_exps.weight", (d.n_embd, d.n_ff_exp, d.n_expert), q4, "linear", True),
            TensorSpec(f"{blk}.ffn_up_exps.weight", (d.n_embd, d.n_ff_exp, d.n_expert), q4, "linear", True),
            TensorSpec(f"{blk}.ffn_down_exps.weight", (d.n_ff_exp, d.n_embd, d.n_expert), q4, "linear", True),
            TensorSpec(f"{blk}.ffn_gate_inp_shexp.weight", (d.n_embd,), f32, "linear"),
            TensorSpec(f"{blk}.ffn_gate_shexp.weight", (d.n_embd, d.n_ff_shexp), q4, "linear"),
            TensorSpec(f"{blk}.ffn_up_shexp.weight", (d.n_embd, d.n_ff_shexp), q4, "linear"),
            TensorSpec(f"{blk}.ffn_down_shexp.weight", (d.n_ff_shexp, d.n_embd), q4, "linear"),
        ]
    return out


@dataclass(frozen=True)
class Summary:
    n_tensors: int
    n_q4_0: int
    n_f32: int
    n_buffers: int  # distinct random buffers
    buffer_bytes: int
    data_bytes: int  # sum of tensor sizes
    params: int
    expert_params: int
    active_params: int  # non-expert + n_expert_used / n_expert of the experts
    embedding_params: int  # token_embd + output (included in params and active_params)


def summarize(specs: list[TensorSpec], dims: MoeDims) -> Summary:
    params = sum(s.n_elements for s in specs)
    expert = sum(s.n_elements for s in specs if s.expert)
    buffers = {s.data_key: s.nbytes for s in specs}
    return Summary(
        n_tensors=len(specs),
        n_q4_0=sum(s.dtype == "q4_0" for s in specs),
        n_f32=sum(s.dtype == "f32" for s in specs),
        n_buffers=len(buffers),
        buffer_bytes=sum(buffers.values()),
        data_bytes=sum(s.nbytes for s in specs),
        params=params,
        expert_params=expert,
        active_params=params - expert + expert * dims.n_expert_used // dims.n_expert,
        embedding_params=sum(s.n_elements for s in specs if s.name in ("token_embd.weight", "output.weight")),
    )


# -- random data ---------------------------------------------------------------------------------


def q4_0_random(rng: np.random.Generator, n_elements: int, rms: float) -> Bytes:
    """Random Q4_0 blocks (flat uint8) whose values have RMS ``rms``: random 4-bit codes, fp16 scale
    of random sign and magnitude ``rms / Q4_0_CODE_RMS`` times U(0.75, 1.25)."""
    n_blocks = n_elements // QK4_0
    blocks = np.empty((n_blocks, Q4_0_BLOCK_BYTES), dtype=np.uint8)
    # E[U(0.75, 1.25)^2] = 1 + 0.25^2 / 3: close enough to 1 not to correct for
    scale = rng.uniform(0.75 * rms / Q4_0_CODE_RMS, 1.25 * rms / Q4_0_CODE_RMS, n_blocks)
    scale[rng.random(n_blocks) < 0.5] *= -1.0
    blocks[:, :2] = scale.astype("<f2").view(np.uint8).reshape(n_blocks, 2)
    blocks[:, 2:] = np.frombuffer(rng.bytes(n_blocks * (Q4_0_BLOCK_BYTES - 2)), dtype=np.uint8).reshape(
        n_blocks, Q4_0_BLOCK_BYTES - 2
    )
    return blocks.reshape(-1)


def f32_random(rng: np.random.Generator, spec: TensorSpec) -> Bytes:
    n = spec.n_elements
    values: npt.NDArray[np.float64]
    if spec.init == "norm":
        values = 1.0 + 0.02 * rng.standard_normal(n)
    elif spec.init in ("linear", "conv"):  # fan-in scaled: ne0 is the input (or kernel) dimension
        values = rng.standard_normal(n) / math.sqrt(spec.ne[0])
    elif spec.init == "dt_bias":
        values = 0.1 * rng.standard_normal(n)
    elif spec.init == "ssm_a":
        # ssm_a = -exp(A_log): negative, so the per-token decay exp(softplus(.) * a) is < 1
        values = -np.exp(rng.uniform(-1.0, 0.5, n))
    else:
        raise ValueError(f"no F32 initialisation {spec.init!r} for {spec.name}")
    return np.ascontiguousarray(values, dtype="<f4").view(np.uint8)


def make_buffer(rng: np.random.Generator, spec: TensorSpec) -> Bytes:
    """The raw bytes of ``spec`` (flat uint8, ``spec.nbytes`` long)."""
    if spec.dtype == "q4_0":
        # embeddings: RMS 0.5 (the result is RMS-normed anyway); matrices: 1/sqrt(fan_in)
        rms = 0.5 if spec.init == "embed" else 1.0 / math.sqrt(spec.ne[0])
        data = q4_0_random(rng, spec.n_elements, rms)
    else:
        data = f32_random(rng, spec)
    assert data.nbytes == spec.nbytes, (spec, data.nbytes)
    return data
