"""The typed views in protocol/wire/structs.py match the IDL: every struct, field, type and field id.

The type checker sees only the views under ``TYPE_CHECKING``; the running code uses thriftpy2's classes
built from the IDL. This test reads the views from the source (ast) and compares them with the loaded
IDL both ways, so a field added to the IDL without its view (or the reverse) fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from thriftpy2.thrift import TType

from ddmq.protocol.wire import structs

SOURCE = Path(structs.__file__).with_suffix(".py")

_SCALARS = {
    TType.STRING: "str",
    TType.BINARY: "bytes",
    TType.BOOL: "bool",
    TType.BYTE: "int",
    TType.I16: "int",
    TType.I32: "int",
    TType.I64: "int",
    TType.DOUBLE: "float",
}


def _python_type(ttype: int, spec: Any) -> str:
    """The annotation a field of thrift type ``ttype`` (element spec ``spec``) must have, without ``| None``."""
    if ttype in _SCALARS:
        return _SCALARS[ttype]
    if ttype == TType.STRUCT:
        return str(spec.__name__)
    if ttype in (TType.LIST, TType.SET):
        elem = _python_type(*spec) if isinstance(spec, tuple) else _python_type(spec, None)
        return f"{'list' if ttype == TType.LIST else 'set'}[{elem}]"
    if ttype == TType.MAP:
        key, value = (_python_type(*s) if isinstance(s, tuple) else _python_type(s, None) for s in spec)
        return f"dict[{key}, {value}]"
    raise AssertionError(f"no Python type for thrift type {ttype}")


def _idl_structs() -> dict[str, list[tuple[str, str]]]:
    """Per IDL struct or exception: its fields in field-id order, as (name, annotation)."""
    meta = structs.consumer_thrift.__thrift_meta__
    found = {}
    for cls in [*meta["structs"], *meta["exceptions"]]:
        fields = []
        for _, field in sorted(cls.thrift_spec.items()):
            spec = field[2] if len(field) == 4 else None
            fields.append((field[1], f"{_python_type(field[0], spec)} | None"))
        found[cls.__name__] = fields
    return found


def _stubs(source: str) -> dict[str, tuple[list[tuple[str, str]], list[tuple[str, str, str]], list[str]]]:
    """Per class under ``if TYPE_CHECKING:``: (annotated attributes, ``__init__`` parameters as (name,
    annotation, default), base classes), all in source order."""
    tree = ast.parse(source)
    block = next(
        node for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    )
    found = {}
    for cls in block.body:
        assert isinstance(cls, ast.ClassDef), ast.dump(cls)
        attributes = [
            (node.target.id, ast.unparse(node.annotation))
            for node in cls.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        ]
        init = next(node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
        params = init.args.args[1:]
        defaults = init.args.defaults
        assert len(defaults) == len(params), f"{cls.name}.__init__: every field needs a default"
        parameters = [
            (arg.arg, ast.unparse(arg.annotation) if arg.annotation else "", ast.unparse(default))
            for arg, default in zip(params, defaults, strict=True)
        ]
        found[cls.name] = (attributes, parameters, [ast.unparse(base) for base in cls.bases])
    return found


STUBS = _stubs(SOURCE.read_text())
IDL = _idl_structs()


def test_every_idl_struct_has_a_stub_and_no_stub_lacks_one() -> None:
    assert set(STUBS) == set(IDL)


@pytest.mark.parametrize("name", sorted(IDL))
def test_stub_fields_match_the_idl(name: str) -> None:
    attributes, parameters, bases = STUBS[name]
    assert attributes == IDL[name]  # names, types and field-id order
    assert parameters == [(field, annotation, "None") for field, annotation in IDL[name]]
    is_exception = name in {cls.__name__ for cls in structs.consumer_thrift.__thrift_meta__["exceptions"]}
    assert bases == (["TException"] if is_exception else ["TPayload"])


@pytest.mark.parametrize("name", sorted(IDL))
def test_runtime_names_are_the_idl_classes(name: str) -> None:
    assert getattr(structs, name) is getattr(structs.consumer_thrift, name)


def test_a_drifted_stub_is_caught() -> None:
    """The check itself can fail: a stub with a wrong type, a missing field or fields out of id order."""
    source = SOURCE.read_text()
    wrong_type = _stubs(source.replace("        offset: int | None\n", "        offset: str | None\n", 1))
    assert wrong_type["Message"][0] != IDL["Message"]
    missing = _stubs(source.replace("        tag: str | None\n", "", 1))
    assert missing["Message"][0] != IDL["Message"]
    in_order = "        key: str | None\n        value: bytes | None\n"
    swapped = _stubs(source.replace(in_order, "        value: bytes | None\n        key: str | None\n", 1))
    assert swapped["Message"][0] != IDL["Message"]
