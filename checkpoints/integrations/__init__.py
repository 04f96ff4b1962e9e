"""Adapters that let other agent frameworks checkpoint into Cairn.

Each integration imports its framework only inside its own module (``langgraph.py``), so the
core never needs the framework installed; their storage lives in separate Django apps.
"""
