"""A config's text to data: libyaml's C parser where PyYAML has it, the pure one otherwise, JSON for a JSON
object; the same data and the same strict rules (duplicate keys, booleans, merges) whichever reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ddmq.config import documents, load
from ddmq.config.documents import PureLoader, read_yaml
from ddmq.config.errors import ConfigError
from tests.config import shapes
from tests.config.test_config_bombs import SHARED

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "config" / "examples").glob("*.yaml"))
LOADERS = [PureLoader, *([documents.CLoader] if documents.WITH_LIBYAML else [])]


def test_the_c_parser_is_used_where_pyyaml_has_it() -> None:
    assert documents.WITH_LIBYAML == bool(yaml.__with_libyaml__)
    if yaml.__with_libyaml__:
        assert documents.Loader is documents.CLoader
        assert issubclass(documents.CLoader, yaml.cyaml.CParser)  # type: ignore[attr-defined]
    else:
        assert documents.Loader is PureLoader


@pytest.mark.skipif(not documents.WITH_LIBYAML, reason="this PyYAML has no libyaml: only the pure parser exists")
@pytest.mark.parametrize(
    "text",
    [SHARED, shapes.many_groups_yaml(20_000), shapes.many_filters(20_000), shapes.alias_bomb(3, 3),
     *(path.read_text() for path in EXAMPLES)],
    ids=["anchors-and-merges", "groups", "filters", "small-bomb", *(path.stem for path in EXAMPLES)],
)
def test_the_c_and_pure_parsers_read_the_same_data(text: str) -> None:
    c_data = read_yaml(text, "c.yaml", documents.CLoader)
    assert c_data == read_yaml(text, "pure.yaml", PureLoader)
    assert c_data == yaml.load(text, Loader=yaml.SafeLoader)  # none of these says yes/no/on/off


@pytest.mark.parametrize("loader", LOADERS)
def test_a_key_twice_in_one_mapping_is_refused(loader: type) -> None:
    text = "groups:\n  g:\n    t: {actions: [PullServer]}\n  g:\n    t: {actions: [PullServer]}\n"
    with pytest.raises(ConfigError, match=r"^x\.yaml: not valid YAML: duplicate key 'g' \(first on line 2\)"):
        read_yaml(text, "x.yaml", loader)


@pytest.mark.parametrize("loader", LOADERS)
def test_merges_take_the_mappings_keys_and_the_own_keys_win(loader: type) -> None:
    text = "a: &a {x: 1, y: 2}\nb: &b {z: 3}\nc: {<<: [*a, *b], y: 9}\nd: {<<: *a, <<: *b}\n"
    assert read_yaml(text, "x.yaml", loader)["c"] == {"x": 1, "y": 9, "z": 3}


@pytest.mark.parametrize("loader", LOADERS)
def test_only_true_and_false_are_booleans(loader: type) -> None:
    data = read_yaml("a: [yes, no, on, off, y, n, true, False, TRUE]\n", "x.yaml", loader)
    assert data == {"a": ["yes", "no", "on", "off", "y", "n", True, False, True]}


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("depth", [200, 5_000])
def test_deep_nesting_is_refused_by_either_parser(loader: type, depth: int) -> None:
    text = "a: " + "[" * depth + "]" * depth + "\n"
    if depth == 200:  # within both parsers' depth: read as written
        assert read_yaml(text, "x.yaml", loader) is not None
        return
    with pytest.raises(ConfigError, match=r"^x\.yaml: nested too deeply for a config"):
        read_yaml(text, "x.yaml", loader)


@pytest.mark.parametrize("suffix", ["yaml", "json"])
def test_nesting_within_the_parsers_bound_but_past_pythons_is_refused(tmp_path: Path, suffix: str) -> None:
    # libyaml and json read 900 levels; walking them for ${VAR} and validation would recurse past Python's limit.
    path = tmp_path / f"deep.{suffix}"
    nested = "[" * 900 + "]" * 900
    if suffix == "json":
        path.write_text(f'{{"groups": {{"g": {{"t": {{"actions": ["PullServer"]}}}}}}, "lol": {nested}}}\n')
    else:
        path.write_text(f"groups: {{g: {{t: {{actions: [PullServer]}}}}}}\nlol: {nested}\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value) == f"{path}: nested too deeply for a config (hundreds of levels)"


@pytest.mark.parametrize("loader", LOADERS)
def test_an_integer_past_pythons_digits_is_a_config_error(loader: type) -> None:
    with pytest.raises(ConfigError, match=r"^x\.yaml: not valid YAML: .*4300 digits"):
        read_yaml("commit_interval_ms: " + "1" * 5_000 + "\n", "x.yaml", loader)


def test_a_json_config_loads_as_the_same_yaml(tmp_path: Path) -> None:
    text = shapes.many_groups_json(30_000)
    as_json, as_yaml = tmp_path / "c.json", tmp_path / "c.yaml"
    as_json.write_text(text)
    as_yaml.write_text(yaml.safe_dump(json.loads(text)))
    config = load(as_json)
    assert config.groups and config == load(as_yaml)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"groups": {"g": {"t": {}}}, "groups": {}}', "not valid JSON: duplicate key 'groups' in one object"),
        ('{"commit_interval_ms": NaN}', "not valid JSON: NaN is not a JSON value"),
        ('{"commit_interval_ms": ' + "1" * 5_000 + "}", "not valid JSON: Exceeds the limit (4300 digits)"),
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply for a config"),
    ],
    ids=["duplicate key", "NaN", "huge integer", "deep"],
)
def test_bad_json_is_a_clear_error(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: {expected}")


def test_a_flow_mapping_that_is_not_json_is_read_as_yaml(tmp_path: Path) -> None:
    path = tmp_path / "flow.yaml"
    path.write_text("{groups: {g: {t: {actions: [PullServer], tags: [yes]}}}}\n")
    assert load(path).groups["g"]["t"].tags == ["yes"]


@pytest.mark.parametrize("suffix", ["yaml", "json"])
def test_an_error_shows_the_start_of_a_long_key(tmp_path: Path, suffix: str) -> None:
    key = "k" * 100_000
    path = tmp_path / f"long.{suffix}"
    path.write_text(f'{{"groups": {{"{key}": {{"t": {{"timeout_ms": 0}}}}, "{key}": {{}}}}}}' if suffix == "json"
                    else f"groups:\n  ? {key}\n  : {{t: {{timeout_ms: 0}}}}\n")  # a plain key has 1,024 at most
    with pytest.raises(ConfigError) as info:
        load(path)
    assert "k" * 99 + "... (100,00" in str(info.value)  # a repr starts with its quote
    assert len(str(info.value)) < 1_000
