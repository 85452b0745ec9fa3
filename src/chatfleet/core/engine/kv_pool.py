"""The KV pool: a fixed number of token slots, allocated in pages.

The radix tree owns the slots of cached prefixes; running requests own the slots of tokens not
yet in the tree. The pool counts the slots held by requests (`num_request_tokens`); the tree
reports its own (`RadixCache.total_size`). Free = capacity - tree - requests.
"""

from __future__ import annotations

from chatfleet.core.errors import ChatfleetError


class KVPool:
    def __init__(self, capacity_tokens: int, page_size: int = 1) -> None:
        if capacity_tokens <= 0:
            raise ChatfleetError("the KV pool must hold at least one token")
        if page_size <= 0:
            raise ChatfleetError("page size must be positive")
        self.capacity_tokens = capacity_tokens - capacity_tokens % page_size
        self.page_size = page_size
        self.num_request_tokens = 0

    def pages(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def slots(self, tokens: int) -> int:
        """Slots `tokens` occupy once rounded up to whole pages."""
        return self.pages(tokens) * self.page_size

    def num_free_tokens(self, tree_tokens: int) -> int:
        return self.capacity_tokens - tree_tokens - self.num_request_tokens

    def can_allocate(self, tokens: int, tree_tokens: int, evictable_tokens: int = 0) -> bool:
        return self.slots(tokens) <= self.num_free_tokens(tree_tokens) + evictable_tokens

    def allocate(self, tokens: int) -> None:
        self.num_request_tokens += tokens if self.page_size == 1 else self.slots(tokens)

    def free(self, tokens: int) -> None:
        self.num_request_tokens -= tokens if self.page_size == 1 else self.slots(tokens)
        if self.num_request_tokens < 0:
            raise RuntimeError("KV pool freed more slots than it allocated")
