"""Search spaces shipped with this package (`sweeper init --from spirals`)."""
