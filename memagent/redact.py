"""Keep secrets out of everything the project logs or stores.

Secrets (API keys, AWS secret keys, session tokens) are read from the environment by the
process that uses them and never travel in a config, a Ray runtime env, a log line, a trace,
an artifact or an output row. What *is* logged or stored and looks config-like goes through
:func:`redact`: values under secret-sounding keys are masked, and URLs lose their password and
secret query parameters. A config field that names an environment variable (``api_key_env``)
holds a name, not a value, and is kept.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"

# Key names whose values are secrets: api_key, secret_access_key, session_token, password, ...
# (not `*_tokens` budgets, not `*_env` variable names).
_SECRET_KEY = re.compile(r"(^|[_\-.])(api[_\-]?key|secret|secret[_\-]?key|secret[_\-]access[_\-]key|password|passwd"
                         r"|token|session[_\-]token|access[_\-]token|auth|authorization|credentials?|signature)$",
                         re.IGNORECASE)
_URL = re.compile(r"\b[a-z][a-z0-9+.\-]*://[^\s'\"<>]+", re.IGNORECASE)

# Environment variables that hold secrets (their values are masked by :func:`redact_text`).
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "OPENAI_API_KEY")


def is_secret_key(name: str) -> bool:
    """Whether a config/env key names a secret value (``*_env`` keys name a variable instead)."""
    return not name.lower().endswith("_env") and bool(_SECRET_KEY.search(name))


def redact_url(url: str) -> str:
    """``url`` without a password in its userinfo and with secret query parameters masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{MASK}@{host}" if ":" in userinfo else f"{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_key(k) for k, _ in pairs):
            query = urlencode([(k, MASK if is_secret_key(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str, env: dict[str, str] | None = None) -> str:
    """``text`` with every URL redacted and the values of secret environment variables masked."""
    text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    env = os.environ if env is None else env
    for name, value in env.items():
        if value and len(value) >= 4 and (name in SECRET_ENV or is_secret_key(name)) and value in text:
            text = text.replace(value, MASK)
    return text


def redact(value: Any, key: str = "") -> Any:
    """A copy of a config-like value (dicts, lists, strings) that is safe to log or store."""
    if key and is_secret_key(key) and value not in (None, "", [], {}):
        return MASK
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    if isinstance(value, str):
        return redact_text(value)
    return value
