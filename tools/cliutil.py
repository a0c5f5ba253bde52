"""What every command line of ``tools/`` shares: click command classes whose
``main`` returns an exit status, one-line error messages, ``Fail``, and
the arguments and options several commands take.

Exit status, for every program: 0 done; 2 a bad argument or a refusal, with
one line on stderr saying why (``error: ...``); other codes only where a
command documents them (``migrate``: 1 when verification finds a difference).

The programs run click with ``standalone_mode=False`` underneath, so the
status comes back as ``main``'s return value (``python -m kvsaver.tools.storage``,
the console script and ``python -m kvsaver`` all ``sys.exit`` it) and a usage
error is one line rather than click's usage block. psycopg_pool's warnings
(a line per failed connection attempt) are not shown: the error is.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click

__all__ = [
    "Command",
    "Fail",
    "Group",
    "encrypted_option",
    "encrypting",
    "full_option",
    "json_option",
    "store_argument",
]

# The arguments and options of the reading commands (``kvsaver`` and
# ``kvsaver store``).
store_argument = click.argument("store")
json_option = click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
full_option = click.option(
    "--full", is_flag=True, help="do not cut long lines to the terminal's width"
)
# ``--encrypted``: the serializer inside ``encrypting``'s EncryptedSerializer.
encrypted_option = click.option(
    "--encrypted",
    is_flag=True,
    help="values are encrypted (EncryptedSerializer; key from LANGGRAPH_AES_KEY)",
)


class Fail(click.ClickException):
    """A refusal or failure: ``error: <message>`` on stderr, exit status 2
    (or ``code``)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        # click declares exit_code a ClassVar, yet reads it from the instance.
        self.exit_code = code  # type: ignore[misc]

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def encrypting(serde: Any) -> Any:
    """``serde`` inside LangGraph's ``EncryptedSerializer`` (AES, the key from
    ``LANGGRAPH_AES_KEY``), for ``--encrypted``; pycryptodome is in the
    ``tools`` extra."""
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    try:
        return EncryptedSerializer.from_pycryptodome_aes(serde=serde)
    except ImportError:
        raise Fail("--encrypted needs pycryptodome: pip install 'kvsaver[tools]'") from None
    except ValueError as e:  # no key, or a key of the wrong length
        raise Fail(f"--encrypted: {e}") from None


def module_prog(spec: Any) -> str:
    """``python -m <module>`` for a program run as a module: the name it was
    run by (``kvsaver.tools.storage`` installed, ``tools.storage`` in a
    checkout), from its ``__spec__``."""
    return f"python -m {spec.name}"


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _run(main: Any, args: Any, prog_name: Any, standalone_mode: bool, extra: Any) -> int:
    # psycopg_pool logs each failed connection attempt as a warning; the
    # program reports the failure itself, in one line (a program may set its
    # logging, a library may not).
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    code: int
    try:
        rv = main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
        code = rv if isinstance(rv, int) else 0
    except Fail as e:
        e.show()
        code = e.exit_code
    except click.UsageError as e:
        hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
        click.echo(f"error: {_one_line(e.format_message())}{hint}", err=True)
        code = 2
    except click.ClickException as e:
        click.echo(f"error: {_one_line(e.format_message())}", err=True)
        code = 2
    except click.Abort:
        click.echo("aborted", err=True)
        code = 1
    except BrokenPipeError:
        # `kvsaver history ... | head`: the reader left; say nothing more.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        code = 0
    if standalone_mode:
        sys.exit(code)
    return code


class _ExitStatus:
    """``main`` handles errors as described above (a mixin before click's
    class, so ``super().main`` is click's)."""

    def main(  # type: ignore[no-untyped-def]
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> int:
        return _run(super().main, args, prog_name, standalone_mode, extra)  # type: ignore[misc]


class Group(_ExitStatus, click.Group):  # type: ignore[misc]  # main returns the status
    """A click group whose ``main`` handles errors as described above."""


class Command(_ExitStatus, click.Command):  # type: ignore[misc]  # main returns the status
    """A click command whose ``main`` handles errors as described above."""
