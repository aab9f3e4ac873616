"""Keep secrets off the page: credentials in URIs, secret-looking config keys.

Everything the dashboard shows passes through here first, on the driver, so secrets
never reach the scheduler's event log either.
"""

from __future__ import annotations

import math
import re
from typing import Any

from dasktune.transfer import redact as _redact_text

REDACTED = "***"

# Words that make a config key secret, matched against the key's words so that
# ``api_key``, ``AWS_SECRET_ACCESS_KEY`` and ``authToken`` match but ``keyboard`` does not.
_SECRET_WORDS = frozenset({
    "key", "apikey", "secret", "token", "password", "passwd", "pwd", "passphrase",
    "credential", "credentials", "auth", "signature", "private",
})
_WORD_RE = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_MAX_DEPTH = 6
_MAX_TEXT = 200


def strip_uri(uri: Any) -> str | None:
    """``uri`` without ``user:pass@`` or ``?key=...`` credentials (``None`` stays ``None``)."""
    if uri is None:
        return None
    return _redact_text(str(uri))


def is_secret_key(key: Any) -> bool:
    """Whether a config key looks like it holds a credential."""
    words = {w.lower() for w in _WORD_RE.findall(str(key))}
    return bool(words & _SECRET_WORDS)


def jsonable(value: Any, _depth: int = 0) -> Any:
    """A JSON- and msgpack-safe copy of ``value``; secrets masked, NaN/inf become ``None``.

    Dict keys that look secret get :data:`REDACTED`; strings are URI-redacted; objects
    that are not plain data are shown by a short ``repr``.
    """
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        text = _redact_text(value) if ("://" in value or "=" in value) else value
        return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 1] + "…"
    if _depth >= _MAX_DEPTH:
        return "…"
    if isinstance(value, dict):
        return {
            str(k): REDACTED if is_secret_key(k) else jsonable(v, _depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, _depth + 1) for v in value]
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and getattr(value, "shape", None) == ():
        try:
            return jsonable(item(), _depth + 1)
        except (TypeError, ValueError):
            pass
    return jsonable(repr(value), _depth + 1)


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite real number (not a bool), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        item = getattr(value, "item", None)
        if not (callable(item) and getattr(value, "shape", None) == ()):
            return None
        value = item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
    value = float(value)
    return value if math.isfinite(value) else None
