"""``python -m gdscp``: the gdscp command line."""

from gdscp.cli.main import main

if __name__ == "__main__":
    main()
