"""Turn the workload's requests into request bodies for a live engine.

- `ChatPayload` (the default): /v1/chat/completions with real text. Each segment of the
  workload becomes text of exactly that many Qwen3 tokens (datasets.text_of_exact_tokens,
  seeded by the segment id), so the shared system prompt is byte-identical in every request
  and every session. A session's history carries the answers the engine actually gave (their
  text, as the product would), not the workload's synthetic answers. Chat-template tokens come
  on top of the segment lengths, as they would in production.
- `completions_with_ids` (drive.py): /v1/completions with the twin's exact token ids.

Thinking is off by default (`enable_thinking: false` in chat_template_kwargs, stated in the
results' workload block); `--thinking` turns it on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chatfleet.core.workload import RequestSpec
from chatfleet.datasets import QwenTokenizer, text_of_exact_tokens


@dataclass
class ChatPayload:
    tok: QwenTokenizer
    model: str
    ignore_eos: bool = True
    thinking: bool = False
    continuous_usage: bool = True
    system_groups: int = 1
    _text: dict[tuple[int, int], str] = field(default_factory=dict)
    _history: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def segment_text(self, sid: int, n: int) -> str:
        """Text of exactly n tokens for segment sid: the same bytes every time it is asked."""
        text = self._text.get((sid, n))
        if text is None:
            text = text_of_exact_tokens(self.tok, n, seed=sid)
            self._text[(sid, n)] = text
        return text

    def reset(self) -> None:
        """A new run: sessions start over (the text of shared prompts is kept)."""
        self._history.clear()
        shared = {k: v for k, v in self._text.items() if k[0] <= self.system_groups}
        self._text = shared

    def __call__(self, spec: RequestSpec) -> tuple[str, dict[str, Any]]:
        segs = spec.segments
        history = self._history.get(spec.session_id)
        if history is None or spec.turn == 0:
            history = []
            if len(segs) > 1 and spec.turn == 0 and segs[0][0] <= self.system_groups:
                history.append({"role": "system", "content": self.segment_text(*segs[0])})
            self._history[spec.session_id] = history
        user_sid, user_n = segs[-1]
        messages = [*history, {"role": "user", "content": self.segment_text(user_sid, user_n)}]
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": spec.max_new_tokens,
            "stream": True,
            "temperature": 0.0,
            "chat_template_kwargs": {"enable_thinking": self.thinking},
            "stream_options": {"include_usage": True,
                               "continuous_usage_stats": self.continuous_usage},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
            body["min_tokens"] = spec.max_new_tokens
        return "/v1/chat/completions", body

    def on_answer(self, spec: RequestSpec, text: str) -> None:
        """The engine's answer joins the session's history (its reasoning does not)."""
        history = self._history.setdefault(spec.session_id, [])
        user_sid, user_n = spec.segments[-1]
        history.append({"role": "user", "content": self.segment_text(user_sid, user_n)})
        history.append({"role": "assistant", "content": text})

    def end_session(self, session_id: str) -> None:
        self._history.pop(session_id, None)
