"""What every entry point (train.py, sample.py, attention_maps.py) does with its command line:
Chinese values made acceptable to Hydra's override grammar, and bad input reported in one line."""
from __future__ import annotations

import functools

from model.attention import BackendUnavailableError


def quote_non_ascii_overrides(argv: list[str]) -> list[str]:
    """Quote `key=value` overrides whose value has non-ASCII characters, so that
    `prompt=床前明月光` works: Hydra's override grammar accepts Chinese only inside quotes.
    Values already quoted, and all other arguments, are returned unchanged."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and value and not value.isascii() and value[0] not in "'\"[{(":
            arg = f"{key}='" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        out.append(arg)
    return out


USER_ERRORS = (ValueError, FileNotFoundError, BackendUnavailableError)
"""Errors that mean bad input (config, prompt, files): reported in one line, no traceback."""


def exit_on_user_error(fn):
    """Decorate an entry point: a USER_ERRORS exception ends the program with
    `error: <message>` and exit status 1 instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as err:
            raise SystemExit(f"error: {err}") from err

    return wrapper
