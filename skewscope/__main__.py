"""`python -m skewscope ...` = the `skewscope` command."""
from skewscope.cli import main

main(prog_name="skewscope")
