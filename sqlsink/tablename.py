"""A schema-qualified table name: a pure value type with its parser, rendered quoted."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql


@dataclass(frozen=True)
class TableName:
    """A schema-qualified table name; rendered quoted, never interpolated raw."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str, default_schema: str = "public") -> TableName:
        """'public.events', 'events' or '"My Schema"."My Table"' (quotes keep case and dots);
        an unqualified name is in ``default_schema``."""
        parts: list[str] = []
        current, quoted, i = "", False, 0
        while i < len(text):
            ch = text[i]
            if quoted:
                if ch == '"' and text[i + 1 : i + 2] == '"':
                    current += '"'
                    i += 1
                elif ch == '"':
                    quoted = False
                else:
                    current += ch
            elif ch == '"':
                quoted = True
            elif ch == ".":
                parts.append(current)
                current = ""
            else:
                current += ch.lower()
            i += 1
        parts.append(current)
        if quoted or len(parts) > 2 or any(not part for part in parts):
            raise ValueError(
                f"invalid table name {text!r}: use 'table', 'schema.table' or "
                '\'"Schema"."Table"\' for names with capitals, dots or quotes'
            )
        return cls(default_schema, parts[0]) if len(parts) == 1 else cls(parts[0], parts[1])

    def identifier(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"
