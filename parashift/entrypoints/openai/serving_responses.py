"""POST /v1/responses: OpenAI's Responses API over the chat template, text in and out.

`input` is a string (one user turn) or a list of messages; `instructions` goes first as a
system turn. Not streamed, the reply is a `response` object with one `message` output item;
streamed, the typed events `response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`
..., `response.output_text.done`, `response.content_part.done`, `response.output_item.done`
and `response.completed` (or `response.incomplete` when max_output_tokens cut it short);
a request cut short ends with an `error` event and `response.failed`."""
import itertools
import json
import uuid

from fastapi import Request
from fastapi.responses import Response

from parashift.engine.async_engine import RequestStream
from parashift.entrypoints.openai.errors import bad_request
from parashift.entrypoints.openai.protocol_responses import (IncompleteDetails, OutputMessage,
                                                             OutputText, ResponseError,
                                                             ResponseObject, ResponsesRequest,
                                                             ResponseUsage)
from parashift.entrypoints.openai.serving_base import (CUT_SHORT, Handler, api_error,
                                                       build_sampling_params, final_output,
                                                       parse_body, respond)

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesServer(Handler):
    async def create(self, raw: Request) -> Response:
        ctx = self.ctx
        request = await parse_body(raw, ResponsesRequest, ctx.max_request_bytes)
        ctx.check_model(request.model)
        prompt_ids = ctx.render_chat(conversation(request))
        ctx.check_prompt_ids(prompt_ids)
        requested = ctx.default_max_tokens(request.max_output_tokens, None)
        params = build_sampling_params(request, requested, None, ctx.sampling_defaults)
        await ctx.check_structured(params, "text")
        params.max_tokens = ctx.fit_max_tokens(len(prompt_ids), requested)
        request.temperature, request.top_p = params.temperature, params.top_p
        return await respond(ctx, raw, self, request, f"resp_{uuid.uuid4().hex}", prompt_ids,
                             params)

    def response(self, request: ResponsesRequest, response_id: str, status: str,
                 output: list[OutputMessage], usage: ResponseUsage | None = None,
                 error: ResponseError | None = None) -> ResponseObject:
        incomplete = IncompleteDetails(reason="max_output_tokens") \
            if status == "incomplete" else None
        return ResponseObject(
            id=response_id, status=status, error=error, incomplete_details=incomplete,
            instructions=request.instructions, max_output_tokens=request.max_output_tokens,
            model=self.ctx.model_name, output=output, temperature=request.temperature,
            top_p=request.top_p, usage=usage, user=request.user,
            metadata=request.metadata or {}, service_tier=request.service_tier,
            text=request.text.model_dump(by_alias=True, exclude_none=True)
            if request.text else {"format": {"type": "text"}})

    async def collect(self, stream: RequestStream, request: ResponsesRequest) -> ResponseObject:
        (completion, *_) = (await final_output(self.ctx, stream)).outputs
        status = _status(completion.finish_reason)
        message = OutputMessage(status=status, role=self.ctx.response_role,
                                content=[OutputText(text=completion.text)])
        usage = ResponseUsage.of(stream.num_prompt_tokens, len(completion.token_ids))
        return self.response(request, stream.request_id, status, [message], usage)

    async def stream(self, stream: RequestStream, request: ResponsesRequest):
        """The typed events of one streamed response (SSE, `event:` and `data:` lines)."""
        ctx, numbers = self.ctx, itertools.count()
        item = OutputMessage(status="in_progress", role=ctx.response_role)
        where = {"item_id": item.id, "output_index": 0, "content_index": 0}

        def event(kind: str, **fields) -> str:
            payload = {"type": kind, "sequence_number": next(numbers), **fields}
            return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

        opening = self.response(request, stream.request_id, "in_progress", []).model_dump()
        yield event("response.created", response=opening)
        yield event("response.in_progress", response=opening)
        yield event("response.output_item.added", output_index=0, item=item.model_dump())
        yield event("response.content_part.added", **where, part=OutputText(text="").model_dump())
        text, finish = [], None
        try:
            with ctx.deadline.watch(lambda: stream.put(ctx.deadline.error())):
                async for output in stream:
                    for completion in output.outputs:
                        finish = completion.finish_reason or finish
                        if completion.text:
                            text.append(completion.text)
                            yield event("response.output_text.delta", **where,
                                        delta=completion.text, logprobs=[])
        except CUT_SHORT as exc:
            error = api_error(exc)
            failed = self.response(request, stream.request_id, "failed", [],
                                   error=ResponseError(code=error.code, message=error.message))
            yield event("error", code=error.code, message=error.message, param=None)
            yield event("response.failed", response=failed.model_dump())
            return
        finally:
            if not stream.finished:
                ctx.engine.abort(stream.request_id)
        status, part = _status(finish), OutputText(text="".join(text))
        item.status, item.content = status, [part]
        yield event("response.output_text.done", **where, text=part.text, logprobs=[])
        yield event("response.content_part.done", **where, part=part.model_dump())
        yield event("response.output_item.done", output_index=0, item=item.model_dump())
        usage = ResponseUsage.of(stream.num_prompt_tokens, stream.num_output_tokens)
        done = self.response(request, stream.request_id, status, [item], usage)
        yield event(f"response.{status}", response=done.model_dump())


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def conversation(request: ResponsesRequest) -> list[dict]:
    """The chat template's turns: the instructions as a system turn, then the input."""
    turns = [{"role": "system", "content": request.instructions}] \
        if request.instructions is not None else []
    if isinstance(request.input, str):
        return [*turns, {"role": "user", "content": request.input}]
    if not request.input:
        raise bad_request("input: the list of input items is empty", param="input")
    return turns + [_turn(item, f"input[{i}]") for i, item in enumerate(request.input)]


def _turn(item: dict, where: str) -> dict:
    kind = item.get("type", "message")
    if kind != "message":
        raise bad_request(f"{where}: items of type {kind!r} are not supported here (text "
                          "messages only)", param="input")
    unknown = sorted(set(item) - {"type", "role", "content", "id", "status"})
    if unknown:
        raise bad_request(f"{where}: unknown field {unknown[0]!r}", param="input")
    role = ROLES.get(item.get("role"))
    if role is None:
        raise bad_request(f"{where}.role must be one of {sorted(ROLES)}, got "
                          f"{item.get('role')!r}", param="input")
    return {"role": role, "content": _text(item.get("content"), where)}


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of text parts",
                          param="input")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_request(f"{where}.content[{j}]: parts of type {kind!r} are not "
                              "supported here (text only)", param="input")
        texts.append(part["text"])
    return "".join(texts)
