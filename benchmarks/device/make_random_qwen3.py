"""Build a Qwen3-8B-shaped model with random weights (bf16, on the GPU) and save it with the
real Qwen3 tokenizer files beside it. For the device run only: no weights can be fetched there.

Usage: python3 benchmarks/device/make_random_qwen3.py OUT_DIR
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from chatfleet.core.specs import QWEN3_8B_CONFIG
from chatfleet.data.paths import qwen_tokenizer_dir


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    c = QWEN3_8B_CONFIG
    cfg = Qwen3Config(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"], num_hidden_layers=c["num_hidden_layers"],
        num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
        max_position_embeddings=c["max_position_embeddings"],
        tie_word_embeddings=c["tie_word_embeddings"], torch_dtype="bfloat16",
        bos_token_id=151643, eos_token_id=151645,
    )
    t = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    print(f"built {n:,} parameters in {time.time() - t:.1f} s", flush=True)
    t = time.time()
    model.save_pretrained(out, safe_serialization=True)
    print(f"saved in {time.time() - t:.1f} s", flush=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copy(qwen_tokenizer_dir() / f, out / f)


if __name__ == "__main__":
    main()
