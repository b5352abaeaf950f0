"""The host side of the plugin contract (the contract itself, for plugin authors, is
sweeper/plugin.py): finding plugins through entry points, binding a spec's arguments to their
factories' signatures, and the search-space templates plugins ship.

- registry.py   entry-point groups: list (imports nothing), get (imports one), names and hints
- binding.py    spec args -> factory signatures, checked before training; plugin provenance
- templates.py  `sweeper init --from NAME`: search spaces shipped by distributions
- base_point.py search.base_first: the first trial (the spec's values, plugin defaults, range centres)
"""
