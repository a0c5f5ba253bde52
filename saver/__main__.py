"""``python -m kvsaver``: the ``kvsaver`` command (``kvsaver.tools.cli``)."""

from kvsaver.tools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
