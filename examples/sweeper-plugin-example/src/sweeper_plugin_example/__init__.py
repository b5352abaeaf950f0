"""Example sweeper plugins. Kept import-free: sweeper imports each plugin module on demand."""
