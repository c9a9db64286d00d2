"""The bodies of POST /v1/responses (OpenAI's Responses API), text in and out.

Fields the API defines that parashift cannot honour are refused by name (a 400), never
ignored: built-in and function tools, `previous_response_id` (responses are not stored),
`background`, `reasoning`, `include`, `truncation: auto`, `top_logprobs`."""
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field, StrictBool, model_validator

from parashift.entrypoints.openai.protocol import StrictModel, _finite_float
from parashift.sampling_params import SEED_MAX, SEED_MIN
from parashift.structured import StructuredOutputsParams

BUILT_IN_TOOLS = ("web_search", "web_search_preview", "file_search", "computer_use_preview",
                  "code_interpreter", "image_generation", "mcp", "local_shell", "shell",
                  "apply_patch", "custom")


class TextFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(StrictModel):
    format: TextFormat = Field(default_factory=TextFormat)
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(StrictModel):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = _finite_float()
    top_p: float | None = _finite_float()
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = None
    text: TextConfig | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto"] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    store: bool | None = None  # accepted; nothing is stored (the reply says store: false)
    metadata: dict[str, str] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: Literal["disabled", "auto"] | None = None
    top_logprobs: int | None = Field(default=None, ge=0)
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    # vLLM's extensions
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    top_k: int | None = None
    min_p: float | None = _finite_float()
    repetition_penalty: float | None = _finite_float()
    priority: int = 0

    @model_validator(mode="after")
    def _check_unsupported(self):
        for message in self._unsupported():
            raise ValueError(message)
        return self

    def _unsupported(self):
        for tool in self.tools or ():
            kind = tool.get("type")
            if kind in BUILT_IN_TOOLS:
                yield f"tools of the built-in type {kind!r} are not supported here"
            yield ("tools are not supported on /v1/responses here; call functions through "
                   "/v1/chat/completions")
        if self.previous_response_id is not None:
            yield ("previous_response_id is not supported: responses are not stored here; "
                   "send the whole conversation as input")
        if self.background:
            yield "background responses are not supported here; stream instead"
        if self.reasoning is not None:
            yield "reasoning options are not supported here (the model's text is the output)"
        if self.include:
            yield f"include {self.include[0]!r} is not available here"
        if self.truncation == "auto":
            yield "truncation 'auto' is not supported: a prompt too long for the context is a 400"
        if self.top_logprobs:
            yield "top_logprobs is not supported on /v1/responses here"

    @property
    def include_usage(self) -> bool:
        return True

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if fmt.schema_ is None:
            raise ValueError("text.format of type json_schema needs a schema")
        return StructuredOutputsParams(json=fmt.schema_)


# ---- the response --------------------------------------------------------------
class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = Field(default_factory=list)
    logprobs: list = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str = Field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    role: str = "assistant"
    content: list[OutputText] = Field(default_factory=list)


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, input_tokens: int, output_tokens: int) -> "ResponseUsage":
        return cls(input_tokens=input_tokens, output_tokens=output_tokens,
                   total_tokens=input_tokens + output_tokens)


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    background: bool = False
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    output: list[OutputMessage] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict | None = None
    service_tier: str | None = None
    store: bool = False
    temperature: float | None = None
    text: dict = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str = "none"
    tools: list = Field(default_factory=list)
    top_p: float | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
