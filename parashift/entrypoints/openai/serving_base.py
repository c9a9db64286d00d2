"""What /v1/completions and /v1/chat/completions share: model check, prompt
limits, sampling parameters, handing the request to the engine, SSE framing,
reading a size-limited body, aborting when the client goes away and ending what
still runs when the shutdown timeout passes."""
import asyncio
import copy
import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from parashift.engine.async_engine import (AsyncLLMEngine, ConstraintFailedError,
                                           EngineDeadError, QueueFullError, RequestFailedError,
                                           RequestStream)
from parashift.entrypoints.openai.compile_threads import CompileThreads
from parashift.entrypoints.openai.errors import APIError, bad_request, from_validation_error
from parashift.entrypoints.openai.protocol import SamplingFields, UsageInfo
from parashift.entrypoints.openai.request_checks import check_admission
from parashift.entrypoints.openai.shutdown import ShutdownDeadline, ShutdownTimeoutError
from parashift.outputs import CompletionOutput
from parashift.sampling_params import SamplingParams

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
                   "ignore_eos", "skip_special_tokens", "include_stop_str_in_output", "n",
                   "presence_penalty", "frequency_penalty", "repetition_penalty")
PARAM_NAMES = {"temperature", "top_p", "top_k", "min_p", "seed", "stop", "max_tokens",
               "logprobs", "prompt_logprobs", "n", "stop_token_ids", "best_of", "presence_penalty",
               "frequency_penalty", "repetition_penalty", "logit_bias"}
QUEUE_FULL_RETRY_AFTER_S = 1
logger = logging.getLogger(__name__)


@dataclass
class ServingContext:
    """The engine and the facts about the model that request handling needs."""
    engine: AsyncLLMEngine
    model_names: list[str]
    max_model_len: int
    vocab_size: int
    tokenizer: object = field(repr=False)
    deadline: ShutdownDeadline
    max_request_bytes: int = 1 << 22
    model_path: str | None = None  # as given to --model: accepted as a name too (as vLLM)
    sampling_defaults: dict = field(default_factory=dict)  # the model's generation config
    tool_call_parser: str | None = None  # --tool-call-parser
    enable_auto_tool_choice: bool = False
    response_role: str = "assistant"  # --response-role
    scheduling_policy: str = "priority"  # fcfs: a request's priority must be 0
    request_log: object = None  # a RequestLog with --enable-log-requests
    max_logprobs: int = 20  # the engine's: more per token is a 400
    template_ignores_tools: bool | None = None  # None: not known until tools are given
    compile_threads: CompileThreads = field(default_factory=CompileThreads, repr=False)

    @classmethod
    def from_engine(cls, async_engine: AsyncLLMEngine, served_model_names: list[str] | None,
                    max_request_bytes: int, deadline: ShutdownDeadline,
                    **tool_options) -> "ServingContext":
        llm = async_engine.engine
        names = list(served_model_names or []) or [llm.model_name]
        # The engine thread uses llm.tokenizer; the event loop gets its own copy.
        return cls(engine=async_engine, model_names=names, max_model_len=llm.max_model_len,
                   vocab_size=llm.vocab_size, tokenizer=copy.deepcopy(llm.tokenizer),
                   max_request_bytes=max_request_bytes, deadline=deadline,
                   model_path=getattr(getattr(llm, "config", None), "model", None),
                   sampling_defaults=dict(getattr(llm, "default_sampling", {})),
                   max_logprobs=getattr(getattr(llm, "config", None), "max_logprobs", 20),
                   **tool_options)

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    @property
    def accepted_model_names(self) -> list[str]:
        """The served names, then the model's path when it is not one of them."""
        path = [self.model_path] if self.model_path not in (None, *self.model_names) else []
        return self.model_names + path

    def check_model(self, requested: str | None) -> None:
        accepted = self.accepted_model_names
        if requested is not None and requested not in accepted:
            raise APIError(404, f"the model {requested!r} does not exist; this server "
                           f"serves {', '.join(map(repr, accepted))}", param="model",
                           code="model_not_found")

    def check_prompt_ids(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise bad_request("the prompt is empty", param="prompt", code="empty_prompt")
        self.check_vocabulary(token_ids, "prompt")

    def check_vocabulary(self, token_ids: list[int], param: str) -> None:
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise bad_request(f"{param}: token id {bad[0]} is out of vocabulary (valid ids "
                              f"are 0 to {self.vocab_size - 1})", param=param,
                              code="token_out_of_vocabulary")

    def default_max_tokens(self, requested: int | None, fallback: int | None) -> int | None:
        """The request's max_tokens when it set one, else the model's generation config's,
        else `fallback` (the endpoint's own default)."""
        if requested is not None:
            return requested
        return self.sampling_defaults.get("max_tokens", fallback)

    def logit_bias(self, bias: dict[str, float] | None) -> dict[int, float] | None:
        """OpenAI's {"token id": bias} with the ids checked against the vocabulary."""
        if not bias:
            return None
        ids = {}
        for key, value in bias.items():
            try:
                ids[int(key)] = value
            except ValueError:
                raise bad_request(f"logit_bias keys must be token ids, got {key!r}",
                                  param="logit_bias") from None
        self.check_vocabulary(list(ids), "logit_bias")
        return ids

    def fit_max_tokens(self, num_prompt_tokens: int, requested: int | None) -> int:
        """max_tokens to use; 400 naming both numbers when it cannot fit."""
        limit = self.max_model_len
        wanted = num_prompt_tokens + (requested if requested is not None else 1)
        if wanted > limit:
            asked = f" and {requested if requested is not None else 'at least 1'} to generate"
            raise bad_request(
                f"this model's maximum context length is {limit} tokens, but the request "
                f"needs {wanted}: {num_prompt_tokens} in the prompt{asked}; shorten the "
                "prompt or lower max_tokens", param="prompt" if num_prompt_tokens >= limit
                else "max_tokens",
                code="context_length_exceeded")
        return requested if requested is not None else limit - num_prompt_tokens

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.require_tokenizer("prompt")
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: list[int]) -> str:
        self.require_tokenizer("tokens")
        return self.tokenizer.decode(token_ids)

    def require_tokenizer(self, param: str) -> None:
        if self.tokenizer is None:
            raise bad_request("this model has no tokenizer (it was started without one): "
                              "use token ids", param=param, code="no_tokenizer")

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:
        """Prompt ids of a conversation, by default with the assistant's turn opened; the
        first time `tools` are given, a warning if the template leaves them out."""
        ids = self._render(messages, add_generation_prompt, tools)
        if tools and self.template_ignores_tools is None:
            self.template_ignores_tools = ids == self._render(messages, add_generation_prompt)
            if self.template_ignores_tools:
                logger.warning("the chat template does not render `tools`: the model is not "
                               "shown the tools a request gives, so it will not call them; "
                               "serve it with a --chat-template that renders them")
        return ids

    def _render(self, messages: list[dict], add_generation_prompt: bool,
                tools: list[dict] | None = None) -> list[int]:
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise bad_request("this model has no chat template; use /v1/completions",
                              param="messages")
        try:
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                return_dict=False, tools=tools)
        except Exception as exc:  # noqa: BLE001 - template errors come from jinja
            raise bad_request(f"the chat template cannot render these messages: "
                              f"{_first_line(exc)}", param="messages") from None
        return list(ids)

    async def check_structured(self, params: SamplingParams, param: str | None) -> None:
        """400 naming `param` if the output's constraint cannot be compiled (compiled here,
        off the event loop, into the cache the engine then uses)."""
        if params.structured_outputs is None:
            return
        try:
            compiler = self.engine.engine.structured.compiler
            await self.compile_threads.run(compiler.grammar_for, params.structured_outputs)
        except ValueError as exc:
            raise bad_request(str(exc), param=param, code="invalid_structured_output") from None

    def decode_token(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


class Handler:
    """The handler of a family of routes, over the serving context."""

    def __init__(self, ctx: ServingContext):
        self.ctx = ctx


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def build_sampling_params(request: SamplingFields, max_tokens: int | None,
                          logprobs: int | None, defaults: dict | None = None,
                          **options) -> SamplingParams:
    """SamplingParams from the request fields set, over `defaults` (the model's generation
    config) for those it leaves unset, and `options` (fields the routes translate); 400
    with the engine's message."""
    kwargs = {name: value for name, value in (defaults or {}).items() if name != "max_tokens"}
    kwargs.update({name: getattr(request, name) for name in SAMPLING_FIELDS
                   if getattr(request, name, None) is not None})
    try:
        return SamplingParams(max_tokens=max_tokens, logprobs=logprobs,
                              structured_outputs=request.structured_outputs_params(),
                              **kwargs, **options)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        first_word = message.split(" ", 1)[0]
        raise bad_request(message, param=first_word if first_word in PARAM_NAMES else None,
                          code="invalid_sampling_params") from None


async def submit(ctx: ServingContext, request_id: str, prompt_ids: list[int],
                 params: SamplingParams, priority: int) -> RequestStream:
    """Hands the request to the engine, mapping its refusals to HTTP errors."""
    check_admission(ctx, request_id, prompt_ids, params, priority)
    try:
        return await ctx.engine.add_request(request_id, prompt_ids, params, priority,
                                            num_prompt_tokens=len(prompt_ids))
    except QueueFullError as exc:
        raise APIError(503, f"the server is overloaded: {exc}", code="queue_full",
                       headers={"Retry-After": str(QUEUE_FULL_RETRY_AFTER_S)}) from None
    except EngineDeadError as exc:
        raise api_error(exc) from None
    except ValueError as exc:
        first_word = str(exc).split(" ", 1)[0]
        raise bad_request(str(exc), param=first_word if first_word in PARAM_NAMES
                          else "prompt") from None
    except RuntimeError as exc:
        raise APIError(500, str(exc), code="engine_error") from None


# How a request that was running ends when it cannot finish: (status, code).
ENDINGS = {EngineDeadError: (500, "engine_dead"),
           ConstraintFailedError: (400, "invalid_structured_output"),
           RequestFailedError: (500, "request_failed"),
           ShutdownTimeoutError: (503, "shutdown_timeout")}
CUT_SHORT = tuple(ENDINGS)


def api_error(exc: Exception) -> APIError:
    """The error a client gets for one of CUT_SHORT."""
    status, code = next(ENDINGS[kind] for kind in ENDINGS if isinstance(exc, kind))
    return APIError(status, str(exc), code=code)


async def parse_body(request: Request, model: type[BaseModel], limit: int):
    """Reads at most `limit` bytes (413 beyond) and validates them (400)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    body = b"".join(chunks)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than the server's limit of {limit} "
                    "bytes", code="request_too_large")


async def respond(ctx: ServingContext, raw: Request, server, request, request_id: str,
                  prompt_ids: list[int], params: SamplingParams) -> Response:
    """Submits the request, then streams it (SSE) or answers once it is done
    (`server.stream` / `server.collect` of its stream and the request)."""
    return await respond_batch(ctx, raw, _OnePrompt(server), request, request_id,
                               [(prompt_ids, params)])


@dataclass
class _OnePrompt:
    """A handler of one prompt a request as respond_batch calls it."""
    server: object

    def stream(self, streams: list[RequestStream], request, request_id: str):
        return self.server.stream(streams[0], request)

    def collect(self, streams: list[RequestStream], request, request_id: str):
        return self.server.collect(streams[0], request)


async def respond_batch(ctx: ServingContext, raw: Request, server, request, request_id: str,
                        prompts: list[tuple[list[int], SamplingParams]]) -> Response:
    """Submits the request's prompts (one engine request each: `request_id`, or
    `request_id-i` for a batch), then streams them (SSE) or answers once all are done
    (`server.stream` / `server.collect` of the streams, the request and its id); a JSON
    503 if the shutdown timeout passes first."""
    try:
        async with ctx.deadline.bound():
            streams = await submit_all(ctx, request_id, prompts, request.stream,
                                       request.priority)
            if request.stream:
                return StreamingResponse(server.stream(streams, request, request_id),
                                         media_type="text/event-stream")
            response = await until_disconnect(raw, server.collect(streams, request,
                                                                  request_id))
    except ShutdownTimeoutError as exc:
        raise api_error(exc) from None
    if response is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    return JSONResponse(response.model_dump())


async def submit_all(ctx: ServingContext, request_id: str,
                     prompts: list[tuple[list[int], SamplingParams]], stream: bool,
                     priority: int) -> list[RequestStream]:
    """Hands every prompt to the engine; a refusal aborts those handed over before it."""
    streams = []
    try:
        for i, (prompt_ids, params) in enumerate(prompts):
            if not stream:  # answered once: the engine makes the last output only
                params = params.final_only()
            else:  # each output with what is new: the engine loop copies no growing output
                params = dataclasses.replace(params, output_kind="delta")
            one_id = request_id if len(prompts) == 1 else f"{request_id}-{i}"
            streams.append(await submit(ctx, one_id, prompt_ids, params, priority))
    except BaseException:
        for earlier in streams:
            ctx.engine.abort(earlier.request_id)
        raise
    return streams


async def final_outputs(ctx: ServingContext, streams: list[RequestStream]) -> list:
    """Every stream's last output, in order; the others are aborted if one fails."""
    tasks = [asyncio.ensure_future(final_output(ctx, stream)) for stream in streams]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


async def final_output(ctx: ServingContext, stream: RequestStream):
    """The request's last output (non-streaming); aborts it if the caller goes away."""
    final = None
    try:
        async for output in stream:
            final = output
    except CUT_SHORT as exc:
        raise api_error(exc) from None
    finally:
        if not stream.finished:
            ctx.engine.abort(stream.request_id)
    return final


async def stream_events(ctx: ServingContext, stream: RequestStream, include_usage: bool,
                        make_choice, make_chunk, opening: tuple = (), shown=None):
    """stream_batch_events of one stream, whose make_choice takes no output."""
    def choice(delta, finish, completion, sent_tokens, sent_chars, output):
        return make_choice(delta, finish, completion, sent_tokens, sent_chars)
    async for event in stream_batch_events(ctx, [(stream, choice)], include_usage, make_chunk,
                                           opening, shown):
        yield event


async def stream_batch_events(ctx: ServingContext, sources: list[tuple[RequestStream, object]],
                              include_usage: bool, make_chunk, opening: tuple = (),
                              shown=None):
    """SSE events of streamed requests (a batch's prompts, their chunks interleaved as
    they come): the chunks, then the usage (when asked, summed) and [DONE]; a request
    cut short (engine dead, request failed, shutdown timeout) ends the response with an
    error event and [DONE]. A client that goes away aborts the requests.
    `sources`: each stream with its make_choice(delta, finish, completion, sent_tokens,
    sent_chars, output), which builds a choice; make_chunk(created, choices, usage=None) a chunk;
    shown(completion, finished) the text shown so far (all of it by default; a tool
    call's text is held back)."""
    created = int(time.time())
    streams = [stream for stream, _ in sources]
    for choice in opening:
        yield sse_event(make_chunk(created, [choice]))
    try:
        with ctx.deadline.watch(lambda: [s.put(ctx.deadline.error()) for s in streams]):
            async for event in merged([_output_events(stream, created, make_choice, make_chunk,
                                                      shown) for stream, make_choice in sources]):
                yield event
    except CUT_SHORT as exc:
        yield sse_event(api_error(exc).body())
        yield SSE_DONE
        return
    finally:
        for stream in streams:
            if not stream.finished:
                ctx.engine.abort(stream.request_id)
    if include_usage:
        usage = UsageInfo.of(sum(s.num_prompt_tokens for s in streams),
                             sum(s.num_output_tokens for s in streams))
        yield sse_event(make_chunk(created, [], usage))
    yield SSE_DONE


async def merged(generators: list):
    """The items of several async generators as they come (one: as it is)."""
    if len(generators) == 1:
        async for item in generators[0]:
            yield item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(generator):
        try:
            async for item in generator:
                queue.put_nowait(item)
        except Exception as exc:  # noqa: BLE001 - raised where the items are read
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(done)
    tasks = [asyncio.ensure_future(pump(g)) for g in generators]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is done:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


async def _output_events(stream: RequestStream, created: int, make_choice, make_chunk, shown):
    """A chunk for every choice (one per sample) whose output brings new text, new
    tokens or its finish; `shown(completion, finished)`, where given, is the text a
    client may see so far (tool calls held back)."""
    sent: dict[int, tuple[int, int]] = {}  # by choice index: chars and tokens sent
    finished: set[int] = set()
    so_far: dict[int, CompletionOutput] = {}  # by choice index, the deltas joined
    async for output in stream:
        for completion in output.outputs:
            if stream.delta:
                completion = _joined(so_far, completion)
            index = completion.index
            sent_chars, sent_tokens = sent.get(index, (0, 0))
            done = output.finished or completion.finish_reason is not None
            text = completion.text if shown is None else shown(completion, done)
            delta = text[sent_chars:]
            finish = completion.finish_reason if index not in finished else None
            if delta or finish or len(completion.token_ids) > sent_tokens:
                choice = make_choice(delta, finish, completion, sent_tokens, sent_chars, output)
                yield sse_event(make_chunk(created, [choice]))
            sent[index] = len(text), len(completion.token_ids)
            if finish:
                finished.add(index)


def _joined(so_far: dict[int, CompletionOutput], delta: CompletionOutput) -> CompletionOutput:
    """A sample's output so far, `delta` added (its lists grow in place: no copies)."""
    whole = so_far.get(delta.index)
    if whole is None:
        whole = so_far[delta.index] = dataclasses.replace(
            delta, token_ids=list(delta.token_ids),
            logprobs=None if delta.logprobs is None else list(delta.logprobs))
        return whole
    whole.text += delta.text
    whole.token_ids.extend(delta.token_ids)
    if delta.logprobs is not None and whole.logprobs is None:
        whole.logprobs = list(delta.logprobs)
    elif delta.logprobs is not None:
        whole.logprobs.extend(delta.logprobs)
    whole.finish_reason, whole.stop_reason = delta.finish_reason, delta.stop_reason
    return whole


# characters JSON may leave raw that str.splitlines (and so httpx's `aiter_lines`) takes for
# line ends: escaped, an event stays on its line for every client (the JSON is the same)
_LINE_BREAKS_ESCAPED = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028",
                                      "\u2029": "\\u2029"})


def sse_event(payload: BaseModel | dict) -> str:
    if isinstance(payload, BaseModel):
        return f"data: {payload.model_dump_json().translate(_LINE_BREAKS_ESCAPED)}\n\n"
    return f"data: {json.dumps(payload)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


async def until_disconnect(request: Request, work):
    """Runs the coroutine `work`; if the client disconnects first, cancels it
    (its own cleanup aborts the request) and returns None."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
