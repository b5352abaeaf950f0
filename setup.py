"""Which packages the wheel holds, found rather than listed: every package under sweeper/ (a new
subpackage cannot be left out of the installed package, as sweeper.review once was), and the
built-in plugins, installed as sweeper_plugins from plugins/ (their search spaces from
search_spaces/). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["sweeper", "sweeper.*"]), "sweeper_plugins", "sweeper_plugins.search_spaces"],
    package_dir={"sweeper_plugins": "plugins", "sweeper_plugins.search_spaces": "search_spaces"},
)
