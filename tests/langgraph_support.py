"""LangGraph graphs the saver's tests and the console's LangGraph tests both run."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from langgraph_store.saver import CairnSaver


class Log(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answer: str


def appender(name: str):  # noqa: ANN201
    def node(state: Log) -> Log:
        return {"log": [name]}

    return node


def linear_graph(saver: CairnSaver):  # noqa: ANN201
    builder = StateGraph(Log)
    for name in ("a", "b", "c"):
        builder.add_node(name, appender(name))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    return builder.compile(checkpointer=saver)


def ask(state: Log) -> Log:
    return {"answer": interrupt("May I?"), "log": ["asked"]}


def interrupt_graph(saver: CairnSaver):  # noqa: ANN201
    builder = StateGraph(Log)
    builder.add_node("a", appender("a"))
    builder.add_node("ask", ask)
    builder.add_edge(START, "a")
    builder.add_edge("a", "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=saver)


def config(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}
