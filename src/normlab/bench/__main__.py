"""``python -m normlab.bench [options]``: the same as ``normlab bench``."""

import argparse
import sys

from . import HELP, add_arguments, main_bench

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m normlab.bench", description=HELP)
    add_arguments(parser)
    sys.exit(main_bench(parser.parse_args()))
