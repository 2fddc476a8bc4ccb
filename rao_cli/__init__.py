"""The ``rao`` command line (typer). Each area registers its commands in its own module."""
