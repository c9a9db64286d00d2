"""Compiles a request's constraint into an xgrammar grammar, once per distinct
constraint (schema, regex, choice list or grammar text)."""
import functools
import json
import re
import threading

from parashift.structured.params import StructuredOutputsParams

# Whitespace JSON may hold between tokens, at most this many characters at a time: a
# sampled model may otherwise spend its whole budget on blank lines.
MAX_JSON_WHITESPACE = 4
CACHE_SIZE = 256
LABELS = {"json": "the JSON schema", "regex": "the regex", "choice": "the choice list",
          "grammar": "the grammar", "json_object": "json_object"}


class InvalidGrammarError(ValueError):
    """A constraint xgrammar cannot compile (a bad schema, regex or grammar)."""


class GrammarCompiler:
    """xgrammar's compiler for one tokenizer and vocabulary, with a bounded cache of
    compiled grammars keyed by the constraint. Safe to call from several threads."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: set[int]):
        import xgrammar as xgr
        if tokenizer is None:
            raise ValueError("structured output needs the model's tokenizer")
        self.info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids) or None)
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._lock = threading.Lock()
        self.compile = functools.lru_cache(CACHE_SIZE)(self._compile_key)

    def grammar_for(self, params: StructuredOutputsParams):
        return self.compile(params.key())

    def _compile_key(self, key: tuple[str, str]):
        kind, text = key
        with self._lock:
            try:
                grammar = self._compile(kind, text)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise InvalidGrammarError(f"{LABELS[kind]} cannot be used for structured "
                                          f"output: {_reason(exc)}") from None
            import xgrammar as xgr
            if not allows_any_token(xgr.GrammarMatcher(grammar), self.info.vocab_size):
                raise InvalidGrammarError(f"{LABELS[kind]} cannot be used for structured "
                                          "output: no token of the model's vocabulary can "
                                          "begin it")
            return grammar

    def _compile(self, kind: str, text: str):
        c = self._compiler
        if kind == "json":
            return c.compile_json_schema(text, max_whitespace_cnt=MAX_JSON_WHITESPACE)
        if kind == "json_object":
            return c.compile_json_schema('{"type": "object"}',
                                         max_whitespace_cnt=MAX_JSON_WHITESPACE)
        if kind == "regex":
            return c.compile_regex(text)
        if kind == "choice":
            alternatives = " | ".join(json.dumps(choice) for choice in json.loads(text))
            return c.compile_grammar(f"root ::= {alternatives}")
        return c.compile_grammar(text)


def _reason(exc: Exception) -> str:
    """xgrammar's message without its '[time] path/file.cc:line: ' prefix."""
    message = str(exc).strip()
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", message).splitlines()[0][:300]


def allows_any_token(matcher, vocab_size: int) -> bool:
    """Whether the matcher lets some token (or the end) come next: no token spells some
    characters a constraint may ask for, and then every sample would be refused."""
    import xgrammar as xgr
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0)
    return bool(bitmask.ne(0).any())
