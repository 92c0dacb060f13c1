"""Which product package may import which.

Between the product folders: the wire contract and what both sides share live in ``protocol/``, so
the proxy never needs the client SDK and the client never needs the server.

    protocol/           imports none of client, proxy, actions
    proxy/ config/      import protocol, never client
    actions/            imports protocol and config: the actions' contract is its own (actions/base.py,
                        actions/job.py), which the proxy's consumer and job satisfy
    client/             imports protocol, never proxy or actions

On the server side, the layers DESIGN.md lists ("Layers"), bottom first: a module imports only from its
own layer or one below (``LAYERS``).

Every module is read with ``ast`` (imports inside functions and ``TYPE_CHECKING`` blocks count too);
upward imports are not allowed, not even for types (``UPWARD_FOR_TYPES`` is the place to list one, and is empty).
Between the product folders, and between the subfolders of ``proxy/``, no imports go round in a
cycle, type-only ones counted (``folder_cycles``).

The same modules keep to size limits (``MAX_MODULE_LINES``, ``MAX_CLASS_METHODS``, ``MAX_FUNCTION_LINES``);
what is still over one is listed, with the reason, in ``OVERSIZE``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: folder -> the ddmq packages its modules must not import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "protocol": ("ddmq.client", "ddmq.proxy", "ddmq.actions"),
    "proxy": ("ddmq.client",),
    "actions": ("ddmq.client", "ddmq.proxy"),
    "config": ("ddmq.client",),
    "client": ("ddmq.proxy", "ddmq.actions"),
}


#: the server side's layers, bottom first; a module belongs to the longest name that prefixes it
LAYERS: tuple[str, ...] = (
    "ddmq.protocol",
    "ddmq.config",
    "ddmq.actions",
    "ddmq.proxy.core",
    "ddmq.proxy.store",
    "ddmq.proxy.engine",
    "ddmq.proxy.cluster",
    "ddmq.proxy.groups",
    "ddmq.proxy.api",
    "ddmq.proxy.ops",
    "ddmq.proxy.servers",
    "ddmq.proxy",  # the process: service, cli
)

#: module -> the modules above its layer it names in annotations only (under ``TYPE_CHECKING``):
#: (none: a lower layer that needs something of a higher one declares it as a Protocol of its own)
UPWARD_FOR_TYPES: dict[str, frozenset[str]] = {}


def layer_of(module: str) -> int | None:
    """Index in ``LAYERS`` of ``module``'s layer; None for what is no layer (the stdlib, client, ...)."""
    best = None
    for index, name in enumerate(LAYERS):
        if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(LAYERS[best])):
            best = index
    return best


def upward_imports(source: str, module: str, package: str) -> list[str]:
    own = layer_of(module)
    if own is None:
        return []
    allowed = UPWARD_FOR_TYPES.get(module, frozenset())
    found = []
    for line, target in imported_modules(source, package):
        layer = layer_of(target)
        if layer is not None and layer > own and not any(
            target == name or target.startswith(name + ".") for name in allowed
        ):
            found.append(f"line {line}: {target} ({LAYERS[layer]} is above {LAYERS[own]})")
    return found


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) for every import in ``source``; ``package`` resolves relative imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            # `from ddmq import client` imports ddmq.client
            found += [(node.lineno, module)] + [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def violations(source: str, package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"line {line}: {module}"
        for line, module in imported_modules(source, package)
        if any(module == name or module.startswith(name + ".") for name in forbidden)
    ]


def _modules() -> list[tuple[str, Path]]:
    return [(folder, path) for folder in FORBIDDEN for path in sorted((ROOT / folder).rglob("*.py"))]


def test_every_product_folder_has_modules() -> None:
    assert {folder for folder, _ in _modules()} == set(FORBIDDEN)


def _module_id(value: object) -> str:
    return str(value.relative_to(ROOT)) if isinstance(value, Path) else str(value)


@pytest.mark.parametrize(("folder", "path"), _modules(), ids=_module_id)
def test_module_keeps_to_its_layer(folder: str, path: Path) -> None:
    package = "ddmq." + ".".join(path.relative_to(ROOT).parent.parts)  # a module's or an __init__'s package
    found = violations(path.read_text(), package, FORBIDDEN[folder])
    assert not found, f"{path.relative_to(ROOT)} imports what its layer must not: {found}"


@pytest.mark.parametrize(("folder", "path"), _modules(), ids=_module_id)
def test_module_imports_only_down_the_layers(folder: str, path: Path) -> None:
    parts = path.relative_to(ROOT).with_suffix("").parts
    package = "ddmq." + ".".join(parts[:-1])
    module = package if parts[-1] == "__init__" else f"{package}.{parts[-1]}"
    found = upward_imports(path.read_text(), module, package)
    assert not found, f"{path.relative_to(ROOT)} imports from a layer above its own: {found}"


def test_every_proxy_module_is_in_a_layer_below_the_process() -> None:
    top = LAYERS.index("ddmq.proxy")
    loose = sorted(p.name for p in (ROOT / "proxy").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "cli.py", "service.py"]  # the process and its entry points
    for folder in sorted(p for p in (ROOT / "proxy").iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        assert layer_of(f"ddmq.proxy.{folder.name}") not in (None, top), folder.name


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("from ddmq.proxy.groups.group import TopicConsumer\n", "ddmq.proxy.engine.reader2"),
        ("def later():\n    from ddmq.proxy.service import ProxyService\n", "ddmq.proxy.ops.views"),
        ("from ddmq.proxy.engine import job\n", "ddmq.config.schema"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ddmq.proxy.engine.ordering import Gate\n",
         "ddmq.actions.base"),
        ("from ..service import ProxyService\n", "ddmq.proxy.api.surface"),
    ],
)
def test_the_layer_check_catches_an_upward_import(source: str, module: str) -> None:
    assert upward_imports(source, module, module.rsplit(".", 1)[0])


def test_the_layer_check_lets_downward_and_sideways_imports_through() -> None:
    source = "from ddmq.proxy.store.broker import Broker\nfrom ddmq.proxy.engine import offsets\nimport asyncio\n"
    assert upward_imports(source, "ddmq.proxy.engine.reader", "ddmq.proxy.engine") == []


@pytest.mark.parametrize(
    ("source", "package", "folder"),
    [
        ("from ddmq.client import keys\n", "ddmq.proxy", "proxy"),
        ("import ddmq.client.wire\n", "ddmq.config", "config"),
        ("from ddmq import client\n", "ddmq.actions", "actions"),
        ("def later():\n    from ddmq.proxy.demo import main\n", "ddmq.client", "client"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ddmq.actions.base import Action\n",
         "ddmq.client", "client"),
        ("from ..client import producer\n", "ddmq.protocol", "protocol"),
    ],
)
def test_the_check_catches_a_violation(source: str, package: str, folder: str) -> None:
    assert violations(source, package, FORBIDDEN[folder])


def test_the_check_lets_allowed_imports_through() -> None:
    source = "from ddmq.protocol import keys\nimport ddmq.config.schema\nfrom ddmq.clientele import x\n"
    assert violations(source, "ddmq.proxy", FORBIDDEN["proxy"]) == []


def _module_and_package(path: Path) -> tuple[str, str]:
    """(module, package) of a product module: ``ddmq.proxy.engine.job``, ``ddmq.proxy.engine``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    package = "ddmq." + ".".join(parts[:-1])
    return (package if parts[-1] == "__init__" else f"{package}.{parts[-1]}"), package


def folder_graph(modules: list[tuple[str, str, str]], depth: int) -> dict[str, set[str]]:
    """folder -> the folders it imports from, for ``(module, package, source)`` triples; a folder is a
    module name's first ``depth`` parts (2: ``ddmq.proxy``; 3: ``ddmq.proxy.engine``). A module directly
    in a folder of ``depth - 1`` parts (``ddmq.proxy.service`` at depth 3) belongs to no folder."""
    def folder(module: str) -> str | None:
        parts = module.split(".")
        return ".".join(parts[:depth]) if len(parts) > depth or (len(parts) == depth and module in packages) else None

    packages = {package for _, package, _ in modules}
    graph: dict[str, set[str]] = {}
    for module, package, source in modules:
        own = folder(module)
        if own is None:
            continue
        targets = graph.setdefault(own, set())
        for _, target in imported_modules(source, package):
            other = folder(target) if target.startswith("ddmq.") else None
            if other is not None and other != own:
                targets.add(other)
    return graph


def folder_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of ``graph``: each strongly connected group of two or more folders, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _product_modules(folder: str | None = None) -> list[tuple[str, str, str]]:
    return [(*_module_and_package(path), path.read_text()) for top, path in _modules() if folder in (None, top)]


@pytest.mark.parametrize(("what", "folder", "depth"), [("the product folders", None, 2), ("proxy/", "proxy", 3)])
def test_no_folder_imports_go_round_in_a_cycle(what: str, folder: str | None, depth: int) -> None:
    cycles = folder_cycles(folder_graph(_product_modules(folder), depth))
    assert not cycles, f"folders of {what} that import each other, type-only imports counted: {cycles}"


def test_the_cycle_check_sees_a_type_only_cycle() -> None:
    modules = [
        ("ddmq.proxy.engine.job", "ddmq.proxy.engine", "from ddmq.proxy.store.broker import Broker\n"),
        ("ddmq.proxy.store.broker", "ddmq.proxy.store",
         "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine import job\n"),
        ("ddmq.proxy.service", "ddmq.proxy", "from ddmq.proxy.engine.job import UpstreamJob\n"),
        ("ddmq.proxy.engine", "ddmq.proxy.engine", ""),
        ("ddmq.proxy.store", "ddmq.proxy.store", ""),
    ]
    assert folder_cycles(folder_graph(modules, 3)) == [["ddmq.proxy.engine", "ddmq.proxy.store"]]
    assert folder_cycles(folder_graph(modules, 2)) == []  # one folder, ddmq.proxy
    assert folder_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_tests_import_nothing_from_the_benchmarks() -> None:
    # The harness (tests/harness/) and the soak live in tests/; bench/ imports them, never the reverse.
    found = [
        f"{path.relative_to(ROOT)} line {line}: {module}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for line, module in imported_modules(path.read_text(), "tests")
        if module == "bench" or module.startswith("bench.")
    ]
    assert not found


#: Where Redis's errors may be caught or mapped into the project's own (a path, or a folder ending in
#: ``/``), and why there. Everywhere else Redis fails as the project's own errors: the proxy's client
#: raises BrokerError, the producers ProduceError.
REDIS_EDGES: dict[str, str] = {
    "proxy/store/": "the proxy's edge: its Redis client raises BrokerError for every failure (client.py), "
                    "and the store's modules say what they were doing (map_redis_errors), also for the "
                    "connections they use directly",
    "protocol/produce/": "the producers' edge: they retry what may pass, and give up with DeliveryError",
    "protocol/redis/queues.py": "the queue operations producers and the proxy share fail as ProduceError",
    "protocol/redis/connection.py": "the connections turn the event loop's own errors into redis-py's, and a "
                                    "script call falls back to EVAL on NOSCRIPT",
    "actions/redis_action.py": "an edge of its own: the Redis a push action writes to is its user's, not the "
                               "broker, and its errors are the push's outcomes",
    "client/cli/": "an edge of its own: a command's own connection to the broker, whose failure it tells",
}
#: Names of the project that stand for redis-py's errors.
_REDIS_ERROR_NAMES = frozenset({"REDIS_ERRORS", "REDIS_FAILURES"})


def redis_error_handling(source: str) -> list[str]:
    """Where ``source`` catches or tests for redis-py's errors (``except``, ``isinstance``), or maps them
    (``map_redis_errors``)."""
    tree = ast.parse(source)
    modules: set[str] = set()  # names bound to redis-py's modules
    errors = set(_REDIS_ERROR_NAMES)  # names bound to its error classes
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {(alias.asname or alias.name).split(".")[0] for alias in node.names
                        if alias.name.split(".")[0] == "redis"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "redis":
            errors |= {alias.asname or alias.name for alias in node.names}

    def names_an_error(node: ast.AST) -> bool:
        for part in ast.walk(node):
            if isinstance(part, ast.Name) and part.id in errors and (
                    part.id in _REDIS_ERROR_NAMES or part.id.endswith(("Error", "Exception"))):
                return True
            if (isinstance(part, ast.Attribute) and part.attr.endswith(("Error", "Exception"))
                    and isinstance(root := _root(part), ast.Name) and root.id in modules):
                return True
        return False

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None and names_an_error(node.type):
            found.append(f"line {node.lineno}: except {ast.unparse(node.type)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
              and len(node.args) == 2 and names_an_error(node.args[1])):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Name) and node.id in _REDIS_ERROR_NAMES | {"map_redis_errors"}:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in _REDIS_ERROR_NAMES | {"map_redis_errors"}:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and any(alias.name == "map_redis_errors" for alias in node.names):
            found.append(f"line {node.lineno}: imports map_redis_errors")
    return sorted(set(found), key=lambda line: int(line.split()[1].rstrip(":")))


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _is_redis_edge(path: Path) -> bool:
    where = path.relative_to(ROOT).as_posix()
    return any(where == edge or (edge.endswith("/") and where.startswith(edge)) for edge in REDIS_EDGES)


@pytest.mark.parametrize(("folder", "path"), _modules(), ids=_module_id)
def test_redis_errors_are_mapped_at_the_edges_only(folder: str, path: Path) -> None:
    found = [] if _is_redis_edge(path) else redis_error_handling(path.read_text())
    assert not found, (
        f"{path.relative_to(ROOT)} handles redis-py's errors, which only its edges do ({sorted(REDIS_EDGES)}); "
        f"catch BrokerError (or DdmqError) instead: {found}"
    )


def test_every_redis_edge_is_there() -> None:
    assert [edge for edge in REDIS_EDGES if not (ROOT / edge).exists()] == []


@pytest.mark.parametrize(
    "source",
    [
        "from ddmq.protocol.redis.connection import REDIS_FAILURES\ntry:\n    pass\nexcept REDIS_FAILURES:\n    pass\n",
        "import redis\ntry:\n    pass\nexcept (redis.ConnectionError, ValueError):\n    pass\n",
        "import redis.asyncio as aioredis\ntry:\n    pass\nexcept aioredis.ResponseError:\n    pass\n",
        "from redis.exceptions import ResponseError\nok = isinstance(reply, ResponseError)\n",
        "from ddmq.proxy.store.broker import map_redis_errors\n",
        "def f(store):\n    with store.map_redis_errors('x'):\n        pass\n",
    ],
)
def test_the_redis_check_sees_redis_errors_handled(source: str) -> None:
    assert redis_error_handling(source)


def test_the_redis_check_lets_the_projects_errors_and_client_types_through() -> None:
    source = (
        "from redis.asyncio.cluster import RedisCluster\nfrom ddmq.proxy.core.errors import BrokerError\n"
        "try:\n    pass\nexcept (BrokerError, TimeoutError, ConnectionError):\n    pass\n"
        "cluster = isinstance(client, RedisCluster)\n"
    )
    assert redis_error_handling(source) == []


def _lua_literals(source: str) -> list[int]:
    """Lines of the string literals in ``source`` that hold Lua (a ``redis.call`` or ``redis.pcall``)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and ("redis.call(" in node.value or "redis.pcall(" in node.value)
    ]


SCRIPTS_HOME = ROOT / "protocol" / "redis" / "scripts"


@pytest.mark.parametrize(("folder", "path"), _modules(), ids=_module_id)
def test_lua_lives_in_one_package(folder: str, path: Path) -> None:
    if path.parent == SCRIPTS_HOME:
        if path.name != "__init__.py":
            assert _lua_literals(path.read_text()), f"{path.relative_to(ROOT)} holds no Lua"
        return
    found = _lua_literals(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} holds Lua (lines {found}); it belongs in protocol/redis/scripts/"


def test_the_lua_check_sees_a_script() -> None:
    assert _lua_literals('X = """\nredis.call(\'GET\', KEYS[1])\n"""\n') == [1]
    assert _lua_literals('X = "no script here"\n') == []


#: The size limits of the product folders: lines of a module, methods of a class, lines of a function.
MAX_MODULE_LINES, MAX_CLASS_METHODS, MAX_FUNCTION_LINES = 450, 25, 60

#: What is still over a limit, and why. An entry that is no longer over it must go (a test says so).
OVERSIZE: dict[str, str] = {
}


def oversize(source: str, name: str) -> list[str]:
    """The parts of module ``name`` over a size limit: the module, ``name::Class``, ``name::[Class.]function``."""
    found = [name] if len(source.splitlines()) > MAX_MODULE_LINES else []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                methods = [n for n in child.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
                if len(methods) > MAX_CLASS_METHODS:
                    found.append(f"{name}::{prefix}{child.name}")
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert child.end_lineno is not None
                if child.end_lineno - child.lineno + 1 > MAX_FUNCTION_LINES:
                    found.append(f"{name}::{prefix}{child.name}")
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source), "")
    return found


def _all_oversize() -> list[str]:
    return [part for _, path in _modules() for part in oversize(path.read_text(), str(path.relative_to(ROOT)))]


@pytest.mark.parametrize(("folder", "path"), _modules(), ids=_module_id)
def test_module_keeps_to_the_size_limits(folder: str, path: Path) -> None:
    found = [part for part in oversize(path.read_text(), str(path.relative_to(ROOT))) if part not in OVERSIZE]
    assert not found, (
        f"over {MAX_MODULE_LINES} lines a module, {MAX_CLASS_METHODS} methods a class or "
        f"{MAX_FUNCTION_LINES} lines a function: {found}"
    )


def test_every_listed_oversize_part_still_is() -> None:
    assert sorted(set(OVERSIZE) - set(_all_oversize())) == []


def test_the_size_check_sees_each_limit() -> None:
    body = "".join(f"    def m{i}(self) -> None: ...\n" for i in range(MAX_CLASS_METHODS + 1))
    long_function = "def f() -> None:\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert oversize(f"class C:\n{body}", "m.py") == ["m.py::C"]
    assert oversize(long_function, "m.py") == ["m.py::f"]
    assert oversize("x = 1\n" * (MAX_MODULE_LINES + 1), "m.py") == ["m.py"]
    assert oversize("def f() -> None:\n    pass\n", "m.py") == []


# constructors below the consumer ----------------------------------------------------------------------

#: Below this layer no constructor is handed the consumer, the service, or a stand-in for either: a piece
#: there gets the state it acts on, the stores and settings it uses and narrow callbacks, and the
#: consumer (``ddmq.proxy.groups``) is where they are built and wired.
WIRING_LAYER = "ddmq.proxy.groups"
#: Parameter names that stand for a whole consumer, group or service (``host``, ``hub``: what a Protocol
#: of all a piece needed of its consumer was called). A plain value under such a name (``group: str``,
#: ``host: str``) is fine.
HUB_NAMES = frozenset({"consumer", "group", "service", "host", "hub"})
#: How the names of types that stand for a whole consumer, group, service or registry end:
#: ``TopicConsumer``, ``ConsumerGroup``, ``ProxyService``, ``GroupRegistry``, ``ReaderHost``, a
#: ``ReplayGroup`` Protocol, ... (``TopicGroupConfig`` is settings, and fine).
HUB_WORDS = ("Consumer", "Group", "Service", "Host", "Registry")
_PLAIN = frozenset({"str", "int", "float", "bytes", "bool", "None"})


def _annotation_names(annotation: ast.expr | None) -> set[str]:
    """The names an annotation mentions, those inside string annotations too."""
    names: set[str] = set()
    for node in ast.walk(annotation) if annotation is not None else ():
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                names |= _annotation_names(ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                pass
    return names


def _constructor_parameters(cls: ast.ClassDef) -> list[tuple[str, ast.expr | None, int]]:
    """(name, annotation, line) of what constructs ``cls``: its ``__init__``'s parameters, or the fields
    of a dataclass or NamedTuple (their constructor is generated from them)."""
    found: list[tuple[str, ast.expr | None, int]] = []
    decorators = {ast.unparse(d.func if isinstance(d, ast.Call) else d).rsplit(".", 1)[-1] for d in cls.decorator_list}
    if "dataclass" in decorators or any(ast.unparse(base).endswith("NamedTuple") for base in cls.bases):
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and "ClassVar" not in _annotation_names(node.annotation):
                found.append((node.target.id, node.annotation, node.lineno))
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__init__":
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, (args.vararg, args.kwarg))]:
                if arg.arg != "self":
                    found.append((arg.arg, arg.annotation, arg.lineno))
    return found


def hub_parameters(source: str) -> list[str]:
    """The constructor parameters in ``source`` that take a whole consumer or service (see ``HUB_NAMES``,
    ``HUB_WORDS``)."""
    found = []
    for cls in (node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)):
        for name, annotation, line in _constructor_parameters(cls):
            names = _annotation_names(annotation)
            hub_type = any(type_name.endswith(HUB_WORDS) or "Consumer" in type_name for type_name in names)
            if hub_type or (name in HUB_NAMES and not (names and names <= _PLAIN)):
                shown = ast.unparse(annotation) if annotation is not None else "(no annotation)"
                found.append(f"line {line}: {cls.name}({name}: {shown})")
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    package = "ddmq." + ".".join(parts[:-1])
    return package if parts[-1] == "__init__" else f"{package}.{parts[-1]}"


def _below_the_wiring() -> list[Path]:
    top = LAYERS.index(WIRING_LAYER)
    return [path for _, path in _modules() if (layer := layer_of(_module_name(path))) is not None and layer < top]


@pytest.mark.parametrize("path", _below_the_wiring(), ids=_module_id)
def test_no_constructor_below_the_consumer_takes_the_consumer_or_the_service(path: Path) -> None:
    found = hub_parameters(path.read_text())
    assert not found, (
        f"{path.relative_to(ROOT)}: a constructor below {WIRING_LAYER} takes a whole consumer or service; hand "
        f"it the state, stores, settings and callbacks it uses instead: {found}"
    )


@pytest.mark.parametrize(
    "source",
    [
        "class R:\n    def __init__(self, consumer: ReaderHost, qid: int) -> None: ...\n",
        "class R:\n    def __init__(self, queues: 'TopicConsumer') -> None: ...\n",
        "class R:\n    def __init__(self, *, owner: ddmq.proxy.service.ProxyService) -> None: ...\n",
        "class R:\n    def __init__(self, group: ConsumerGroup | None = None) -> None: ...\n",
        "class R:\n    def __init__(self, buffer: Buffer, replays: ReplayGroup) -> None: ...\n",
        "class R:\n    def __init__(self, parts: ConsumerParts) -> None: ...\n",
        "class R:\n    def __init__(self, host) -> None: ...\n",
        "@dataclass(frozen=True)\nclass R:\n    service: Callable[[], ConsumeService]\n",
        "class R(NamedTuple):\n    hub: Parts\n",
    ],
)
def test_the_constructor_check_catches_a_consumer_handed_down(source: str) -> None:
    assert hub_parameters(source)


def test_the_constructor_check_lets_narrow_parts_through() -> None:
    source = (
        "class R:\n    def __init__(self, owner: JobOwner, host: str, group: str, config: TopicGroupConfig,\n"
        "                 jobs: ReadJobs,\n"
        "                 drop: Callable[[int], Awaitable[None]], owned: OwnedQueues) -> None:\n"
        "        self.consumer = owner\n"
        "@dataclass\nclass S:\n    group: str\n    accept: Callable[[QueueId], None]\n    limit: ClassVar[int] = 3\n"
    )
    assert hub_parameters(source) == []
    assert _below_the_wiring() and all(layer_of(_module_name(p)) is not None for p in _below_the_wiring())
