"""Suffix decoding (SuffixDecoding, Oliaro et al., 2024): a bounded-depth suffix trie over
each request's prompt and output, and one over the outputs of the server's recent
requests (a global cache). A step matches the longest suffix of the context in either
trie, then follows the most frequent continuation while its estimated probability (the
product of each step's count ratio) stays at or above a threshold, for at most
`max_spec_factor` draft tokens per matched token: the draft is as long as the match
frequency says it pays, and empty (a plain decode) where nothing matches well enough."""
from collections import OrderedDict

from parashift.spec_decode.config import SpeculativeConfig
from parashift.spec_decode.proposer import Proposer


class _Node:
    __slots__ = ("count", "children")

    def __init__(self):
        self.count = 0
        self.children: dict[int, "_Node"] = {}


class SuffixTrie:
    """Every substring of the inserted sequences up to `depth` tokens, each with how often
    it occurs. A sequence is appended token by token: the suffixes it is building (those
    shorter than `depth`) each grow by the token."""

    def __init__(self, depth: int):
        self.depth = depth
        self.root = _Node()

    def extend(self, open_nodes: list[_Node], tokens: list[int]) -> list[_Node]:
        """Appends `tokens` to a sequence whose growing suffixes end at `open_nodes` (its
        deepest first); returns them after."""
        depth = self.depth
        for token in tokens:
            grown = []
            for node in (*open_nodes, self.root):
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                child.count += 1
                grown.append(child)
            open_nodes = grown[-(depth - 1):] if depth > 1 else []
        return open_nodes

    def remove(self, tokens: list[int]) -> None:
        """Takes one inserted sequence out again (its counts down, empty nodes gone)."""
        for start in range(len(tokens)):
            path, node = [], self.root
            for token in tokens[start:start + self.depth]:
                path.append((node, token))
                node = node.children[token]
            for parent, token in reversed(path):
                child = parent.children[token]
                child.count -= 1
                if child.count == 0:
                    del parent.children[token]

    def match(self, context: list[int]) -> tuple[_Node | None, int]:
        """The node of the longest suffix of `context` (shorter than the depth) that has a
        continuation, and its length."""
        for length in range(min(self.depth - 1, len(context)), 0, -1):
            node = self.root
            for token in context[len(context) - length:]:
                node = node.children.get(token)
                if node is None:
                    break
            if node is not None and node.children:
                return node, length
        return None, 0


def best_path(node: _Node, limit: int, min_prob: float) -> tuple[list[int], float]:
    """The most frequent continuation from `node`: at most `limit` tokens, each taken while
    the path's estimated probability stays >= min_prob; with the sum of those probabilities
    (the expected number of accepted tokens)."""
    path, prob, score = [], 1.0, 0.0
    while len(path) < limit and node.children:
        total = sum(child.count for child in node.children.values())
        token, child = max(node.children.items(), key=lambda item: item[1].count)
        prob *= child.count / total
        if prob < min_prob:
            break
        path.append(token)
        score += prob
        node = child
    return path, score


class _RequestTrie:
    __slots__ = ("trie", "open_nodes", "inserted")

    def __init__(self, depth: int):
        self.trie, self.open_nodes, self.inserted = SuffixTrie(depth), [], 0


class SuffixProposer(Proposer):

    def __init__(self, config: SpeculativeConfig):
        self.depth = config.suffix_decoding_max_tree_depth
        self.max_cached = config.suffix_decoding_max_cached_requests
        self.spec_factor = config.suffix_decoding_max_spec_factor
        self.min_prob = config.suffix_decoding_min_token_prob
        self.global_trie = SuffixTrie(self.depth)
        self._cached: OrderedDict[str, list[int]] = OrderedDict()  # outputs in the global trie
        self._requests: dict[str, _RequestTrie] = {}

    def propose(self, request_id: str, tokens: list[int], k: int) -> list[int]:
        local = self._requests.get(request_id)
        if local is None:
            local = self._requests[request_id] = _RequestTrie(self.depth)
        # the request's own trie holds its tokens but the last (whose suffixes have no
        # continuation yet): a match is an earlier occurrence
        local.open_nodes = local.trie.extend(local.open_nodes, tokens[local.inserted:-1])
        local.inserted = max(local.inserted, len(tokens) - 1)
        best, best_score = [], 0.0
        for trie in (local.trie, self.global_trie):
            node, length = trie.match(tokens)
            if node is None:
                continue
            limit = min(k, max(1, int(self.spec_factor * length)))
            path, score = best_path(node, limit, self.min_prob)
            if score > best_score:
                best, best_score = path, score
        return best

    def finish(self, request_id: str, output_token_ids: list[int]) -> None:
        """The request's output joins the global cache (the oldest leaves past its size)."""
        self._requests.pop(request_id, None)
        if not output_token_ids or request_id in self._cached:
            return
        self.global_trie.extend([], output_token_ids)
        self._cached[request_id] = list(output_token_ids)
        while len(self._cached) > self.max_cached:
            _, old = self._cached.popitem(last=False)
            self.global_trie.remove(old)
