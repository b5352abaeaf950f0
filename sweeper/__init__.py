"""sweeper: plugin-based hyperparameter sweeps for PyTorch."""

__version__ = "0.1.0"
# The plugin contract's version (docs/plugins.md). Bumped on breaking changes; a plugin module
# declaring SWEEPER_PLUGIN_API without this number is refused.
PLUGIN_API_VERSION = 1
