"""`python -m evaluation run|compare|sweep` (see `evaluation.cli`)."""
import sys

from evaluation.cli import main

if __name__ == "__main__":  # vLLM's CPU engine starts subprocesses that re-import __main__
    sys.exit(main())
