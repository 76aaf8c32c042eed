"""memagent.json_walk: the one walk of a JSON tree behind schema $ref resolution, request guards and size limits."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memagent.json_walk import dotted, json_pointer, walk_json

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=30)


def at(value, path):
    for key in path:
        value = value[key]
    return value


def count(value) -> int:
    if isinstance(value, dict):
        return 1 + sum(count(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(count(v) for v in value)
    return 1


@given(json_values)
def test_every_node_is_visited_once_at_its_path(value):
    """Each node of a JSON value is yielded exactly once, the root first, with the path that leads to it."""
    seen = list(walk_json(value))
    assert seen[0] == ((), value)
    assert len(seen) == count(value) == len({path for path, _ in seen})
    assert all(at(value, path) is node for path, node in seen)


@given(st.lists(st.text(alphabet="a/~0", max_size=3), max_size=4))
def test_a_pointer_escapes_its_tokens_and_round_trips(keys):
    """A JSON pointer's tokens are escaped (~ as ~0, / as ~1) and split back into the same keys."""
    pointer = json_pointer(tuple(keys))
    back = [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]
    assert back == keys and dotted(tuple(keys), "body") == "body" + "".join(f".{k}" for k in keys)


def test_a_value_nested_past_the_recursion_limit_is_walked():
    """A value 100,000 levels deep (a hostile body) is walked without recursion."""
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert max(len(path) for path, _ in walk_json(deep)) == 100_000


def test_a_node_edited_when_seen_is_walked_as_edited():
    """A caller that drops a key of the node it was handed never sees that key's subtree."""
    tree = {"$id": {"deep": 1}, "keep": {"x": 2}}
    paths = []
    for path, node in walk_json(tree):
        paths.append(path)
        if isinstance(node, dict):
            node.pop("$id", None)
    assert ("$id",) not in paths and ("keep", "x") in paths and tree == {"keep": {"x": 2}}
