"""A draft model ("draft_model"): a smaller model of the target's tokenizer, run by the
engine on a one-device executor of its own (on the engine's device, beside the target's
ranks), with its own KV pool. It drafts greedily (a point-mass proposal, so verification
is rejection.py's rule): a step feeds each request the tokens its KV lacks (those after
the longest prefix it shares with what was fed before: rejected drafts are written over)
and samples the first draft token, then k - 1 one-token steps sample the others."""
import logging
import math

from parashift.executor.uniproc import UniprocExecutor
from parashift.loader.source import load_hf_config, resolve_model
from parashift.loader.tokenizer import load_tokenizer
from parashift.sampling_params import SamplingParams
from parashift.spec_decode.config import SpeculativeConfig
from parashift.spec_decode.proposer import Proposer
from parashift.step.encoder import DeltaEncoder
from parashift.step.message import StepBatch

logger = logging.getLogger(__name__)
GREEDY = SamplingParams(temperature=0.0)


class _DraftRequest:
    __slots__ = ("fed", "blocks")

    def __init__(self):
        self.fed: list[int] = []  # tokens whose KV the draft pool holds, in order
        self.blocks: list[int] = []


def check_same_tokenizer(target_tokenizer, target_vocab: int, draft_source,
                         draft_hf_config, trust_remote_code: bool) -> None:
    name = draft_source.describe()
    if draft_hf_config.vocab_size != target_vocab:
        raise ValueError(f"speculative_config: the draft model {name} does not share the "
                         f"target's tokenizer (vocabulary of {draft_hf_config.vocab_size} "
                         f"tokens, the target's {target_vocab})")
    if target_tokenizer is None:  # skip_tokenizer_init: the vocabulary size is all we know
        return
    draft_tokenizer = load_tokenizer(draft_source, None, trust_remote_code)
    if draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise ValueError(f"speculative_config: the draft model {name} does not share the "
                         "target's tokenizer (their vocabularies map tokens to other ids)")


def draft_memory_share(target_share: float) -> float:
    """The draft's --gpu-memory-utilization on the target's device: the target's pool
    already took `target_share` of it, so the draft's weights and KV take half of what is
    left (0.9 -> 0.95), the other half staying the two models' activation headroom. Where
    its pool runs out a request drafts nothing (no error); a lower share for the target
    leaves the draft more."""
    return target_share + (1.0 - target_share) / 2


# the draft's own CUDA graphs where the target's are on (measured on an H200: b1 k=1 22.1 -> 7.1 ms)
DRAFT_GRAPHS = True


def draft_engine_config(target, model: str):
    """The EngineConfig of the draft on the engine's device. With its own CUDA graphs (a
    one-token draft step of a 1B model is launch-bound: ~10 ms eager on an H200, beside
    the 8B target's ~5 ms graph step); eager where the target is."""
    return type(target)(
        model=model, device=target.device, dtype=target.dtype, seed=target.seed,
        max_num_seqs=target.max_num_seqs, block_size=target.block_size,
        max_num_batched_tokens=target.max_num_batched_tokens,
        num_blocks=target.num_blocks, kv_cache_memory=target.kv_cache_memory,
        gpu_memory_utilization=draft_memory_share(target.gpu_memory_utilization),
        load_format=target.load_format, attention_backend=target.attention_backend,
        deterministic=target.deterministic,
        cuda_graphs=(None if DRAFT_GRAPHS and target.cuda_graphs is not False else False),
        skip_tokenizer_init=True, trust_remote_code=target.trust_remote_code)


class DraftModelProposer(Proposer):

    def __init__(self, config: SpeculativeConfig, engine):
        target = engine.config
        source = resolve_model(config.model, target.load_format)
        hf_config = load_hf_config(source, target.trust_remote_code)
        check_same_tokenizer(engine.tokenizer, engine.vocab_size, source, hf_config,
                             target.trust_remote_code)
        self.max_model_len = min(engine.max_model_len,
                                 getattr(hf_config, "max_position_embeddings", None)
                                 or engine.max_model_len)
        draft = draft_engine_config(target, config.model)
        self.executor = UniprocExecutor(draft, hf_config, source, engine.device, engine.dtype,
                                        self.max_model_len)
        self.block_size, self.budget = draft.block_size, draft.max_num_batched_tokens
        self._free = list(range(self.executor.rank_blocks[0] - 1, -1, -1))
        self.encoder = DeltaEncoder()
        self._requests: dict[str, _DraftRequest] = {}
        logger.info("draft model %s loaded for speculative decoding", source.describe())

    def propose_all(self, items: list[tuple[str, list[int], int]]) -> list[list[int]]:
        """Greedy drafts of up to k tokens for each (request id, tokens, k)."""
        drafts = [[] for _ in items]
        live = [i for i, (rid, tokens, k) in enumerate(items)
                if len(tokens) + k <= self.max_model_len and self._reserve(rid, tokens, k)]
        if not live:
            return drafts
        for i, token in self._catch_up([items[i] for i in live], live).items():
            drafts[i].append(token)
        for step in range(1, max(items[i][2] for i in live)):
            going = [i for i in live if items[i][2] > step]
            if not going:
                break
            chunks = []
            for i in going:
                rid, tokens, _ = items[i]
                request = self._requests[rid]
                request.fed.append(drafts[i][-1])
                chunks.append(self.encoder.chunk(rid, [drafts[i][-1]], len(request.fed) - 1,
                                                 request.blocks, 1))
            for i, token in zip(going, self._launch(chunks, {})):
                drafts[i].append(token)
        return drafts

    def _reserve(self, request_id: str, tokens: list[int], k: int) -> bool:
        """The request's blocks for its tokens and k - 1 drafts fed; False: no room."""
        request = self._requests.get(request_id)
        if request is None:
            request = self._requests[request_id] = _DraftRequest()
        need = math.ceil((len(tokens) + k - 1) / self.block_size) - len(request.blocks)
        if need > len(self._free):
            return False
        request.blocks += [self._free.pop() for _ in range(max(0, need))]
        return True

    def _catch_up(self, items, indices) -> dict[int, int]:
        """Feeds each request what its KV lacks, in steps within the token budget; returns
        each one's first draft token."""
        todo = {}
        for index, (rid, tokens, _) in zip(indices, items):
            request = self._requests[rid]
            shared = _common_prefix(request.fed, tokens, len(tokens) - 1)
            request.fed = list(tokens)
            todo[index] = (rid, tokens, shared)
        first = {}
        while todo:
            chunks, new_params, owners, room = [], {}, [], self.budget
            for index, (rid, tokens, start) in list(todo.items()):
                if room <= 0:
                    break
                end = min(len(tokens), start + room)
                if self.encoder.is_new(rid):
                    new_params[rid] = GREEDY
                chunks.append(self.encoder.chunk(rid, tokens[start:end], start,
                                                 self._requests[rid].blocks,
                                                 int(end == len(tokens))))
                room -= end - start
                if end == len(tokens):
                    owners.append(index)
                    del todo[index]
                else:
                    todo[index] = (rid, tokens, end)
            first.update(zip(owners, self._launch(chunks, new_params)))
        return first

    def _launch(self, chunks, new_params) -> list[int]:
        batch = StepBatch(chunks, new_params, self.encoder.take_finished())
        self.executor.submit(None, (0,), 0, batch)
        (_, result), = self.executor.wait_any()
        tokens, errors = result[0], result[2]
        if errors:
            raise RuntimeError(f"the draft model failed: {errors}")
        return tokens

    def finish(self, request_id: str, output_token_ids: list[int]) -> None:
        request = self._requests.pop(request_id, None)
        if request is not None:
            self._free += request.blocks
            self.encoder.forget(request_id)


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
