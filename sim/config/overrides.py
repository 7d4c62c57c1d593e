"""``--set KEY.PATH=VALUE``: one override applied to a raw config mapping, checked against a schema of the keys a
config may hold (see :func:`moebase.fields.schema_of`). The value is YAML, parsed like a config file (no key twice,
bounded nesting and size)."""

from __future__ import annotations

from moebase.checks import check_size, key_text, known_text, show
from moebase.errors import ConfigError
from moebase.fields import FREE
from moebase.files import parse_text

MAX_SET_PARTS = 32  # dotted parts of a key path
MAX_SET_CHARS = 1 << 20  # characters of a value


def apply_set(d: dict, text: str, schema: dict, wrap: dict[str, str], see: dict[str, str] | None = None) -> None:
    """Apply one ``KEY.PATH=VALUE`` to ``d`` in place. The path must name a key of ``schema`` (any key below a FREE
    one); where a top-level key holds a bare string and a key below it is set, the string becomes ``{wrap[key]:
    string}`` (a profile's ``base``, a part's ``name``). ``null`` unsets an optional field. ``see``: where the keys
    below a top-level key are listed, for an unknown key's error."""
    key, sep, raw = str(text).partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError("--set", f"expected KEY.PATH=VALUE, got {show(str(text))}")
    parts = key.split(".")
    if len(parts) > MAX_SET_PARTS:
        raise ConfigError("--set", f"key path {show(key)} has more than {MAX_SET_PARTS} parts")
    if any(not part.strip() for part in parts):
        raise ConfigError("--set", f"bad key path {show(key)} in {show(str(text))}")
    if len(raw) > MAX_SET_CHARS:
        raise ConfigError(key, f"the value has {len(raw)} characters, more than {MAX_SET_CHARS}")
    try:
        value = parse_text(raw) if raw.strip() else None
    except ValueError as exc:
        raise ConfigError(key, f"cannot parse the value {show(raw)} ({exc})") from None
    check_size(value, key)
    node, sub_schema = d, schema
    for i, part in enumerate(parts):
        path = ".".join(parts[: i + 1])
        if sub_schema is not FREE:
            if not isinstance(sub_schema, dict) or part not in sub_schema:
                if isinstance(sub_schema, dict):
                    raise ConfigError(
                        ".".join(parts[:i] + [key_text(part)]),
                        f"unknown key ({known_text(part, list(sub_schema), (see or {}).get(parts[0]))})",
                    )
                raise ConfigError(path, f"{'.'.join(parts[:i])} has no fields to set")
            below = sub_schema[part]
        else:
            below = FREE
        if i == len(parts) - 1:
            node[part] = value
            return
        child = node.get(part)
        if not isinstance(child, dict):
            child = {wrap[part]: child} if i == 0 and part in wrap and isinstance(child, str) else {}
            node[part] = child
        node, sub_schema = child, below


__all__ = ["MAX_SET_CHARS", "MAX_SET_PARTS", "apply_set"]
