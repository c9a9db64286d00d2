"""`--enable-log-requests`: one log line per request the server hands to the engine (its
id, prompt token ids and sampling options), the prompt cut to `--max-log-len` ids."""
import logging

from parashift.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class RequestLog:
    def __init__(self, max_log_len: int | None = None):
        self.max_log_len = max_log_len

    def log(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        shown = prompt_ids if self.max_log_len is None else prompt_ids[:self.max_log_len]
        logger.info("Received request %s: prompt_token_ids: %s (%d tokens), params: %s",
                    request_id, shown, len(prompt_ids), params)


def request_log(config) -> RequestLog | None:
    """The server's request log (a ServerConfig's), None unless --enable-log-requests."""
    return RequestLog(config.max_log_len) if config.enable_log_requests else None
