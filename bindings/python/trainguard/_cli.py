"""The `trainguard` console command: runs the C++ `trainguard` binary shipped in this package."""

import os
import sys


def binary_path():
    """The bundled binary (bin/trainguard beside this file), else $TG_CLI."""
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "trainguard")
    if os.access(bundled, os.X_OK):
        return bundled
    override = os.environ.get("TG_CLI")
    if override:
        return override
    raise FileNotFoundError(
        f"trainguard: the command's binary is missing ({bundled}); reinstall the package "
        "or set TG_CLI to a trainguard binary")


def main():
    path = binary_path()
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
