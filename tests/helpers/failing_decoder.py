"""A tokenizer for the output process whose decoding fails on one token id: a request whose
prompt ends with it cannot have its text made (the process cannot be monkeypatched)."""
FAILING_TOKEN = 1234


class FailingDecoder:
    """Decodes as `backend` (a `tokenizers.Tokenizer`) does, but raises ValueError("boom")
    on a window that holds FAILING_TOKEN."""

    def __init__(self, backend):
        self.backend = backend

    def decode(self, token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        if FAILING_TOKEN in token_ids:
            raise ValueError("boom")
        return self.backend.decode(token_ids, skip_special_tokens=skip_special_tokens)
