"""GPU catalogue, model specs (from a Hugging Face config.json) and precisions.

Everything here is a frozen dataclass. Reading a config.json file is the shell's job: this
module takes the parsed dict (`model_from_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from chatfleet.core.errors import ChatfleetError

GIB = 1 << 30

Dtype = Literal["bf16", "fp8"]
DTYPES: tuple[Dtype, ...] = ("bf16", "fp8")
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp8": 1}


class SpecError(ChatfleetError):
    """Bad input: unknown GPU or model, a config missing fields, a bad precision."""


@dataclass(frozen=True, slots=True)
class GPU:
    """One card. Memory is what the driver shows (`nvidia-smi` total), not the marketing size."""

    name: str
    visible_mib: int
    bandwidth_gbs: float
    bf16_tflops: float  # dense
    fp8_tflops: float  # dense; 0 where the card has no FP8 tensor cores
    boost_mhz: int
    power_w: float
    cooling: Literal["passive", "active"]
    pcie_gbs: float  # host <-> device link, one direction (the datasheet's, halved)

    def tflops(self, dtype: str) -> float:
        if dtype == "fp8" and self.fp8_tflops > 0:
            return self.fp8_tflops
        return self.bf16_tflops


# Public datasheet figures (dense, no sparsity). Visible memory is what the driver reports:
# the L4's 23,034 MiB is a measurement (docs/facts.md#nvidia-l4); the others are nvidia-smi
# totals as commonly reported for those cards. PCIe: the link's rate in one direction, as the
# datasheets give it for both (L4: "PCIe Gen4 x16: 64 GB/s"): Gen4 x16 32 GB/s, Gen5 x16 64,
# the A10G on Gen4 x8 in AWS g5 16. What a copy reaches of it is calibration.py's
# ASSUMED_HOST_IO_EFF.
GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU("l4", 23034, 300.0, 121.0, 242.0, 2040, 72.0, "passive", 32.0),
        GPU("a10g", 22731, 600.0, 70.0, 0.0, 1710, 300.0, "passive", 16.0),
        GPU("l40s", 46068, 864.0, 362.0, 733.0, 2520, 350.0, "passive", 32.0),
        GPU("a100-40gb", 40960, 1555.0, 312.0, 0.0, 1410, 400.0, "passive", 32.0),
        GPU("a100-80gb", 81920, 2039.0, 312.0, 0.0, 1410, 400.0, "passive", 32.0),
        GPU("h100-sxm", 81559, 3350.0, 989.0, 1979.0, 1980, 700.0, "passive", 64.0),
        GPU("h200", 143771, 4800.0, 989.0, 1979.0, 1980, 700.0, "passive", 64.0),
    )
}
GPU_ALIASES = {"a100": "a100-80gb", "h100": "h100-sxm", "a100-40": "a100-40gb",
               "a100-80": "a100-80gb"}


def get_gpu(name: str) -> GPU:
    key = name.strip().lower()
    key = GPU_ALIASES.get(key, key)
    if key not in GPUS:
        raise SpecError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return GPUS[key]


@dataclass(frozen=True, slots=True)
class Model:
    """A dense decoder-only transformer as far as memory and step time need it."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    has_qk_norm: bool = False
    quant_block: int = 128  # FP8 block-quantisation block edge (128x128 scales)

    # --- parameter counts -------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        """Input embedding plus lm_head (one table when tied)."""
        table = self.vocab_size * self.hidden_size
        return table if self.tie_word_embeddings else 2 * table

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(out, in) of every linear weight in one layer."""
        h, q = self.hidden_size, self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        i = self.intermediate_size
        return [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]

    @property
    def linear_params(self) -> int:
        return self.num_layers * sum(o * i for o, i in self.linear_shapes())

    @property
    def norm_params(self) -> int:
        per_layer = 2 * self.hidden_size + (2 * self.head_dim if self.has_qk_norm else 0)
        return self.num_layers * per_layer + self.hidden_size

    @property
    def total_params(self) -> int:
        return self.embedding_params + self.linear_params + self.norm_params

    @property
    def non_embedding_params(self) -> int:
        return self.linear_params + self.norm_params

    # --- bytes ----------------------------------------------------------------------------
    def weight_bytes(self, weights: str) -> int:
        """Bytes of the checkpoint in memory.

        fp8: linear weights e4m3 (1 byte) with one float32 scale per 128x128 block; embeddings,
        lm_head and norms stay bf16 (the layout of Qwen/Qwen3-8B-FP8).
        """
        check_dtype(weights, "weights")
        if weights == "bf16":
            return 2 * self.total_params
        b = self.quant_block
        scales = self.num_layers * sum(-(-o // b) * -(-i // b) for o, i in self.linear_shapes())
        return self.linear_params + 4 * scales + 2 * (self.embedding_params + self.norm_params)

    def streamed_weight_bytes(self, weights: str) -> int:
        """Weight bytes a forward pass reads: all but the input embedding table, which is
        gathered row by row (a few KB per token), never streamed."""
        return self.weight_bytes(weights) - 2 * self.vocab_size * self.hidden_size

    def kv_bytes_per_token(self, kv_cache: str) -> int:
        """layers x kv_heads x head_dim x 2 (K and V) x dtype bytes."""
        check_dtype(kv_cache, "kv-cache")
        return self.num_layers * self.num_kv_heads * self.head_dim * 2 * DTYPE_BYTES[kv_cache]

    def forward_flops(self, new_tokens: int, logits_tokens: int) -> float:
        """Dense matmul FLOPs of a forward pass over `new_tokens` (2 x params per token), with
        the lm_head run only for the tokens whose logits are sampled."""
        head = self.vocab_size * self.hidden_size
        return 2.0 * self.linear_params * new_tokens + 2.0 * head * logits_tokens


REQUIRED_CONFIG_FIELDS = (
    "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
    "vocab_size",
)


def model_from_config(name: str, config: Mapping[str, Any]) -> Model:
    """Build a Model from a Hugging Face config.json dict (Llama/Qwen/Mistral-style keys)."""
    missing = [k for k in REQUIRED_CONFIG_FIELDS if k not in config]
    if missing:
        raise SpecError(f"config.json for {name!r} lacks required fields: {', '.join(missing)}")
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        if heads <= 0:
            raise SpecError(f"config.json for {name!r}: num_attention_heads must be positive")
        head_dim = int(config.get("head_dim") or hidden // heads)
        model = Model(
            name=name,
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_attention_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
            has_qk_norm=str(config.get("model_type", "")).startswith("qwen3"),
        )
    except (TypeError, ValueError) as exc:
        raise SpecError(f"config.json for {name!r} has a non-integer field: {exc}") from exc
    for field_name in ("num_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                       "num_kv_heads", "head_dim", "vocab_size"):
        if getattr(model, field_name) <= 0:
            raise SpecError(f"config.json for {name!r}: {field_name} must be positive")
    return model


# Qwen/Qwen3-8B config.json (the fields this project reads), built in as `qwen3-8b`.
QWEN3_8B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "num_hidden_layers": 36,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}
BUILTIN_MODELS: dict[str, dict[str, Any]] = {"qwen3-8b": QWEN3_8B_CONFIG}
HF_MODEL_IDS: dict[str, dict[str, str]] = {
    "qwen3-8b": {"bf16": "Qwen/Qwen3-8B", "fp8": "Qwen/Qwen3-8B-FP8"},
}


def builtin_model(name: str) -> Model:
    key = name.strip().lower()
    if key not in BUILTIN_MODELS:
        raise SpecError(
            f"unknown model {name!r}; built in: {', '.join(BUILTIN_MODELS)} "
            "(or pass the path of a config.json)"
        )
    return model_from_config(key, BUILTIN_MODELS[key])


def check_dtype(value: str, what: str) -> None:
    if value not in DTYPES:
        raise SpecError(f"unknown {what} precision {value!r}; choose one of {', '.join(DTYPES)}")


@dataclass(frozen=True, slots=True)
class Precision:
    weights: Dtype
    kv_cache: Dtype

    @property
    def label(self) -> str:
        return f"{self.weights}/{self.kv_cache}"


def precision(weights: str, kv_cache: str) -> Precision:
    check_dtype(weights, "weights")
    check_dtype(kv_cache, "kv-cache")
    return Precision(weights, kv_cache)  # type: ignore[arg-type]
