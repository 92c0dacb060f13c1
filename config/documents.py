"""A config file's text to data: YAML through libyaml's C parser when PyYAML has it (its pure-Python parser
otherwise), JSON through :mod:`json`; both strict in the same ways.

The strict rules, whichever parser reads the file: only ``true``/``false`` are booleans (YAML 1.1 also
reads ``yes``, ``no``, ``on``, ``off``, which a number or boolean field then refuses), a key given twice
in one mapping is an error instead of the last one silently winning, and YAML merges (``<<: *defaults``)
are bounded by :data:`MAX_EXPANDED`. The C parser reads a 1 MiB file several times faster than the pure
one; the constructor (Python in both) builds the same objects, so a file loads to the same data either
way (tests/config/test_documents.py). A text that is a JSON object is read as JSON, faster still.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import yaml

from ddmq.config.errors import ConfigError

#: The most a file may hold with its aliases and merges expanded, counting one per value (key, scalar,
#: mapping, list) plus the characters of each string. Aliases share one object in memory, so ten lines
#: of "billion laughs" aliases load at once, but validation walks every occurrence: without this bound
#: it would take hours. Characters count because a long string can cost more than many values (a
#: Filter expression is compiled at each occurrence). Written out, each value and character takes a
#: byte or more, so this is about what a file of the loader's MAX_FILE_BYTES (256 KiB) can hold:
#: aliases cannot make a file cost more than the largest file written out by hand.
MAX_EXPANDED: Final = 250_000

#: Whether this PyYAML was built with libyaml (``pip install pyyaml`` wheels are, on the usual platforms).
WITH_LIBYAML: Final = bool(getattr(yaml, "__with_libyaml__", False))

_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_BOOL_TAG: Final = "tag:yaml.org,2002:bool"


#: The most characters of a key an error message shows (the file chooses its keys, however long).
SHOWN_CHARACTERS: Final = 100


def shown(text: str) -> str:
    """``text`` as an error message shows it: its first :data:`SHOWN_CHARACTERS` characters."""
    return text if len(text) <= SHOWN_CHARACTERS else f"{text[:SHOWN_CHARACTERS]}... ({len(text):,} characters)"


def too_large(source: str, where: str) -> ConfigError:
    return ConfigError(
        f"{source}: {where}: with its aliases expanded the file holds over {MAX_EXPANDED:,} values and characters "
        "(a YAML alias bomb?); refused"
    )


class _StrictConstructor(yaml.constructor.SafeConstructor):
    """SafeConstructor with duplicate keys refused and merges counted (the parser is the loader's choice)."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self._source = source
        self._merged = 0  # entries copied by merges so far
        self._flattening: set[int] = set()  # ids of the mapping nodes whose merges are being flattened

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # `<<`: no key of its own; flatten_mapping (called by super) merges its mappings
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: construct_mapping below reports it
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {shown(repr(key))} (first on line {first})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # SafeConstructor copies each merged mapping's entries into this node, before any value is
        # built: thousands of mappings merging one of thousands of keys make millions of entries (and a
        # PyYAML that keeps duplicate keys grows merges of merges exponentially). Count the copies
        # before super() makes them; merged mappings are flattened first, so their size is final.
        if id(node) in self._flattening:
            raise yaml.constructor.ConstructorError(None, None, "a mapping merges itself", node.start_mark)
        self._flattening.add(id(node))
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                continue
            merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for mapping in merged:
                if isinstance(mapping, yaml.MappingNode):  # anything else: super() reports it
                    self.flatten_mapping(mapping)
                    self._merged += len(mapping.value)
            if self._merged > MAX_EXPANDED:
                raise too_large(self._source, f"line {key_node.start_mark.line + 1}")
        self._flattening.discard(id(node))
        super().flatten_mapping(node)


class _StrictResolver(yaml.resolver.Resolver):
    """YAML 1.1's implicit types but for booleans: only true/false (any case of the three spellings)."""

    def __init__(self) -> None:
        super().__init__()
        self._scalar_tags: dict[tuple[str, tuple[bool, bool]], str] = {}

    def resolve(self, kind: type[yaml.Node], value: Any, implicit: Any) -> str:
        # A scalar's tag depends on its text alone (no path resolvers here), and a config repeats its
        # texts (keys, action names, numbers): each resolves through the regular expressions once.
        if kind is not yaml.ScalarNode:
            return str(super().resolve(kind, value, implicit))  # type: ignore[no-untyped-call]
        key = (value, tuple(implicit))
        tag = self._scalar_tags.get(key)
        if tag is None:
            tag = self._scalar_tags[key] = str(super().resolve(kind, value, implicit))  # type: ignore[no-untyped-call]
        return tag


_StrictResolver.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
}
_StrictResolver.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


class PureLoader(
    yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer, _StrictConstructor,
    _StrictResolver,
):
    """The strict loader over PyYAML's pure-Python parser: a SafeLoader, no arbitrary objects."""

    def __init__(self, stream: str, source: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _StrictConstructor.__init__(self, source)
        _StrictResolver.__init__(self)


if WITH_LIBYAML:
    _CParser: Any = getattr(yaml.cyaml, "CParser")  # noqa: B009  # the stubs do not export it

    class CLoader(_CParser, _StrictConstructor, _StrictResolver):  # type: ignore[misc]  # CParser is C: untyped
        """The strict loader over libyaml's parser and composer (C); the constructor is the same Python."""

        def __init__(self, stream: str, source: str) -> None:
            _CParser.__init__(self, stream)
            _StrictConstructor.__init__(self, source)
            _StrictResolver.__init__(self)

    #: The loader :func:`read_yaml` uses: the C one where PyYAML has it.
    Loader: type[PureLoader] | type[CLoader] = CLoader
else:
    Loader = PureLoader


def read_yaml(text: str, source: str, loader: type[Any] | None = None) -> Any:
    """The one YAML document in ``text``; ConfigError naming ``source`` for bad YAML or too deep a nesting."""
    reader = (loader or Loader)(text, source)
    try:
        return reader.get_single_data()
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):  # libyaml's own bound (1,000 levels)
            raise ConfigError(f"{source}: nested too deeply for a config (hundreds of levels)") from exc
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    except ValueError as exc:  # the constructor's int(): an integer past Python's 4,300 digits
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    except RecursionError as exc:  # the composer and the constructor recurse once per level of nesting
        raise ConfigError(f"{source}: nested too deeply for a config (hundreds of levels)") from exc
    finally:
        reader.dispose()


def read_json(text: str, source: str) -> Any:
    """The JSON document in ``text``, or :data:`NOT_JSON` when ``text`` is not JSON (it may be YAML then).

    A key given twice in one object, and ``NaN``/``Infinity`` (no JSON values), are ConfigErrors."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError:
        return NOT_JSON
    except ValueError as exc:  # ours, or an integer past Python's 4,300 digits
        raise ConfigError(f"{source}: not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply for a config (hundreds of levels)") from None


#: What :func:`read_json` returns for a text that is not JSON.
NOT_JSON: Final[Any] = object()


class _JsonRefusal(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _JsonRefusal(f"duplicate key {shown(repr(key))} in one object")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise _JsonRefusal(f"{name} is not a JSON value")
