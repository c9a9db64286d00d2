"""Chat's tool calling fields (`tools`, `tool_choice`) and the tool call objects of
requests and responses, in OpenAI's shapes."""
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


class ToolCall(BaseModel):
    id: str = Field(default_factory=tool_call_id)
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaToolCall(ToolCall):
    index: int


class ToolFields(_Strict):
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _auto_when_tools(cls, data):
        """As OpenAI: with tools and no tool_choice, the model chooses ("auto")."""
        if isinstance(data, dict) and data.get("tools") and data.get("tool_choice") is None:
            data = {**data, "tool_choice": "auto"}
        return data

    @model_validator(mode="after")
    def _check_tool_choice(self):
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ValueError("tool_choice needs tools")
        named = self.named_function
        if named is not None and named not in {t.function.name for t in self.tools}:
            raise ValueError(f"tool_choice names the function {named!r}, which is not in tools")
        return self

    @property
    def tool_mode(self) -> str:
        """"none", "auto", "required" or "named"."""
        if not self.tools or self.tool_choice is None:
            return "none"
        return "named" if isinstance(self.tool_choice, NamedToolChoice) else self.tool_choice

    @property
    def named_function(self) -> str | None:
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return None

    def template_tools(self) -> list[dict] | None:
        """The tools as the chat template's `tools` argument takes them."""
        return template_tools(self.tools)

    def forced_call_schema(self) -> dict | None:
        """The JSON schema the output must follow when a call is forced: the named
        function's arguments, or ("required") a list of one or more {name, parameters}."""
        if self.tool_mode == "named":
            return self._parameters(self.named_function)
        if self.tool_mode != "required":
            return None
        calls = [{"type": "object", "properties": {"name": {"const": t.function.name},
                                                   "parameters": self._parameters(t.function.name)},
                  "required": ["name", "parameters"], "additionalProperties": False}
                 for t in self.tools]
        return {"type": "array", "minItems": 1, "items": {"anyOf": calls}}

    def _parameters(self, name: str) -> dict:
        tool = next(t for t in self.tools if t.function.name == name)
        return tool.function.parameters or {"type": "object"}


def template_tools(tools: list[ChatTool] | None) -> list[dict] | None:
    """`tools` as the chat template's `tools` argument takes them (None: no tools)."""
    if not tools:
        return None
    return [tool.model_dump(exclude_none=True) for tool in tools]
