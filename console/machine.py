"""Draw a workflow's state machine as SVG on the server: states in columns by distance
from the initial state, the path the run took and its current state highlighted.

Only geometry is computed here; the template writes the SVG and console.css colours it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

NODE_W, NODE_H = 150, 38
COL_GAP, ROW_GAP = 70, 26
PAD = 16


@dataclass
class Node:
    name: str
    x: int
    y: int
    classes: list[str] = field(default_factory=list)

    @property
    def cx(self) -> int:
        return self.x + NODE_W // 2

    @property
    def cy(self) -> int:
        return self.y + NODE_H // 2

    @property
    def label(self) -> str:
        return self.name if len(self.name) <= 18 else self.name[:17] + "…"


@dataclass
class Edge:
    source: str
    target: str
    path: str
    taken: bool


@dataclass
class Drawing:
    width: int
    height: int
    nodes: list[Node]
    edges: list[Edge]
    path_taken: list[str]
    current: str
    node_w: int = NODE_W
    node_h: int = NODE_H


def _depths(definition: dict[str, Any]) -> dict[str, int]:
    """Breadth-first distance from the initial state; unreachable states go last."""
    outgoing: dict[str, list[str]] = {}
    for source, target in definition["transitions"]:
        outgoing.setdefault(source, []).append(target)
    depths = {definition["initial"]: 0}
    queue = deque([definition["initial"]])
    while queue:
        state = queue.popleft()
        for target in outgoing.get(state, []):
            if target not in depths:
                depths[target] = depths[state] + 1
                queue.append(target)
    last = max(depths.values(), default=0) + 1
    return {state: depths.get(state, last) for state in definition["states"]}


def collapse(states: list[str]) -> list[str]:
    """The sequence of states with repeats in a row removed (progress within a state)."""
    path: list[str] = []
    for state in states:
        if not path or path[-1] != state:
            path.append(state)
    return path


def machine_drawing(definition: dict[str, Any], states_visited: list[str], current: str) -> Drawing:
    depths = _depths(definition)
    columns: dict[int, list[str]] = {}
    for state in definition["states"]:
        columns.setdefault(depths[state], []).append(state)
    path = collapse(states_visited)
    visited = set(path)
    taken = set(zip(path, path[1:], strict=False))
    terminal = set(definition.get("terminal", []))
    nodes: dict[str, Node] = {}
    tallest = max((len(c) for c in columns.values()), default=1)
    for depth, names in sorted(columns.items()):
        # Centre short columns against the tallest so the drawing reads left to right.
        offset = (tallest - len(names)) * (NODE_H + ROW_GAP) // 2
        for row, name in enumerate(names):
            classes = ["node"]
            if name in visited:
                classes.append("visited")
            if name == current:
                classes.append("current")
            if name in terminal:
                classes.append("terminal")
            nodes[name] = Node(
                name,
                PAD + depth * (NODE_W + COL_GAP),
                PAD + offset + row * (NODE_H + ROW_GAP),
                classes,
            )
    edges = []
    for source, target in definition["transitions"]:
        a, b = nodes[source], nodes[target]
        edges.append(Edge(source, target, _edge_path(a, b), (source, target) in taken))
    # Taken edges last so they are drawn on top.
    edges.sort(key=lambda e: e.taken)
    width = PAD * 2 + (max(depths.values(), default=0) + 1) * (NODE_W + COL_GAP) - COL_GAP
    height = PAD * 2 + tallest * (NODE_H + ROW_GAP) - ROW_GAP + 40
    return Drawing(width, height, list(nodes.values()), edges, path, current)


def _edge_path(a: Node, b: Node) -> str:
    if b.x > a.x:
        x1, y1, x2, y2 = a.x + NODE_W, a.cy, b.x - 4, b.cy
        bend = (x2 - x1) // 2
        return f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"
    if b.x == a.x:
        # Same column: an arc on the right side.
        x = a.x + NODE_W
        return f"M{x},{a.cy} C{x + 40},{a.cy} {x + 40},{b.cy} {x + 4},{b.cy}"
    # Backwards: loop under the nodes so it does not cross the forward edges.
    x1, y1, x2, y2 = a.cx, a.y + NODE_H, b.cx, b.y + NODE_H + 4
    low = max(y1, y2) + 30
    return f"M{x1},{y1} C{x1},{low} {x2},{low} {x2},{y2}"
