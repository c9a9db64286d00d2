"""The engine's side of the step message's deltas."""
from parashift.step.message import ChunkDelta


class DeltaEncoder:
    """The engine's side: remembers what each replica's ranks already know."""

    def __init__(self, block_offset: int = 0):
        self.block_offset = block_offset  # where this replica's block ids start in the pool
        self.sent_blocks: dict[str, int] = {}
        self.finished: list[str] = []

    def chunk(self, request_id: str, token_ids: list[int], start_pos: int,
              block_table: list[int], samples: int) -> ChunkDelta:
        sent = self.sent_blocks.get(request_id, 0)
        return ChunkDelta(request_id, token_ids, start_pos, sent,
                          self.new_blocks(request_id, block_table), samples)

    def new_blocks(self, request_id: str, block_table: list[int]) -> list[int]:
        """The block ids the ranks do not have yet (in their pool's ids), now sent."""
        sent = self.sent_blocks.get(request_id, 0)
        count = self.sent_blocks[request_id] = len(block_table)
        if sent == count:  # most decode steps
            return []
        if self.block_offset:
            return [b + self.block_offset for b in block_table[sent:]]
        return block_table[sent:]

    def is_new(self, request_id: str) -> bool:
        return request_id not in self.sent_blocks

    def reset(self, request_id: str) -> None:
        """The request's blocks were freed (preempted): resend its table from scratch."""
        if request_id in self.sent_blocks:
            self.sent_blocks[request_id] = 0

    def drop(self, request_id: str) -> None:
        """The request moved to another replica, which tells the ranks to forget it."""
        self.sent_blocks.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        if self.sent_blocks.pop(request_id, None) is not None:
            self.finished.append(request_id)

    def take_finished(self) -> list[str]:
        finished, self.finished = self.finished, []
        return finished
