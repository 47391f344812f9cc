from skewscope.cli.gen import gen

if __name__ == "__main__":
    gen(prog_name="skewgen")
