"""A run's config: parsed from the command line, resolved and checked before anything is
scheduled. Imports no torch."""
