"""Incremental detokenization of the requests' outputs, with stop strings: one request at a
time, or every request of a step in two calls into the tokenizer's Rust backend."""
from parashift.sampling_params import SamplingParams

# Prompt tokens decoded ahead of the output, so that tokenizers that drop the leading
# space of the first decoded token (SentencePiece) still give the output's first space.
PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Decodes a window of recent token ids on each append: the text of
    ids[prefix_offset:] minus that of ids[prefix_offset:read_offset] is new. A trailing
    U+FFFD (a character whose UTF-8 bytes are not all generated yet) is held back."""
    __slots__ = ("tokenizer", "backend", "params", "token_ids", "prefix_offset", "read_offset",
                 "_text", "_sent", "_max_stop_len", "stop_reason")

    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        self.tokenizer = tokenizer
        self.backend = rust_backend(tokenizer)
        self.params = params
        self.token_ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self._text = ""
        self._sent = 0  # chars of _text already returned by take_delta
        self._max_stop_len = max((len(s) for s in params.stop), default=0)
        self.stop_reason: str | None = None

    @property
    def text(self) -> str:
        """The output text decoded so far; truncated at the stop string once one matched."""
        return self._text

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def append(self, new_token_ids: list[int]) -> str | None:
        """Feeds generated tokens; returns the stop string they completed, if any.
        Tokens appended after a stop string matched are ignored."""
        windows = self.extend(new_token_ids)
        if windows is None:
            return None
        return self.take_texts(*map(self._decode, windows))

    def extend(self, new_token_ids: list[int]) -> tuple[list[int], list[int]] | None:
        """Feeds generated tokens without decoding: the windows (prefix, full) whose texts
        `take_texts` needs next, or None when nothing is to decode."""
        if self.stopped or not new_token_ids:
            return None
        self.token_ids.extend(new_token_ids)
        if self.read_offset == len(self.token_ids):
            return None
        return (self.token_ids[self.prefix_offset:self.read_offset],
                self.token_ids[self.prefix_offset:])

    def take_texts(self, prefix_text: str, full_text: str) -> str | None:
        """The decoded windows of `extend`; returns the stop string they completed, if any."""
        if full_text.endswith(_REPLACEMENT_CHAR):  # held back: the window stays
            return None
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        if full_text.startswith(prefix_text):
            new_text = full_text[len(prefix_text):]
        else:
            new_text = full_text[_common_prefix_len(prefix_text, full_text):]
        if not new_text:  # the text the last check saw: no stop string can end in it now
            return None
        old_len = len(self._text)
        self._text += new_text
        return self._check_stop(old_len) if self._max_stop_len else None

    def take_delta(self, finished: bool = False) -> str:
        """Text new since the last call. Until `finished` (or a stop string matched), a
        tail of the text that could begin a stop string is withheld; `finished` also
        releases a held-back incomplete character (as U+FFFD, like tokenizer.decode)."""
        if finished and not self.stopped:
            old_len = len(self._text)
            self._text += self._decode_new_text(flush=True)
            self._check_stop(old_len)
        end = len(self._text)
        if not (finished or self.stopped):
            end -= self._possible_stop_prefix_len()
        if end <= self._sent:
            return ""
        delta, self._sent = self._text[self._sent:end], end
        return delta

    def _decode_new_text(self, flush: bool) -> str:
        if self.read_offset == len(self.token_ids):
            return ""
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        return self._advance(prefix_text, self._decode(self.token_ids[self.prefix_offset:]),
                             flush)

    def _advance(self, prefix_text: str, full_text: str, flush: bool) -> str:
        """The new text of the decoded windows; the window moves on past it."""
        if full_text.endswith(_REPLACEMENT_CHAR) and not flush:
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        return full_text[_common_prefix_len(prefix_text, full_text):]

    def _decode(self, token_ids: list[int]) -> str:
        # Cleaning up spaces looks across the window's edges and would differ from
        # decoding the whole output, so it stays off.
        if self.backend is not None:
            return self.backend.decode(token_ids,
                                       skip_special_tokens=self.params.skip_special_tokens)
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.params.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def _check_stop(self, old_len: int) -> str | None:
        """Finds the earliest stop string that ends in the text after `old_len` and
        truncates the text there."""
        best: tuple[int, str] | None = None
        for stop in self.params.stop:
            start = self._text.find(stop, max(0, old_len - len(stop) + 1))
            if start != -1 and (best is None or start < best[0]):
                best = (start, stop)
        if best is None:
            return None
        start, stop = best
        end = start + len(stop) if self.params.include_stop_str_in_output else start
        self._text = self._text[:end]
        self.stop_reason = stop
        return stop

    def shown_text(self) -> str:
        """The text a running request's output shows: without a tail that may still become
        a stop string (it would be taken back once the stop string completes), so that
        every output's text starts the next one's. The whole text once a stop matched."""
        if self.stopped or not self._max_stop_len:
            return self._text
        held = self._possible_stop_prefix_len(since=0)
        return self._text[:len(self._text) - held] if held else self._text

    def _possible_stop_prefix_len(self, since: int | None = None) -> int:
        """Length of the longest tail of the text after `since` (default: what take_delta
        returned) that is a proper prefix of a stop string."""
        since = self._sent if since is None else since
        longest = min(self._max_stop_len - 1, len(self._text) - since)
        for n in range(longest, 0, -1):
            tail = self._text[-n:]
            if any(stop.startswith(tail) for stop in self.params.stop):
                return n
        return 0


def _common_prefix_len(prefix_text: str, full_text: str) -> int:
    """len(prefix_text), except where the prompt context ended inside a character that
    the output completes: then the common part, and the output gets that character."""
    if full_text.startswith(prefix_text):
        return len(prefix_text)
    n = 0
    while n < min(len(prefix_text), len(full_text)) and prefix_text[n] == full_text[n]:
        n += 1
    return n


def rust_backend(tokenizer):
    """A fast tokenizer's `tokenizers.Tokenizer`, whose decode gives transformers' decode
    without space clean-up at a seventh of the cost (~2 µs against ~14 µs per window);
    None for a slow tokenizer."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    if isinstance(tokenizer, Tokenizer):  # the output process is given the backend alone
        return tokenizer
    backend = getattr(tokenizer, "_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


class TokenTexts:
    """Each token id's text decoded alone, per (Rust backend, skip_special_tokens), as the
    steps decode them: a request's window before its new token is, from its second output
    token on, its last token alone, so a step decodes one window per request, not two."""

    def __init__(self):
        self._texts: dict[tuple[int, bool], dict[int, str]] = {}
        self._backends: list = []  # kept alive, so that their ids in the keys stay theirs

    def of(self, backend, skip_special_tokens: bool) -> dict[int, str]:
        key = (id(backend), skip_special_tokens)
        texts = self._texts.get(key)
        if texts is None:
            texts = self._texts[key] = {}
            self._backends.append(backend)
        return texts


def append_all(detokenizers: list[IncrementalDetokenizer], tokens: list[int],
               token_texts: TokenTexts | None = None) -> list[str | Exception | None]:
    """`detokenizers[i].append([tokens[i]])` for every i, with every window decoded in at
    most two batch calls per (tokenizer, skip_special_tokens) where the tokenizer has a Rust
    backend (one-token windows found in `token_texts` are not decoded again); returns each
    one's stop string, or the exception its decoding raised (a batch that fails is decoded
    again one request at a time, so one bad request fails alone)."""
    results: list[str | Exception | None] = [None] * len(detokenizers)
    pending: dict[tuple, list[tuple[int, tuple[list[int], list[int]]]]] = {}
    for i, (detok, token) in enumerate(zip(detokenizers, tokens)):
        windows = detok.extend([token])
        if windows is None:
            continue
        if detok.backend is None:
            results[i] = _take_one(detok, windows)
        else:
            pending.setdefault((detok.backend, detok.params.skip_special_tokens), []).append(
                (i, windows))
    for (backend, skip), items in pending.items():
        known = token_texts.of(backend, skip) if token_texts is not None else {}
        try:
            prefixes = _decode_prefixes(backend, skip, [w[0] for _, w in items], known)
            fulls = backend.decode_batch([w[1] for _, w in items], skip_special_tokens=skip)
        except Exception:  # noqa: BLE001 - find which request's tokens it cannot decode
            for i, windows in items:
                results[i] = _take_one(detokenizers[i], windows)
            continue
        for (i, _), prefix, full in zip(items, prefixes, fulls):
            results[i] = _take_decoded(detokenizers[i], prefix, full)
    return results


def _decode_prefixes(backend, skip: bool, windows: list[list[int]], known: dict[int, str]
                     ) -> list[str]:
    """Each window's text: a one-token window's from `known` where it is there, the others
    in one batch call; the one-token windows decoded are added to `known`."""
    texts = [known.get(w[0]) if len(w) == 1 else None for w in windows]
    missing = [k for k, text in enumerate(texts) if text is None]
    if missing:
        decoded = backend.decode_batch([windows[k] for k in missing], skip_special_tokens=skip)
        for k, text in zip(missing, decoded):
            texts[k] = text
            if len(windows[k]) == 1:
                known[windows[k][0]] = text
    return texts


def _take_one(detok: IncrementalDetokenizer, windows) -> str | Exception | None:
    try:
        return detok.take_texts(*map(detok._decode, windows))
    except Exception as exc:  # noqa: BLE001 - e.g. a token id past the vocabulary
        return exc


def _take_decoded(detok: IncrementalDetokenizer, prefix: str, full: str
                  ) -> str | Exception | None:
    try:
        return detok.take_texts(prefix, full)
    except Exception as exc:  # noqa: BLE001 - one request's failure is its own
        return exc
