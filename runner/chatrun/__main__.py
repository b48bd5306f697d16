"""`python -m chatrun` is `chatrun`."""

from chatrun.cli import main

main()
