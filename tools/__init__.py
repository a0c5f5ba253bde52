"""Command-line programs built on saver/ and kv/, installed as ``kvsaver.tools``
(the ``kvsaver`` command is ``cli.py``)."""
