"""SiDP on one rank (arXiv 2605.28095; the design chosen from the probe is in
docs/architecture.md "SiDP"): d data-parallel replicas share their FFN weights. Each rank
loaded one 1/d slice of every FFN layer of its TP shard (`Plan.ffn_shard_ranks`); its peers
(the other replicas' ranks at its TP position) use that slice where it lies:

- Weight-as-a-Service (`was`): before a layer's FFN the rank assembles its whole TP shard in
  one of a few slots, copying each peer's slice (one-sided: the owner does nothing), and
  runs the same GEMMs as a replica that holds the whole shard. Once the layer is done its
  slot takes the layer `slots` ahead, so the next step's first layers arrive during this
  step's last ones.
- Compute-as-a-Service (`cas`): the replicas' tokens are gathered, each rank applies its
  slice to all of them and the sums are reduce-scattered back (DP attention with a TP FFN
  over the replicas): every rank of every replica takes part in each such step, one with
  no tokens too (`serve_idle`).

Peers read a rank's slices from a file in /dev/shm that every peer maps on the CPU, and
through CUDA IPC handles on GPUs. The mode is the step plan's weight layout key."""
import hashlib
import logging

import torch
from torch import nn

from parashift.context import get_context, use_context
from parashift.layers.linear import LinearBase
from parashift.parallel.state import ParallelState
from parashift.worker.ffn_slices import (CAS_WEIGHTS, WAS_WEIGHTS, FfnSlice, FfnSlots,
                                         OwnedSlices, ffn_modules)
from parashift.worker.rank_hooks import RankHooks, RankSetup

logger = logging.getLogger(__name__)

LAYOUT_OF_MODE = {"was": WAS_WEIGHTS, "cas": CAS_WEIGHTS}
PROFILE_ROUND = 0  # the start-up memory profile's CaS round (the engine's count from 1)


def rank_hooks_for(setup: RankSetup) -> "SharedFfn | None":
    """SiDP where the rank's plan shares its FFN weights (the sidp policy, or share_ffn)."""
    if setup.state.plan.shared_ffn is None:
        return None
    return SharedFfn(setup.model, setup.state, setup.config.sidp.slots, setup.device,
                     setup.dtype)


class SharedFfn(RankHooks):
    """SiDP on this rank: its owned slices, its slots, and the hooks that run each FFN
    block in the step plan's mode (its weight layout key)."""
    mixed_step_graphs = False
    # the CaS plans replay graphs by default, the WaS plans (`replays_graphs`) run eagerly
    graphs_for_some_plans = True

    def __init__(self, model: nn.Module, state: ParallelState, slots: int, device: torch.device,
                 dtype: torch.dtype):
        """`dtype`: the activations' (the FFN weights' may be FP8)."""
        self.modules = ffn_modules(model)
        if not self.modules:
            raise ValueError("shared FFN weights (SiDP) need a model with dense FFN blocks")
        self.peers = state.ffn
        self.owners = OwnedSlices(self.modules, self.peers, device)
        self.slots = FfnSlots(self.modules, self.owners, self.peers.rank, slots, device)
        self.hidden_size = self.owners.local[0].down.shape[0]
        self.dtype, self.device = dtype, device
        self._install_layouts(model)
        for index, module in enumerate(self.modules):
            module.register_forward_pre_hook(self._before(index))
            module.register_forward_hook(self._after(index))
        self.round_id, self._counts, self.rows, self._local_rows = -1, None, 0, 0
        self._token_index: torch.Tensor | None = None  # the step's `_token_rows`
        # CaS steps by how their rows were known: padded to the round's, or counted (given
        # by the engine, or exchanged among the peers: the start-up profile's alone)
        self.rounds = {"padded": 0, "counted": 0, "exchanged": 0}
        self._state = state

    def _install_layouts(self, model: nn.Module) -> None:
        """CaS runs the owned slices (the down projection's bias added by one replica);
        every other linear layer runs its loaded weights under both modes."""
        ffn_linears = set()
        for module in self.modules:
            gate_up, down = module.gate_up_proj, module.down_proj
            gate_up.set_layout(CAS_WEIGHTS, [gate_up.part()], separate=False)
            bias = down.bias if self.peers.rank == 0 else None
            down.set_layout(CAS_WEIGHTS, [down.part()._replace(bias=bias)], separate=False)
            ffn_linears.update((gate_up, down))
        for layer in model.modules():
            if isinstance(layer, LinearBase) and layer not in ffn_linears:
                for key in (WAS_WEIGHTS, CAS_WEIGHTS):
                    layer.set_layout(key, [layer.part()], separate=False)

    def log_memory(self, kv_bytes: int) -> None:
        """The start-up line: what this rank owns, its slots, and the KV pool they left."""
        order = self._state.plan.ffn_shard_ranks()
        logger.info("SiDP rank %d: owns FFN slice %d of %d of all %d layers (%.1f MiB), reads "
                    "its peers %s; %d slots (%.1f MiB); CaS staging: the collectives' own; "
                    "KV pool %.1f MiB", self._state.rank, order.index(self._state.rank),
                    len(order), len(self.modules), self.owners.nbytes / 2**20,
                    list(self.peers.ranks), len(self.slots.slots), self.slots.nbytes / 2**20,
                    kv_bytes / 2**20)

    # ---- a step --------------------------------------------------------------
    def begin_step(self, round_id: int, rows: int = 0,
                   tokens_by_rank: dict[int, int] | None = None) -> None:
        """`rows`: every peer's FFN rows in a decode round (each pads to them: one shape,
        known to all, no exchange of counts; a CUDA graph replays it); 0: each peer's rows
        from `tokens_by_rank` (the engine's, by rank), else exchanged at the first block."""
        self.round_id, self.rows, self._token_index = round_id, rows, None
        self._counts = ([tokens_by_rank[rank] for rank in self.peers.ranks]
                        if tokens_by_rank and not rows else None)
        if round_id > PROFILE_ROUND:
            self.rounds["padded" if rows else "counted"] += 1

    def serve_idle(self) -> None:
        """A CaS step of a replica with no tokens: its slices still serve the others."""
        empty = torch.empty(0, self.hidden_size, dtype=self.dtype, device=self.device)
        for module in self.modules:
            module(empty)

    def _before(self, index: int):
        def hook(module, args):
            key = get_context().weights
            if key == WAS_WEIGHTS:
                self.slots.ready(index)
            elif key == CAS_WEIGHTS:
                return (self._gather(args[0]),)
            return None
        return hook

    def _after(self, index: int):
        def hook(module, args, output):
            key = get_context().weights
            if key == WAS_WEIGHTS:
                self.slots.release(index)
            elif key == CAS_WEIGHTS:
                return self._scatter(output)
            return None
        return hook

    def _step_counts(self, tokens: int) -> list[int]:
        """Each peer's tokens this step: the engine's, or exchanged at the step's first FFN
        block (the peers must all be running the same round)."""
        if self._counts is None:
            mine = torch.tensor([[tokens, self.round_id]], dtype=torch.int64)
            if self.device.type == "cuda":
                mine = mine.to(self.device)
            both = self.peers.all_gather(mine, dim=0).tolist()
            self.rounds["exchanged"] += self.round_id > PROFILE_ROUND
            rounds = [r for _, r in both]
            if self.round_id < 0 or len(set(rounds)) != 1:
                raise RuntimeError(f"SiDP peers {list(self.peers.ranks)} are not running one "
                                   f"Compute-as-a-Service round: their rounds are {rounds}")
            self._counts = [n for n, _ in both]
        elif self._counts[self.peers.rank] != tokens:
            raise RuntimeError(f"rank {self._state.rank} runs {tokens} FFN rows in a Compute-"
                               f"as-a-Service round that gives it {self._counts[self.peers.rank]}")
        return self._counts

    def _gather(self, x: torch.Tensor) -> torch.Tensor:
        if self.rows:
            return self.peers.all_gather(self._padded(x), dim=0)
        counts = self._step_counts(x.shape[0])
        gathered = self.peers.all_gather(_pad_rows(x, max(counts)), dim=0)
        return gathered.index_select(0, self._token_rows(counts, x.device))

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.rows:
            raise RuntimeError(f"a shared-FFN decode round of {self.rows} rows per replica got "
                               f"{x.shape[0]} rows on rank {self._state.rank}")
        self._local_rows = x.shape[0]
        return _pad_rows(x, self.rows)  # a graph's bucket: no copy

    def _scatter(self, y: torch.Tensor) -> torch.Tensor:
        if self.rows:
            return self.peers.reduce_scatter(y)[:self._local_rows]
        counts = self._counts
        padded = y.new_zeros(len(counts) * max(counts), y.shape[1])
        padded.index_copy_(0, self._token_rows(counts, y.device), y)
        return self.peers.reduce_scatter(padded)[:counts[self.peers.rank]]

    def _token_rows(self, counts: list[int], device: torch.device) -> torch.Tensor:
        """Where the peers' tokens sit among their blocks padded to the longest, in peer
        order: made on the device once a step, used by every layer's gather and scatter."""
        if self._token_index is None:
            longest = max(counts)
            self._token_index = torch.cat([torch.arange(p * longest, p * longest + n,
                                                        device=device)
                                           for p, n in enumerate(counts)])
        return self._token_index

    # ---- checks and counters -------------------------------------------------
    # ---- the rank hooks (worker/rank_hooks.py) ----------------------------------
    @staticmethod
    def replays_graphs(plan) -> bool:
        """CaS plans only: WaS's fetches are not captured."""
        return plan.weights == CAS_WEIGHTS

    def before_capture(self, plan, rows: int) -> None:
        """A CaS graph's exchanges take the bucket's rows."""
        self.begin_step(PROFILE_ROUND, rows)

    def graph_rows(self) -> int | None:
        """Only a round whose rows every peer knows replays a graph: a peer of a counted
        round runs eagerly, and the exchanges' shapes must match."""
        return self.rows or None

    def before_step(self, batch, graphs) -> None:
        """The step's round: a decode round's rows per replica are its graph bucket where
        graphs hold one (every peer picks the same), else as sent."""
        rows = batch.round_rows
        if rows and graphs is not None:
            rows = graphs.bucket_of(rows) or rows
        self.begin_step(batch.round_id, rows, batch.round_tokens)

    def step_without_tokens(self, batch, plan) -> None:
        """In a round all replicas sharing FFN weights run together, this rank's slices
        serve the others'."""
        if batch.round_id >= 0:
            with use_context(plan.context()):
                self.serve_idle()

    def before_profile_step(self) -> None:
        self.begin_step(PROFILE_ROUND)  # every peer profiles at start-up: one CaS round

    def after_profile_step(self) -> None:
        self.begin_step(-1)

    def report_memory(self, kv_bytes: int) -> None:
        self.log_memory(kv_bytes)

    def checksums(self) -> dict:
        return self.slot_checksums()

    def stats(self) -> dict:
        return {"bytes_fetched": self.slots.bytes_fetched, "owned_bytes": self.owners.nbytes,
                "slot_bytes": self.slots.nbytes, "padded_rounds": self.rounds["padded"],
                "counted_rounds": self.rounds["counted"],
                "exchanged_rounds": self.rounds["exchanged"]}

    def slot_checksums(self) -> dict:
        """sha256 of this rank's own slices, and of each piece fetched into a slot (from
        every owner), layer by layer: a peer's fetched pieces must equal its owner's."""
        own = [_digest(piece.tensors()) for piece in self.owners.local]
        fetched = []
        for layer in range(len(self.modules)):
            self.slots.ready(layer)
            slot = self.slots.slots[layer % len(self.slots.slots)]
            fetched.append([_digest(_piece_in_slot(slot, p, self.owners.local[layer].rows))
                            for p in range(len(self.owners.by_peer))])
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        return {"own": own, "fetched": fetched, "peers": list(self.peers.ranks)}


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`x` with zero rows added up to `rows` (itself where it has them)."""
    return x if x.shape[0] == rows else torch.nn.functional.pad(x, (0, 0, 0, rows - x.shape[0]))


def _piece_in_slot(slot: FfnSlice, p: int, s: int) -> list[torch.Tensor]:
    """Owner `p`'s slice as it lies in `slot`, its tensors in `FfnSlice.tensors`' order."""
    def rows_of(t):
        half = t.shape[0] // 2
        return torch.cat([t[p * s:(p + 1) * s], t[half + p * s:half + (p + 1) * s]])
    piece = FfnSlice(rows_of(slot.gate_up),
                     None if slot.gate_up_bias is None else rows_of(slot.gate_up_bias),
                     slot.down[:, p * s:(p + 1) * s].contiguous(),
                     None if slot.gate_up_scale is None else rows_of(slot.gate_up_scale))
    return piece.tensors()


def _digest(tensors: list[torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.detach().contiguous().cpu().flatten().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
