"""The CPU KV tier's accounting, on the engine's side: each request holds one contiguous
range of the tier's token axis (its slot), taken first fit; a freed range merges with its
free neighbours. A slot goes through three states: `writing` (its prefill is filling it),
`stashed` (complete, waiting for pages in the decode plan's pool), `loading` (being copied
into those pages); `free` ends it from any state (finish, abort, or loaded) and is a no-op
for a request without one, so every exit path may call it."""
import bisect
from dataclasses import dataclass

SLOT_STATES = ("writing", "stashed", "loading")


@dataclass
class TierSlot:
    start: int
    length: int
    state: str = "writing"

    @property
    def stop(self) -> int:
        return self.start + self.length


class TierAllocator:
    def __init__(self, capacity_tokens: int):
        if capacity_tokens < 1:
            raise ValueError(f"the CPU KV tier needs at least one token, got {capacity_tokens}")
        self.capacity = capacity_tokens
        self._free: list[tuple[int, int]] = [(0, capacity_tokens)]  # (start, length), by start
        self.slots: dict[str, TierSlot] = {}

    @property
    def used_tokens(self) -> int:
        return sum(s.length for s in self.slots.values())

    @property
    def free_tokens(self) -> int:
        return self.capacity - self.used_tokens

    @property
    def fill(self) -> float:
        return self.used_tokens / self.capacity

    def largest_free(self) -> int:
        return max((length for _, length in self._free), default=0)

    def can_hold(self, tokens: int) -> bool:
        return self.largest_free() >= tokens

    def allocate(self, request_id: str, tokens: int) -> TierSlot | None:
        """A slot of `tokens` for the request (first fit), or None when no free range fits."""
        if request_id in self.slots:
            raise ValueError(f"request {request_id} already holds a CPU KV slot")
        if tokens < 1:
            raise ValueError(f"a CPU KV slot holds at least one token, got {tokens}")
        for i, (start, length) in enumerate(self._free):
            if length >= tokens:
                if length == tokens:
                    del self._free[i]
                else:
                    self._free[i] = (start + tokens, length - tokens)
                slot = self.slots[request_id] = TierSlot(start, tokens)
                return slot
        return None

    def mark(self, request_id: str, state: str) -> None:
        if state not in SLOT_STATES:
            raise ValueError(f"unknown CPU KV slot state {state!r}; states: {SLOT_STATES}")
        self.slots[request_id].state = state

    def requests_in(self, state: str) -> list[str]:
        return [r for r, s in self.slots.items() if s.state == state]

    def free(self, request_id: str) -> int:
        """Frees the request's slot in whatever state; returns the tokens freed (0: none)."""
        slot = self.slots.pop(request_id, None)
        if slot is None:
            return 0
        i = bisect.bisect(self._free, (slot.start, 0))
        start, length = slot.start, slot.length
        if i < len(self._free) and self._free[i][0] == slot.stop:  # merge the next range
            length += self._free.pop(i)[1]
        if i > 0 and sum(self._free[i - 1]) == start:  # and the previous one
            start, length = self._free[i - 1][0], self._free[i - 1][1] + length
            i -= 1
            del self._free[i]
        self._free.insert(i, (start, length))
        return slot.length
