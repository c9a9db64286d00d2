"""The request fields that constrain the output: OpenAI's `response_format`, vLLM's
`structured_outputs` object, and vLLM's older `guided_json`, `guided_regex`,
`guided_choice`, `guided_grammar` (removed from vLLM in 0.12, accepted here)."""
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parashift.structured import StructuredOutputsParams

LEGACY_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JsonSchemaFormat(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and (self.json_schema is None
                                           or self.json_schema.json_schema is None):
            raise ValueError("response_format of type json_schema needs json_schema.schema")
        return self


class StructuredOutputsField(_Strict):
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class StructuredFields(_Strict):
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @model_validator(mode="after")
    def _one_constraint(self):
        given = self.structured_field_names()
        if len(given) > 1:
            raise ValueError(f"give at most one way to constrain the output; got "
                             f"{', '.join(given)}")
        if given:
            self.structured_outputs_params()  # a bad value is the request's fault: 400
        return self

    def structured_field_names(self) -> list[str]:
        given = [name for name in ("structured_outputs", *LEGACY_FIELDS)
                 if getattr(self, name) is not None]
        if self.response_format is not None and self.response_format.type != "text":
            given.insert(0, "response_format")
        return given

    @property
    def structured_param(self) -> str | None:
        """The field that constrains the output, for error messages."""
        return next(iter(self.structured_field_names()), None)

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        param = self.structured_param
        if param is None:
            return None
        if param == "response_format":
            fmt = self.response_format
            if fmt.type == "json_object":
                return StructuredOutputsParams(json_object=True)
            return StructuredOutputsParams(json=fmt.json_schema.json_schema)
        if param == "structured_outputs":
            return StructuredOutputsParams(**self.structured_outputs.model_dump(by_alias=True))
        return StructuredOutputsParams(**{LEGACY_FIELDS[param]: getattr(self, param)})
