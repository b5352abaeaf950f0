# The built-in search spaces, installed as the package sweeper_plugins.search_spaces so that
# `sweeper init --from digits` finds them in any install (see pyproject.toml).
