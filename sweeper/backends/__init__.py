"""Orchestration backends: they decide which trial runs next and which is stopped."""
