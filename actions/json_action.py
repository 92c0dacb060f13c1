"""``Json``: parse the body once; later actions and JSONPath order keys read ``job.data``."""

from __future__ import annotations

import json
import json.scanner
import logging
from collections.abc import Callable, Iterable
from typing import Any, Final, cast

from ddmq.actions.base import ChainContext, Status, register
from ddmq.actions.job import INVALID_JSON, Job

log: Final = logging.getLogger(__name__)

# orjson (where its wheel installs) parses bytes straight from UTF-8, about three times as fast as json
# on a small body. It is trusted only where it gives json's value: it refuses what json accepts beyond
# the JSON standard (NaN, Infinity, 1e400, lone surrogates, a BOM, other encodings) and those bodies
# fall through to json; but it reads an integer past 64 bits as a float where json keeps it an int,
# so a result holding a float that large is parsed again by json (an order key of a big id stays
# exact), as is one nested deeper than json may go.
def _orjson_loads() -> Callable[[bytes], Any] | None:
    try:
        import orjson
    except ImportError:  # no wheel for this platform: json alone
        return None
    return orjson.loads


#: orjson's ``loads``, or None where it is not installed.
FAST_LOADS: Final = _orjson_loads()
#: orjson's integers stop at -2**63 and 2**64 - 1; beyond, a float at least this large in magnitude.
_BIG: Final = float(2**63)
#: Bodies nested deeper are read by json alone: orjson goes to 1,024 levels, json about as deep as the
#: interpreter's recursion limit lets it.
_DEEP: Final = 200

# json.loads(bytes) first detects the encoding and checks its keyword arguments, and JSONDecoder.decode
# is Python around the C scanner (two regex matches for the whitespace at either end). A UTF-8 body that
# is one JSON value with nothing around it (nearly all) goes to the scanner alone; anything else takes
# decode() or loads(), which give the same value or the same error.
_decoder = json.JSONDecoder()
_decode_text: Final = _decoder.decode
# json's C scanner for this decoder (typeshed's stub of make_scanner takes no decoder, hence the cast)
_scan_once: Final[Callable[[str, int], tuple[Any, int]]] = json.scanner.make_scanner(cast(Any, _decoder))
_CONTINUE: Final = Status.CONTINUE  # enum members read through their class are slow; Final: a C static when compiled


class JsonAction:
    def __init__(self, ctx: ChainContext) -> None:
        self._ctx = ctx

    def act(self, job: Job) -> Status:
        body = job.message.value
        try:
            job.data = load_body(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            # Not an error of the proxy: the rule for such bodies is the Order action's fallback.
            # RecursionError: arrays/objects nested deeper than the decoder's stack allows.
            reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
            job.data = INVALID_JSON
            job.last_error = f"body is not JSON: {reason}"
            self._ctx.count("json_invalid")
            log.debug("%r: %s", job, job.last_error)
        return _CONTINUE


def load_body(body: bytes, fast: Callable[[bytes], Any] | None = FAST_LOADS) -> Any:
    """``json.loads(body)``: the same value, or the same error (ValueError or RecursionError)."""
    if fast is not None:
        try:
            value = fast(body)
        except ValueError:  # orjson's JSONDecodeError is json's: json tells what is wrong, or reads it
            pass
        else:
            if not _needs_json(value):
                return value
    try:
        return _parse(body.decode("utf-8"))
    except ValueError:  # not UTF-8 or with a BOM: json.loads detects UTF-16/32 and BOMs
        return json.loads(body)


def _needs_json(value: object, depth: int = 0) -> bool:
    """Whether ``value`` (orjson's) holds a float of magnitude 2**63 or more, which may have been an
    integer in the text, or nests past ``_DEEP`` levels (json may refuse what orjson read). Typed so
    that the compiled build walks dicts and lists natively."""
    if isinstance(value, dict):
        items: Iterable[object] = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return isinstance(value, float) and not -_BIG < value < _BIG
    for item in items:
        if isinstance(item, float):
            if not -_BIG < item < _BIG:
                return True
        elif isinstance(item, (dict, list)) and (depth >= _DEEP or _needs_json(item, depth + 1)):
            return True
    return False


def _parse(text: str) -> Any:
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:  # no value at 0: leading whitespace, or nothing that is JSON
        return _decode_text(text)
    return value if end == len(text) else _decode_text(text)


# Registered here rather than by decorating the class: the compiled build makes a decorated class a
# plain Python one (attributes in a dict, methods bound per call), and this one runs for every message.
register("Json")(JsonAction)
