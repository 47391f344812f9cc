"""`python -m skewscope.cli ...` = the `skewscope` command."""
from skewscope.cli import main

main(prog_name="skewscope")
