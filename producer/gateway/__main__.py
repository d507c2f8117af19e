"""`python -m producer.gateway [--host H] [--port P]` (same as `inferq gateway`)."""
import sys

from producer.cli import main

if __name__ == "__main__":
    sys.exit(main(["gateway", *sys.argv[1:]]))
