"""Storage for the LangGraph saver: threads, LangGraph checkpoints, channel values, writes.

This app never imports LangGraph: it stores what the saver has already serialized, sealed
with Cairn's encryption, and records every put as a Cairn checkpoint of the thread's run.
"""
