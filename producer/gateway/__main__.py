"""`python -m inferq.producer.gateway [--host H] [--port P]` (same as `inferq gateway`)."""
import argparse
import sys

from inferq.producer.gateway.cli import add_arguments, run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferq.producer.gateway", description="Run the inferq HTTP gateway.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
