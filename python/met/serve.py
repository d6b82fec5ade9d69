"""`python -m met.serve [flags]`: the OpenAI-compatible server without the `met` CLI."""

import sys

from met.server.main import serve_main

if __name__ == "__main__":
    sys.exit(serve_main(sys.argv[1:]))
