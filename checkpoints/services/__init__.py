"""The store's services: the checkpoint commit, artifacts, budgets, outbox, verify, keys."""
