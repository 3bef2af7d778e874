"""How deep a JSON text nests, measured before anything parses or walks it."""

from __future__ import annotations

import json
import re

# MAAS's objects nest a few levels (a machine's interfaces' links' subnets' VLANs ...). Deeper
# JSON is not MAAS's: refused before anything walks it (json itself recurses, and fails with
# RecursionError, at about a thousand).
MAX_JSON_DEPTH = 64
_ESCAPED_BACKSLASH = b"\\\\"
_ESCAPED_QUOTE = b'\\"'
_NOT_STRUCTURE = bytes(byte for byte in range(256) if byte not in b'"[]{}')
_STRING = re.compile(rb'"[^"]*"')
_INNERMOST = re.compile(rb"\[\]|\{\}")


def json_nested_deeper(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the JSON text ``body`` nests arrays and objects more than ``limit`` deep
    (brackets inside strings do not count; text that does not balance counts as deeper).

    Built from passes of C code (replace, translate, regex) over the text, never a loop per
    character: a machine list can be hundreds of MB. Each pass of ``_INNERMOST`` removes the
    innermost level, so what is left after ``limit`` passes lies deeper.
    """
    encoding = json.detect_encoding(body)
    if encoding not in ("utf-8", "utf-8-sig"):
        body = body.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    # In JSON a backslash escapes exactly the next character, left to right: dropping the
    # escaped backslashes first, then the escaped quotes, leaves only the quotes of strings.
    structure = body.replace(_ESCAPED_BACKSLASH, b"").replace(_ESCAPED_QUOTE, b"")
    structure = structure.translate(None, _NOT_STRUCTURE)
    # Quotes now alternate open, close. Dropping two adjacent ones drops an empty string or
    # joins two strings into one, so it keeps that order; it leaves only the few strings that
    # hold brackets for the (slower) regex.
    structure = _STRING.sub(b"", structure.replace(b'""', b""))
    for _ in range(limit):
        if not structure:
            return False
        structure = _INNERMOST.sub(b"", structure)
    return bool(structure)
