"""What the ``kvsaver`` commands print: decoded values as JSON data or one
line of text, and ``Out``, the lines cut to the terminal's width.

Shared by ``cli.py`` (checkpoints) and ``store_cli.py`` (KVStore items)."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import shutil
import sys
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timezone
from datetime import time as dtime
from typing import Any

import click
from langchain_core.messages import BaseMessage

from .sources import Unallowed

__all__ = ["Out", "emit_json", "is_messages", "jsonable", "text", "when"]


# -- values as JSON and as text ----------------------------------------------------


def _message(m: BaseMessage, human: bool) -> Any:
    if human:
        return f"{m.type}: {text(m.content)}"
    out: dict[str, Any] = {"type": m.type, "content": jsonable(m.content), "id": m.id}
    if m.name:
        out["name"] = m.name
    if getattr(m, "tool_calls", None):
        out["tool_calls"] = jsonable(m.tool_calls)  # type: ignore[attr-defined]
    if getattr(m, "tool_call_id", None):
        out["tool_call_id"] = m.tool_call_id  # type: ignore[attr-defined]
    return out


def jsonable(value: Any, human: bool = False) -> Any:
    """A decoded value as JSON data: a message as ``{"type", "content", "id",
    ...}``, a blocked class as ``{"unallowed_type", "data"}``, bytes as
    base64, dates as ISO text, other objects by their fields. ``human=True``:
    messages as ``"type: content"`` and blocked classes as
    ``"<unallowed type m.Class>"``, for the terminal."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Unallowed):
        if human:
            return repr(value)
        return {"unallowed_type": value.type_name, "data": jsonable(value.data)}
    if isinstance(value, BaseMessage):
        return _message(value, human)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, human) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, human) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v, human) for v in value), key=repr)
    if isinstance(value, (bytes, bytearray)):
        if human:
            return f"<{len(value):,} bytes>"
        return {"bytes_base64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, (datetime, date, dtime)):
        return value.isoformat()
    name = type(value).__name__
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"type": name, **jsonable(fields, human)}
    if callable(getattr(value, "model_dump", None)):  # pydantic
        return {"type": name, **jsonable(value.model_dump(), human)}
    if hasattr(value, "_asdict"):  # namedtuple
        return {"type": name, **jsonable(value._asdict(), human)}
    if name == "Send" and hasattr(value, "node"):
        return {"type": "Send", "node": value.node, "arg": jsonable(value.arg, human)}
    if hasattr(value, "__iter__") and type(value).__module__ == "collections":  # deque
        return [jsonable(v, human) for v in value]
    return str(value)  # UUID, Decimal, Path, ZoneInfo, ...


def text(value: Any) -> str:
    """One line of text for a value: strings as they are, the rest as JSON."""
    form = jsonable(value, human=True)
    if isinstance(form, str):
        return form.replace("\n", "\\n")
    return json.dumps(form, ensure_ascii=False, default=str)


def is_messages(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(m, BaseMessage) for m in value)
    )


def when(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds")


# -- output ------------------------------------------------------------------------


class Out:
    """Where lines go, cut to the terminal's width (on a terminal, without ``--full``)."""

    def __init__(self, full: bool) -> None:
        self.width: int | None = None
        if not full and sys.stdout.isatty():
            self.width = max(shutil.get_terminal_size().columns, 20)

    def line(self, text: str = "") -> None:
        if self.width is not None and len(text) > self.width:
            text = text[: self.width - 1] + "…"
        click.echo(text)

    def table(
        self, headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[str] = ()
    ) -> None:
        """Aligned columns; those whose header is in ``right`` are right-aligned."""
        cells = [[("" if c is None else str(c)) for c in row] for row in rows]
        widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

        def fmt(row: Sequence[str]) -> str:
            parts = []
            for i, cell in enumerate(row):
                last = i == len(row) - 1
                if headers[i] in right:
                    parts.append(cell.rjust(widths[i]))
                else:
                    parts.append(cell if last else cell.ljust(widths[i]))
            return "  ".join(parts).rstrip()

        self.line(fmt(list(headers)))
        for row in cells:
            self.line(fmt(row))


def emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
