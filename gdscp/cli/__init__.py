"""The ``gdscp`` command line (Typer and Rich). Entry point: ``gdscp.cli.main:main``."""
