"""`--enable-log-requests`: one log line per request the server hands to the engine (its
id, prompt and sampling options), the prompt cut to `--max-log-len` characters or ids."""
import logging

from parashift.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class RequestLog:
    def __init__(self, max_log_len: int | None = None):
        self.max_log_len = max_log_len

    def log(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
            prompt_text: str | None = None) -> None:
        cut = self.max_log_len
        shown_ids = prompt_ids if cut is None else prompt_ids[:cut]
        text = prompt_text if prompt_text is None or cut is None else prompt_text[:cut]
        logger.info("Received request %s: prompt: %r, prompt_token_ids: %s, params: %s",
                    request_id, text, shown_ids, params)


def request_log(config) -> RequestLog | None:
    """The server's request log (a ServerConfig's), None unless --enable-log-requests."""
    return RequestLog(config.max_log_len) if config.enable_log_requests else None
