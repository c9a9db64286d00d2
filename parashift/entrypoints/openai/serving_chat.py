"""POST /v1/chat/completions: messages in, the assistant's reply out (JSON or SSE)."""
import uuid

from fastapi import Request
from fastapi.responses import Response

from parashift.engine.async_engine import RequestStream
from parashift.entrypoints.openai.logprobs import chat_logprobs
from parashift.entrypoints.openai.protocol import (AssistantMessage, ChatChoice,
                                                   ChatCompletionChunk, ChatCompletionRequest,
                                                   ChatCompletionResponse, ChatStreamChoice,
                                                   DeltaMessage, UsageInfo)
from parashift.entrypoints.openai.serving_base import (Handler,
                                                       build_sampling_params, final_output,
                                                       parse_body, respond, stream_events)

ROLE_FOR_TEMPLATE = {"developer": "system"}


class ChatServer(Handler):
    async def create(self, raw: Request) -> Response:
        ctx = self.ctx
        request = await parse_body(raw, ChatCompletionRequest, ctx.max_request_bytes)
        ctx.check_model(request.model)
        prompt_ids = ctx.render_chat(self.conversation(request))
        ctx.check_prompt_ids(prompt_ids)
        requested = request.requested_max_tokens
        params = build_sampling_params(request, requested, self.num_logprobs(request),
                                       logit_bias=ctx.logit_bias(request.logit_bias))
        params.max_tokens = ctx.fit_max_tokens(len(prompt_ids), requested)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        return await respond(ctx, raw, self, request, request_id, prompt_ids, params)

    @staticmethod
    def conversation(request) -> list[dict]:
        """The chat template's turns of `request.messages` (a chat or tokenize request)."""
        turns = []
        for message in request.messages:
            turn = {"role": ROLE_FOR_TEMPLATE.get(message.role, message.role),
                    "content": message.text()}
            if message.name:
                turn["name"] = message.name
            turns.append(turn)
        return turns

    @staticmethod
    def num_logprobs(request: ChatCompletionRequest) -> int | None:
        if not request.logprobs:
            return None
        return request.top_logprobs or 0

    def logprobs(self, request: ChatCompletionRequest, completion, first: int):
        if not request.logprobs or completion.logprobs is None:
            return None
        return chat_logprobs(self.ctx.decode_token, completion.token_ids[first:],
                             completion.logprobs[first:], request.top_logprobs or 0)

    async def collect(self, stream: RequestStream, request: ChatCompletionRequest):
        outputs = (await final_output(self.ctx, stream)).outputs
        choices = [ChatChoice(index=c.index, message=AssistantMessage(content=c.text),
                              finish_reason=c.finish_reason,
                              logprobs=self.logprobs(request, c, 0)) for c in outputs]
        usage = UsageInfo.of(stream.num_prompt_tokens, sum(len(c.token_ids) for c in outputs))
        return ChatCompletionResponse(id=stream.request_id, model=self.ctx.model_name,
                                      choices=choices, usage=usage)

    def stream(self, stream: RequestStream, request: ChatCompletionRequest):
        def choice(delta, finish, completion, sent_tokens, sent_chars):
            return ChatStreamChoice(index=completion.index, delta=DeltaMessage(content=delta),
                                    finish_reason=finish,
                                    logprobs=self.logprobs(request, completion, sent_tokens))

        def chunk(created, choices, usage=None):
            return self.chunk(stream, created, choices, usage)
        opening = tuple(ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                        for i in range(request.n or 1))
        return stream_events(self.ctx, stream, request.include_usage, choice, chunk, opening)

    def chunk(self, stream: RequestStream, created: int, choices, usage=None):
        return ChatCompletionChunk(id=stream.request_id, created=created,
                                   model=self.ctx.model_name, choices=choices, usage=usage)
