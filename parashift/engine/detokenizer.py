"""Incremental detokenization of one request's output, with stop strings."""
from parashift.sampling_params import SamplingParams

# Prompt tokens decoded ahead of the output, so that tokenizers that drop the leading
# space of the first decoded token (SentencePiece) still give the output's first space.
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Decodes a window of recent token ids on each append: the text of
    ids[prefix_offset:] minus that of ids[prefix_offset:read_offset] is new. A trailing
    U+FFFD (a character whose UTF-8 bytes are not all generated yet) is held back."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        self.tokenizer = tokenizer
        self.params = params
        self.token_ids = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
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
        if self.stopped or not new_token_ids:
            return None
        self.token_ids.extend(new_token_ids)
        old_len = len(self._text)
        self._text += self._decode_new_text(flush=False)
        return self._check_stop(old_len)

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
        full_text = self._decode(self.token_ids[self.prefix_offset:])
        if full_text.endswith(_REPLACEMENT_CHAR) and not flush:
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        return full_text[_common_prefix_len(prefix_text, full_text):]

    def _decode(self, token_ids: list[int]) -> str:
        # Cleaning up spaces looks across the window's edges and would differ from
        # decoding the whole output, so it stays off.
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

    def _possible_stop_prefix_len(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        longest = min(self._max_stop_len - 1, len(self._text) - self._sent)
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
