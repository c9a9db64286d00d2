"""POST /v1/completions: text or token-id prompt in, completion out (JSON or SSE)."""
import uuid

from fastapi import Request
from fastapi.responses import Response

from parashift.engine.async_engine import RequestStream
from parashift.entrypoints.openai.errors import bad_request
from parashift.entrypoints.openai.logprobs import completion_logprobs
from parashift.entrypoints.openai.protocol import (CompletionChoice, CompletionRequest,
                                                   CompletionResponse, UsageInfo)
from parashift.entrypoints.openai.serving_base import (Handler,
                                                       build_sampling_params, final_output,
                                                       parse_body, respond, stream_events)


class CompletionServer(Handler):
    async def create(self, raw: Request) -> Response:
        ctx = self.ctx
        request = await parse_body(raw, CompletionRequest, ctx.max_request_bytes)
        ctx.check_model(request.model)
        prompt_ids = self.prompt_ids(request.prompt)
        ctx.check_prompt_ids(prompt_ids)
        given = request.max_tokens if "max_tokens" in request.model_fields_set else None
        max_tokens = ctx.default_max_tokens(given, request.max_tokens)
        params = build_sampling_params(request, max_tokens, request.logprobs,
                                       ctx.sampling_defaults, best_of=request.best_of,
                                       logit_bias=ctx.logit_bias(request.logit_bias))
        params.max_tokens = ctx.fit_max_tokens(len(prompt_ids), max_tokens)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        return await respond(ctx, raw, self, request, request_id, prompt_ids, params)

    def prompt_ids(self, prompt) -> list[int]:
        prompt = single_prompt(prompt)
        if isinstance(prompt, str):
            if not prompt:
                raise bad_request("the prompt is empty", param="prompt", code="empty_prompt")
            return self.ctx.encode(prompt)
        return list(prompt)

    def echo(self, request: CompletionRequest) -> str:
        """The prompt's text, which `echo` puts before each choice's."""
        if not request.echo:
            return ""
        prompt = single_prompt(request.prompt)
        return prompt if isinstance(prompt, str) else self.ctx.decode(prompt)

    async def collect(self, stream: RequestStream, request: CompletionRequest):
        outputs = (await final_output(self.ctx, stream)).outputs
        echo = self.echo(request)
        choices = [CompletionChoice(index=c.index, text=echo + c.text,
                                    finish_reason=c.finish_reason,
                                    logprobs=self.logprobs(request, c, 0, 0)) for c in outputs]
        usage = UsageInfo.of(stream.num_prompt_tokens, sum(len(c.token_ids) for c in outputs))
        return CompletionResponse(id=stream.request_id, model=self.ctx.model_name,
                                  choices=choices, usage=usage)

    def logprobs(self, request: CompletionRequest, completion, first: int, text_offset: int):
        if request.logprobs is None or completion.logprobs is None:
            return None
        return completion_logprobs(self.ctx.decode_token, completion.token_ids[first:],
                                   completion.logprobs[first:], request.logprobs, text_offset)

    def stream(self, stream: RequestStream, request: CompletionRequest):
        def choice(delta, finish, completion, sent_tokens, sent_chars):
            return CompletionChoice(index=completion.index, text=delta, finish_reason=finish,
                                    logprobs=self.logprobs(request, completion, sent_tokens,
                                                           sent_chars))

        def chunk(created, choices, usage=None):
            return self.chunk(stream, created, choices, usage)
        echo = self.echo(request)
        opening = tuple(CompletionChoice(index=i, text=echo) for i in range(request.n or 1)
                        if echo)
        return stream_events(self.ctx, stream, request.include_usage, choice, chunk, opening)

    def chunk(self, stream: RequestStream, created: int, choices, usage=None):
        return CompletionResponse(id=stream.request_id, created=created,
                                  model=self.ctx.model_name, choices=choices, usage=usage)


def single_prompt(prompt) -> str | list[int]:
    """The one prompt of a request (a list of one prompt is one prompt)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise bad_request("batched prompts are not supported; send one prompt per "
                              "request", param="prompt")
        return prompt[0]
    return prompt
