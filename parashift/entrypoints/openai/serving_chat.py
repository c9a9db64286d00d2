"""POST /v1/chat/completions: messages in, the assistant's reply out (JSON or SSE)."""
import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from parashift.engine.async_engine import EngineDeadError, RequestStream
from parashift.entrypoints.openai.logprobs import chat_logprobs
from parashift.entrypoints.openai.protocol import (AssistantMessage, ChatChoice,
                                                   ChatCompletionChunk, ChatCompletionRequest,
                                                   ChatCompletionResponse, ChatStreamChoice,
                                                   DeltaMessage, UsageInfo)
from parashift.entrypoints.openai.serving_base import (SSE_DONE, ServingContext,
                                                       build_sampling_params, engine_dead,
                                                       parse_body, sse_event, submit,
                                                       until_disconnect)

ROLE_FOR_TEMPLATE = {"developer": "system"}


class ChatServer:
    def __init__(self, ctx: ServingContext):
        self.ctx = ctx

    async def create(self, raw: Request) -> Response:
        ctx = self.ctx
        request = await parse_body(raw, ChatCompletionRequest, ctx.max_request_bytes)
        ctx.check_model(request.model)
        prompt_ids = ctx.render_chat(self.conversation(request))
        ctx.check_prompt_ids(prompt_ids)
        requested = request.requested_max_tokens
        params = build_sampling_params(request, requested, self.num_logprobs(request))
        params.max_tokens = ctx.fit_max_tokens(len(prompt_ids), requested)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        stream = await submit(ctx, request_id, prompt_ids, params, request.priority)
        if request.stream:
            return StreamingResponse(self.stream(stream, request),
                                     media_type="text/event-stream")
        response = await until_disconnect(raw, self.collect(stream, request))
        if response is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        return JSONResponse(response.model_dump())

    @staticmethod
    def conversation(request: ChatCompletionRequest) -> list[dict]:
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
        final = None
        try:
            async for output in stream:
                final = output
        except EngineDeadError as exc:
            raise engine_dead(exc) from None
        finally:
            if not stream.finished:
                self.ctx.engine.abort(stream.request_id)
        completion = final.outputs[0]
        choice = ChatChoice(message=AssistantMessage(content=completion.text),
                            finish_reason=completion.finish_reason,
                            logprobs=self.logprobs(request, completion, 0))
        usage = UsageInfo.of(stream.num_prompt_tokens, len(completion.token_ids))
        return ChatCompletionResponse(id=stream.request_id, model=self.ctx.model_name,
                                      choices=[choice], usage=usage)

    async def stream(self, stream: RequestStream, request: ChatCompletionRequest):
        created, sent_chars, sent_tokens = int(time.time()), 0, 0
        opening = ChatStreamChoice(delta=DeltaMessage(role="assistant", content=""))
        yield sse_event(self.chunk(stream, created, [opening]))
        try:
            async for output in stream:
                completion = output.outputs[0]
                delta = completion.text[sent_chars:]
                finish = completion.finish_reason if output.finished else None
                new_tokens = len(completion.token_ids) > sent_tokens
                if delta or finish or new_tokens:
                    choice = ChatStreamChoice(delta=DeltaMessage(content=delta),
                                              finish_reason=finish,
                                              logprobs=self.logprobs(request, completion,
                                                                     sent_tokens))
                    yield sse_event(self.chunk(stream, created, [choice]))
                sent_chars, sent_tokens = len(completion.text), len(completion.token_ids)
        except EngineDeadError as exc:
            yield sse_event(engine_dead(exc).body())
            yield SSE_DONE
            return
        finally:
            if not stream.finished:
                self.ctx.engine.abort(stream.request_id)
        if request.include_usage:
            usage = UsageInfo.of(stream.num_prompt_tokens, sent_tokens)
            yield sse_event(self.chunk(stream, created, [], usage))
        yield SSE_DONE

    def chunk(self, stream: RequestStream, created: int, choices, usage=None):
        return ChatCompletionChunk(id=stream.request_id, created=created,
                                   model=self.ctx.model_name, choices=choices, usage=usage)
