"""The host side of the plugin contract (the contract itself, for plugin authors, is
sweeper/plugin.py): finding plugins through entry points, binding a spec's arguments to their
factories' signatures, and the search-space templates plugins ship.

Its modules, one line each: docs/architecture.md (Layout), which a test checks against the tree.
"""
