"""Debug mode (`--check-step-state`): each step's inputs, as the rank builds them from its
persistent state (block-table rows updated by the step messages' deltas, the rows'
argmax-only flags, the previous samples' index by row, the staging ring's buffers), against
the same inputs rebuilt from scratch with plain Python lists: every request's block table
kept as a list, every slot computed token by token, every flag from its request's
parameters, and, at the end of each micro-batch, every array it uploaded as it was packed
(no later pack of it overwrote it)."""
import numpy as np
import torch

from parashift.step.message import PLACEHOLDER_TOKEN, StepBatch, StepStateMismatch
from parashift.uploads import StagingRing
from parashift.worker.step_chunks import RequestTables, SeqChunk
from parashift.worker.step_inputs import StepInputs


class StepStateCheck:
    def __init__(self):
        self.tables: dict[str, list[int]] = {}  # request id -> its block table
        self.prev_rows: dict[tuple, dict[str, int]] = {}  # group -> request id -> sample index
        self.uploads: list[list] = []  # the micro-batch's [tensor, its values as packed]

    def watch_uploads(self, ring: StagingRing) -> None:
        """Records every array the ring sends (its uploads and the packs written in place),
        for `verify_uploads` at the end of the micro-batch."""
        send = ring.send

        def recorded():
            host = ring.pending[-1][0]
            values = [a.tolist() for a in host]
            tensors = send()
            self.uploads += [[t, v] for t, v in zip(tensors, values)]
            return tensors
        ring.send = recorded

    def verify_uploads(self) -> None:
        """Every tensor the micro-batch uploaded still holds what was packed into it (read
        on the device's stream, after its kernels)."""
        for tensor, packed in self.uploads:
            got = tensor.cpu().tolist()
            _expect(got == packed, "an upload of this step", got, packed)
        self.uploads = []

    def apply(self, batch: StepBatch, persistent: RequestTables) -> None:
        """Applies the message to the lists, then compares every live request's table."""
        for request_id in batch.finished_request_ids:
            self.tables.pop(request_id, None)
        for d in batch.all_chunks():
            table = self.tables.setdefault(d.request_id, [])
            del table[d.blocks_from:]
            table += d.new_blocks
        for request_id, row in persistent.row_of.items():
            _expect(persistent.table(row) == self.tables.get(request_id),
                    f"block table of {request_id}", persistent.table(row),
                    self.tables.get(request_id))
            params = persistent.params.get(request_id)
            argmax_only = params is not None and params.argmax_only
            _expect(bool(persistent.argmax_only[row]) == argmax_only,
                    f"argmax_only of {request_id}", bool(persistent.argmax_only[row]),
                    argmax_only)
        _expect(not persistent.argmax_only[persistent.free_rows()].any(),
                "argmax_only of free rows", persistent.argmax_only[persistent.free_rows()],
                "none set")
        _expect(set(persistent.row_of) >= {d.request_id for d in batch.all_chunks()},
                "requests with a row", sorted(persistent.row_of), batch.all_chunks())

    def verify_inputs(self, chunks: list[SeqChunk], inputs: StepInputs, block_size: int,
                      sp_size: int, sp_rank: int, pad_to: int,
                      pad_seqs: int | None = None) -> None:
        expected = rebuild(chunks, self.tables, block_size, sp_size, sp_rank, pad_to, pad_seqs)
        attn, want = inputs.attn, expected["attn"]
        for name in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
            got = getattr(attn, name).cpu().tolist()
            _expect(got == want[name], name, got, want[name])
        for name in ("query_start_loc_cpu", "seq_lens_cpu", "max_query_len", "max_seq_len"):
            _expect(getattr(attn, name) == want[name], name, getattr(attn, name), want[name])
        positions = inputs.positions.cpu().tolist()
        _expect(positions == expected["positions"], "positions", positions,
                expected["positions"])
        # placeholders are filled by then (verify_placeholders checks from where)
        filled = inputs.token_ids.cpu().tolist()
        for upload in self.uploads:  # its placeholders were filled in place, on purpose
            if upload[0] is inputs.token_ids:
                upload[1] = filled
        tokens = [t if want != PLACEHOLDER_TOKEN else want for t, want in
                  zip(filled, expected["token_ids"])]
        _expect(tokens == expected["token_ids"], "token_ids", tokens, expected["token_ids"])
        _expect(inputs.sample_rows == expected["sample_rows"], "sample_rows",
                inputs.sample_rows, expected["sample_rows"])
        _expect(inputs.local_rows == expected["local_rows"], "local_rows", inputs.local_rows,
                expected["local_rows"])

    def verify_placeholders(self, group: tuple, chunks: list[SeqChunk], inputs: StepInputs,
                            rows: torch.Tensor | None, sources: torch.Tensor | None) -> None:
        """The rows a step fills from the previous samples, and from which sample."""
        ends, local = inputs.attn.query_start_loc_cpu[1:], inputs.local_rows
        prev_rows = self.prev_rows.get(group, {})
        pairs = [(ends[i] - 1 - local.start, prev_rows[c.request_id])
                 for i, c in enumerate(chunks)
                 if c.token_ids[-1] == PLACEHOLDER_TOKEN and ends[i] - 1 in local]
        got = [] if rows is None else list(zip(rows.cpu().tolist(), sources.cpu().tolist()))
        _expect(got == pairs, "placeholder rows and their samples", got, pairs)

    def remember_samples(self, group: tuple, chunks: list[SeqChunk]) -> None:
        """Each sampling request's last sampled row (a verification samples 1 + k)."""
        rows, last = {}, -1
        for c in chunks:
            if c.sampling is not None:
                last += c.num_samples
                rows[c.request_id] = last
        self.prev_rows[group] = rows


def rebuild(chunks: list[SeqChunk], tables: dict[str, list[int]], block_size: int,
            sp_size: int, sp_rank: int, pad_to: int, pad_seqs: int | None = None) -> dict:
    """A step's inputs from scratch, as lists (the layout build_step_inputs promises)."""
    token_ids, positions, slots, starts = [], [], [], [0]
    for c in chunks:
        table = tables[c.request_id]
        token_ids += c.token_ids
        span = range(c.start_pos, c.seq_len)
        positions += span
        slots += [table[p // block_size] * block_size + p % block_size for p in span]
        starts.append(starts[-1] + len(c.token_ids))
    num_rows = max(len(token_ids), pad_to)
    padding = num_rows - len(token_ids) + (-num_rows % sp_size)
    token_ids += [0] * padding
    positions += [0] * padding
    slots += [-1] * padding
    num_seqs = max(len(chunks), pad_to if pad_seqs is None else pad_seqs)
    starts += [starts[-1]] * (num_seqs - len(chunks))
    seq_lens = [c.seq_len for c in chunks] + [0] * (num_seqs - len(chunks))
    width = -(-max(seq_lens) // block_size)
    block_tables = [(tables[c.request_id] + [0] * width)[:width] for c in chunks]
    block_tables += [[0] * width] * (num_seqs - len(chunks))
    per_rank = len(token_ids) // sp_size
    local = range(sp_rank * per_rank, (sp_rank + 1) * per_rank)
    return dict(
        attn=dict(slot_mapping=slots, query_start_loc=starts, seq_lens=seq_lens,
                  block_tables=block_tables, query_start_loc_cpu=starts,
                  seq_lens_cpu=seq_lens, max_query_len=max(len(c.token_ids) for c in chunks),
                  max_seq_len=max(seq_lens)),
        token_ids=token_ids[local.start:local.stop], positions=positions[local.start:local.stop],
        # a sampling chunk's last num_samples rows (1 + k: a verification's)
        sample_rows=[row for i, c in enumerate(chunks) if c.sampling is not None
                     for row in range(starts[i + 1] - c.num_samples, starts[i + 1])],
        local_rows=local)


def _expect(ok: bool, what: str, got, expected) -> None:
    if not ok:
        raise StepStateMismatch(f"persistent step state differs from the rebuild in {what}: "
                                f"got {_short(got)}, rebuilt {_short(expected)}")


def _short(value) -> str:
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) < 400 else text[:400] + "..."
