"""`python -m deploy`: the same as `tctune-deploy` (deploy/cli.py)."""

from deploy.cli import main

main()
