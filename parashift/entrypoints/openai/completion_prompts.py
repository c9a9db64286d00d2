"""/v1/completions' `prompt`: one prompt (a text or a list of token ids) or a batch of
them (a list of texts or a list of token-id lists), as OpenAI and vLLM take it."""
from parashift.entrypoints.openai.errors import bad_request

Prompt = str | list[int]


def prompts_of(prompt) -> list[Prompt]:
    """The request's prompts in order; 400 for an empty batch or one mixing texts and
    token-id lists."""
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return [prompt]  # a single prompt (a text or token ids); an empty one: 400 later
    kinds = {type(p) for p in prompt}
    if len(kinds) > 1:
        raise bad_request("a batch of prompts must be all texts or all token-id lists, "
                          "not a mix of both", param="prompt", code="mixed_prompt_batch")
    return list(prompt)
