"""`python -m skewscope.gen ...`: the generator alone (the same command as `skewscope gen`)."""
from skewscope.cli.gen import gen

if __name__ == "__main__":
    gen(prog_name="skewgen")
