"""python -m kwker.serve [--model M] [options]: runs `kwker serve` (the C server) with the same
flags, replacing this process. The kwker binary is $KWKER_CLI, else the one shipped in the
package (kwker/bin/kwker), else the build tree's (build/kwker, build-asan/kwker)."""
import os
import sys
from pathlib import Path

_PKG = Path(__file__).resolve().parent.parent


def _candidates():
    env = os.environ.get("KWKER_CLI")
    if env:
        yield Path(env)
    yield _PKG / "bin" / "kwker"
    root = _PKG.parent.parent
    for build in ("build", "build-asan"):
        yield root / build / "kwker"


def find_cli():
    """Path of the kwker binary; raises FileNotFoundError naming every place tried."""
    tried = []
    for cand in _candidates():
        tried.append(str(cand))
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    raise FileNotFoundError("kwker binary not found (tried: %s); build it with scripts/build "
                            "or set KWKER_CLI" % ", ".join(tried))


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        cli = find_cli()
    except FileNotFoundError as e:
        print("python -m kwker.serve: %s" % e, file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cli, [cli, "serve"] + args)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
