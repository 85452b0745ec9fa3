"""Data shell: the files chatfleet reads to build real prompts and length mixes. It reads files
and is never imported by :mod:`chatfleet.core`. One concept per module:

* :mod:`~chatfleet.data.paths`: where the packaged data are (Qwen3's tokenizer files, ShareGPT V3,
  GSM8K's test split shipped in ``gsm8k/``);
* :mod:`~chatfleet.data.chat_template`: transformers' chat-template rendering on a jinja2 sandbox;
* :mod:`~chatfleet.data.tokenizer`: :class:`QwenTokenizer` (``tokenizers`` + the chat template);
* :mod:`~chatfleet.data.exact_tokens`: prompts of an exact, checked token count;
* :mod:`~chatfleet.data.sharegpt`: ShareGPT V3's (prompt, output) lengths, filtered as vLLM does;
* :mod:`~chatfleet.data.lengths`: a user's file of (input, output) lengths.

GSM8K's rows and answer parsing live beside the accuracy check, in :mod:`chatfleet.check.gsm8k`.
"""
