"""sweeper: plugin-based hyperparameter sweeps for PyTorch."""

__version__ = "0.1.0"
# The plugin contract's version (docs in sweeper/plugin.py). Bumped on breaking changes.
PLUGIN_API_VERSION = 1
