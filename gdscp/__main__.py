"""``python -m gdscp``: the gdscp command line."""

from gdscp.cli.app import main

if __name__ == "__main__":
    main()
