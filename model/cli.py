"""What every entry point (train.py, sample.py, attention_maps.py) does with its command line:
Chinese values made acceptable to Hydra's override grammar, and bad input reported in one line."""
from __future__ import annotations

import functools
import os
import re
import sys

from model.device import BackendUnavailableError

_OPEN, _CLOSE = "[({", "])}"


def _quote(item: str) -> str:
    """One element of an override value, quoted if it holds non-ASCII characters and is not
    quoted already (surrounding spaces kept outside the quotes; quotes inside escaped)."""
    core = item.strip()
    if core.isascii() or core[0] in "'\"":
        return item
    lead, trail = item[: len(item) - len(item.lstrip())], item[len(item.rstrip()):]
    # Hydra's quoted strings: a backslash escapes only a quote and the backslashes before one
    core = re.sub(r"(\\*)('|$)", lambda m: m[1] * 2 + ("\\'" if m[2] else ""), core)
    return f"{lead}'{core}'{trail}"


def quote_non_ascii_value(value: str) -> str:
    """Quote each unquoted element of an override value that has non-ASCII characters, as
    Hydra's grammar wants: `床前,白日` (a sweep) → `'床前','白日'`, `[床前,白日]` (a list) →
    `['床前','白日']`, `choice(床前,白日)` → `choice('床前','白日')`, `{a:床前}` → `{a:'床前'}`.
    Elements are split at `,` (and `:` inside `{}`) outside quotes; quoted elements and
    full-width marks (，) are left as they are."""
    out, item, quote, stack = [], "", "", []
    for c in value:
        if quote:  # inside a quoted element: copy up to its closing quote
            item += c
            if c == quote and not item.endswith("\\" + c):
                quote = ""
        elif c in "'\"" and not item.strip():
            item, quote = item + c, c
        elif c in _OPEN or c in _CLOSE or c == "," or (c == ":" and stack[-1:] == ["{"]):
            out += [_quote(item), c]
            item = ""
            if c in _OPEN:
                stack.append(c)
            elif c in _CLOSE and stack:
                stack.pop()
        else:
            item += c
    return "".join(out) + _quote(item)


ONE_STRING = ("keywords",)
"""Options whose value is one string even with commas or brackets (`keywords=明月,故乡`,
`keywords=[明月,,故乡]`: the sampler splits it and drops empty entries), never a sweep; a list of
lists (`keywords=[[明月,故乡],[春风,杨柳]]`, one per poem) stays a list."""


def quote_non_ascii_overrides(argv: list[str]) -> list[str]:
    """`quote_non_ascii_value` on every `key=value` argument with non-ASCII characters, so that
    `prompt=床前明月光`, `probe_lines=[床前明月光，疑是地上霜。,白日依山尽，黄河入海流。]` and the
    sweep `-m prompt=床前明月光,白日依山尽` work: Hydra's override grammar accepts Chinese only
    inside quotes; a ONE_STRING option is quoted whole. All other arguments
    are returned unchanged."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key.lstrip("+~") in ONE_STRING and value[:1] not in "'\"" and not value.startswith("[["):
            out.append(f"{key}='{value.strip('[]')}'")  # a keyword holds no quote (not a character of a line)
            continue
        out.append(f"{key}={quote_non_ascii_value(value)}" if eq and not value.isascii() else arg)
    return out


USER_ERRORS = (ValueError, FileNotFoundError, BackendUnavailableError)
"""Errors that mean bad input (config, prompt, files): reported in one line, no traceback."""


def exit_on_user_error(fn):
    """Decorate an entry point: a USER_ERRORS exception ends the program with
    `error: <message>` and exit status 1 instead of a traceback; output piped into a reader that
    stops early (`| head`) ends it quietly, as a Unix tool does."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as err:
            raise SystemExit(f"error: {err}") from err
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
            raise SystemExit(1) from None

    return wrapper
