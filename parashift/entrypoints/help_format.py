"""Help text that states each option's default once: argparse's own default-showing
formatter repeats it where the help already says it and prints "(default: None)"."""
import argparse
import re


class DefaultsOnceFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if re.search(r"\bdefault\b", text, re.IGNORECASE) or not has_meaningful_default(action):
            return text
        return f"{text} (default: %(default)s)".lstrip()


def has_meaningful_default(action: argparse.Action) -> bool:
    """False for flags (no value taken), --help, and defaults of None or empty."""
    if action.nargs == 0 or action.default is argparse.SUPPRESS:
        return False
    return action.default is not None and action.default != []
