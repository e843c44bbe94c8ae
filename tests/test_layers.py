"""The layers of docs/architecture.md hold: every import points down, through public names, with no cycle."""

from __future__ import annotations

from tests import layering


def test_every_import_points_down_through_public_names():
    """No module imports a peer or a higher layer, or another package's private module."""
    assert [] == layering.violations(layering.build_graph())


def test_there_are_no_import_cycles():
    """No two modules import each other, directly or round about."""
    assert [] == layering.cycles(layering.build_graph())


def test_every_module_has_a_layer():
    """A new package or core module must be placed in a layer before it can be imported."""
    graph = layering.build_graph()
    assert all(layering.unit_of(m) for m in graph.modules)


def test_the_rules_catch_an_upward_and_a_private_import():
    """The checker itself: a store module importing the shippers, and a CLI importing a private module, are both caught."""
    graph = layering.Graph(modules={"jobtrace.store._x": layering.ROOT, "shippers._y": layering.ROOT,
                                    "jobtrace.cli": layering.ROOT},
                           edges={"jobtrace.store._x": {"shippers._y"}, "jobtrace.cli": {"shippers._y"}})
    found = layering.violations(graph)
    assert any("jobtrace.store._x (layer 1" in v and "a higher layer" in v for v in found)
    assert any("jobtrace.cli imports shippers._y, a private module" in v for v in found)


def test_the_layer_table_matches_the_architecture_page():
    """docs/architecture.md names every unit of the table with its layer."""
    text = (layering.ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for unit in layering.LAYERS:
        assert f"`{unit}`" in text, unit
