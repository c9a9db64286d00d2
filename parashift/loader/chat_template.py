"""`--chat-template`: a Jinja file, or the template itself (as vLLM's flag)."""
from pathlib import Path

JINJA_MARKS = ("{", "}", "\n")


def load_chat_template(value: str) -> str:
    """The template text; a value that names no file and holds no Jinja is a path that
    does not exist. Syntax errors are raised here, at start-up, not at the first chat."""
    path = Path(value).expanduser()
    if path.is_file():
        template = path.read_text()
    elif any(mark in value for mark in JINJA_MARKS):
        template = value
    else:
        raise ValueError(f"chat template {value!r} is neither a file nor a Jinja template")
    _check_syntax(template, value if path.is_file() else "the inline chat template")
    return template


def _check_syntax(template: str, where: str) -> None:
    import jinja2
    try:
        jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"{where} is not a valid Jinja template (line {e.lineno}: "
                         f"{e.message})") from None
