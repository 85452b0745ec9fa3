"""Deprecated: the old home of the data shell, kept for one release so that code importing
``chatfleet.datasets`` keeps working. Import from :mod:`chatfleet.data` (tokenizer, chat
template, exact-token prompts, ShareGPT, length files, package paths) and
:mod:`chatfleet.check.gsm8k` (GSM8K) instead; chatfleet itself no longer imports this module.
"""

from __future__ import annotations

import warnings

from chatfleet.check.gsm8k import extract_model_answer, gsm8k_answer, load_gsm8k
from chatfleet.data.exact_tokens import (
    system_block_overhead,
    system_prompt_of_exact_tokens,
    text_of_exact_tokens,
)
from chatfleet.data.lengths import load_length_file
from chatfleet.data.paths import gsm8k_test_path, qwen_tokenizer_dir, sharegpt_default_path
from chatfleet.data.sharegpt import (
    SHAREGPT_MAX_PROMPT_LEN,
    SHAREGPT_MAX_TOTAL_LEN,
    SHAREGPT_MIN_LEN,
    cached_sharegpt_length_pairs,
    default_cache_dir,
    is_valid_length_pair,
    load_sharegpt_conversations,
    sharegpt_length_pairs,
)
from chatfleet.data.tokenizer import QwenTokenizer, load_qwen_tokenizer

__all__ = [
    "SHAREGPT_MAX_PROMPT_LEN",
    "SHAREGPT_MAX_TOTAL_LEN",
    "SHAREGPT_MIN_LEN",
    "QwenTokenizer",
    "cached_sharegpt_length_pairs",
    "default_cache_dir",
    "extract_model_answer",
    "gsm8k_answer",
    "gsm8k_test_path",
    "is_valid_length_pair",
    "load_gsm8k",
    "load_length_file",
    "load_qwen_tokenizer",
    "load_sharegpt_conversations",
    "qwen_tokenizer_dir",
    "sharegpt_default_path",
    "sharegpt_length_pairs",
    "system_block_overhead",
    "system_prompt_of_exact_tokens",
    "text_of_exact_tokens",
]

warnings.warn("chatfleet.datasets is deprecated: import from chatfleet.data.* and "
              "chatfleet.check.gsm8k", DeprecationWarning, stacklevel=2)
