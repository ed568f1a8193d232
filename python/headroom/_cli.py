"""The `headroom` console script: the Rust command line, run in this process."""

import sys

from headroom import _headroom


def main() -> int:
    """Runs `headroom` with this process's arguments and exits with its status."""
    sys.stdout.flush()
    code = _headroom.main(["headroom", *sys.argv[1:]])
    sys.exit(code)


if __name__ == "__main__":
    main()
