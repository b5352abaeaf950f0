"""sweeper's built-in plugins, registered through the same entry-point groups as third parties'."""
