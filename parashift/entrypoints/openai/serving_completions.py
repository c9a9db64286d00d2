"""POST /v1/completions: text or token-id prompts in (one, or a batch), completions out
(JSON or SSE): a choice per prompt and sample, numbered prompt_index * n + sample."""
import dataclasses
import uuid

from fastapi import Request
from fastapi.responses import Response

from parashift.engine.async_engine import RequestStream
from parashift.entrypoints.openai.completion_prompts import prompts_of
from parashift.entrypoints.openai.errors import bad_request
from parashift.entrypoints.openai.logprobs import (completion_logprobs, echo_logprobs,
                                                   joined_logprobs, prompt_logprobs_field)
from parashift.entrypoints.openai.protocol import (CompletionChoice, CompletionRequest,
                                                   CompletionResponse, UsageInfo)
from parashift.entrypoints.openai.serving_base import (Handler, build_sampling_params,
                                                       final_outputs, parse_body,
                                                       respond_batch, stream_batch_events)
from parashift.outputs import CompletionOutput, RequestOutput


class CompletionServer(Handler):
    async def create(self, raw: Request) -> Response:
        ctx = self.ctx
        request = await parse_body(raw, CompletionRequest, ctx.max_request_bytes)
        ctx.check_model(request.model)
        prompts = [self.prompt_ids(prompt) for prompt in prompts_of(request.prompt)]
        for prompt_ids in prompts:
            ctx.check_prompt_ids(prompt_ids)
        given = request.max_tokens if "max_tokens" in request.model_fields_set else None
        max_tokens = ctx.default_max_tokens(given, request.max_tokens)
        params = build_sampling_params(request, max_tokens, request.logprobs,
                                       ctx.sampling_defaults, best_of=request.best_of,
                                       logit_bias=ctx.logit_bias(request.logit_bias),
                                       prompt_logprobs=self.num_prompt_logprobs(request))
        batch = []
        for prompt_ids in prompts:
            one = params if len(prompts) == 1 else dataclasses.replace(params)
            one.max_tokens = ctx.fit_max_tokens(len(prompt_ids), max_tokens)
            batch.append((prompt_ids, one))
        request_id = f"cmpl-{uuid.uuid4().hex}"
        return await respond_batch(ctx, raw, self, request, request_id, batch)

    @staticmethod
    def num_prompt_logprobs(request: CompletionRequest) -> int | None:
        """vLLM's prompt_logprobs where given, else `logprobs` when the prompt is echoed."""
        if request.prompt_logprobs is not None:
            return request.prompt_logprobs
        return request.logprobs if request.echo else None

    def prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise bad_request("the prompt is empty", param="prompt", code="empty_prompt")
            return self.ctx.encode(prompt)
        return list(prompt)

    def echo(self, request: CompletionRequest, output: RequestOutput) -> str:
        """The prompt's text, which `echo` puts before each choice's."""
        if not request.echo:
            return ""
        if output.prompt is not None:
            return output.prompt
        return self.ctx.decode(output.prompt_token_ids)

    async def collect(self, streams: list[RequestStream], request: CompletionRequest,
                      request_id: str):
        finals = await final_outputs(self.ctx, streams)
        choices = []
        for prompt_index, final in enumerate(finals):
            echo = self.echo(request, final)
            shown_prompt_logprobs = prompt_logprobs_field(final.prompt_logprobs) \
                if request.prompt_logprobs is not None else None
            for c in final.outputs:
                choices.append(CompletionChoice(
                    index=self.choice_index(request, prompt_index, c), text=echo + c.text,
                    finish_reason=c.finish_reason, prompt_logprobs=shown_prompt_logprobs,
                    logprobs=self.logprobs(request, final, c, 0, 0, echo)))
        usage = UsageInfo.of(sum(s.num_prompt_tokens for s in streams),
                             sum(len(c.token_ids) for f in finals for c in f.outputs))
        return CompletionResponse(id=request_id, model=self.ctx.model_name,
                                  choices=choices, usage=usage)

    @staticmethod
    def choice_index(request: CompletionRequest, prompt_index: int,
                     completion: CompletionOutput) -> int:
        return prompt_index * (request.n or 1) + completion.index

    def logprobs(self, request: CompletionRequest, output: RequestOutput,
                 completion: CompletionOutput, first: int, text_offset: int, echo: str):
        """The choice's logprobs from its token `first` on; with `echo` (the first chunk
        of a choice), the prompt's tokens before them."""
        if request.logprobs is None:
            return None
        generated = None
        if completion.logprobs is not None:
            generated = completion_logprobs(self.ctx.decode_token, completion.token_ids[first:],
                                            completion.logprobs[first:], request.logprobs,
                                            text_offset + len(echo))
        if not echo or output.prompt_logprobs is None:
            return generated
        prompt = echo_logprobs(self.ctx.decode_token, output.prompt_token_ids,
                               output.prompt_logprobs, request.logprobs)
        return joined_logprobs(prompt, generated)

    def stream(self, streams: list[RequestStream], request: CompletionRequest,
               request_id: str):
        def source(prompt_index: int):
            seen: dict = {}  # the prompt's first output (its text, its prompt logprobs)

            def choice(delta, finish, completion, sent_tokens, sent_chars, output):
                if not seen:
                    seen.update(output=output, echo=self.echo(request, output))
                first, echo = seen["output"], seen["echo"]
                opening = sent_tokens == 0 and sent_chars == 0  # the choice's first chunk
                shown = prompt_logprobs_field(first.prompt_logprobs) \
                    if opening and request.prompt_logprobs is not None else None
                return CompletionChoice(
                    index=self.choice_index(request, prompt_index, completion),
                    text=(echo if opening else "") + delta, finish_reason=finish,
                    prompt_logprobs=shown,
                    logprobs=self.logprobs(request, first, completion, sent_tokens,
                                           sent_chars + (0 if opening else len(echo)),
                                           echo if opening else ""))
            return streams[prompt_index], choice

        def chunk(created, choices, usage=None):
            return CompletionResponse(id=request_id, created=created,
                                      model=self.ctx.model_name, choices=choices, usage=usage)
        return stream_batch_events(self.ctx, [source(i) for i in range(len(streams))],
                             request.include_usage, chunk)
