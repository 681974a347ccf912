from envs.tools import argument_error, function_tool, tools_by_name

SCHEMA = function_tool("go", "Go somewhere.", {"target": {"type": "string"}, "steps": {"type": "integer"},
                                                "mode": {"type": "string", "enum": ["walk", "run"]}},
                       required=["target"])["function"]["parameters"]


def test_valid_arguments():
    assert argument_error(SCHEMA, {"target": "kitchen"}) is None
    assert argument_error(SCHEMA, {"target": "kitchen", "steps": 3, "mode": "run"}) is None


def test_each_violation_is_named():
    assert "unexpected" in argument_error(SCHEMA, {"target": "a", "speed": 1})
    assert "missing" in argument_error(SCHEMA, {})
    assert "must be integer" in argument_error(SCHEMA, {"target": "a", "steps": "3"})
    assert "boolean" in argument_error(SCHEMA, {"target": "a", "steps": True})
    assert "one of" in argument_error(SCHEMA, {"target": "a", "mode": "fly"})
    assert "JSON object" in argument_error(SCHEMA, ["target"])


def test_tools_by_name():
    tools = [function_tool("a", "A."), function_tool("b", "B.")]
    assert set(tools_by_name(tools)) == {"a", "b"}
    assert tools_by_name(tools)["a"]["additionalProperties"] is False
