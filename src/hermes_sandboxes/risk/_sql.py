"""Database clients: destructive SQL (DROP, TRUNCATE, DELETE or UPDATE without WHERE) and MongoDB calls."""

from __future__ import annotations

import re

from hermes_sandboxes.risk._context import Context
from hermes_sandboxes.risk._shell import Call, option_values, positionals

_SQL_DROP = re.compile(
    r"\bDROP\s+(MATERIALIZED\s+VIEW|TABLE|DATABASE|SCHEMA|INDEX|VIEW|USER|ROLE|COLUMN|TRIGGER"
    r"|FUNCTION|PROCEDURE|SEQUENCE|TYPE|EXTENSION|OWNED|COLLECTION|KEYSPACE)\b"
)
_SQL_UPDATE = re.compile(r"\bUPDATE\s+\S+\s+SET\b")


def sql_reasons(sql: str) -> list[str]:
    """What is destructive in ``sql``: DROP, TRUNCATE, and DELETE or UPDATE without WHERE."""
    reasons = []
    text = re.sub(r"'(?:[^']|'')*'", "''", sql)  # string literals first: '--' in a string is no comment
    text = re.sub(r"--[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    for statement in (" ".join(s.split()) + " " for s in text.upper().split(";")):
        if match := _SQL_DROP.search(statement):
            reasons.append(f"SQL DROP {' '.join(match.group(1).split())}")
        if statement.startswith("TRUNCATE"):
            reasons.append("SQL TRUNCATE")
        if (delete := statement.find("DELETE FROM")) >= 0 and " WHERE " not in statement[delete:]:
            reasons.append("SQL DELETE without WHERE")
        if (update := _SQL_UPDATE.search(statement)) and " WHERE " not in statement[update.start() :]:
            reasons.append("SQL UPDATE without WHERE")
    return reasons


SQL_OPTIONS = {  # where each client takes its SQL on the command line
    **dict.fromkeys(("mysql", "mariadb"), frozenset({"-e", "--execute"})),
    "psql": frozenset({"-c", "--command"}),
    "sqlcmd": frozenset({"-Q", "-q"}),
    "clickhouse-client": frozenset({"-q", "--query"}),
    "sqlite3": frozenset({"-cmd"}),
    "duckdb": frozenset({"-c", "-cmd"}),
}
_MONGO_DANGER = re.compile(r"\.\s*(dropDatabase|drop|dropIndexes)\s*\(|\.\s*(deleteMany|remove)\s*\(\s*\{\s*\}\s*\)")


def check_database(call: Call, ctx: Context, _depth: int) -> None:
    heredocs = [doc.body for doc in call.cmd.stdin]
    if call.name in ("mongo", "mongosh"):
        for code in [*option_values(call.args, frozenset({"--eval"})), *heredocs]:
            if match := _MONGO_DANGER.search(code):
                ctx.add(f"MongoDB {match.group(1) or match.group(2)}")
        return
    statements = option_values(call.args, SQL_OPTIONS[call.name]) + heredocs
    if call.name in ("sqlite3", "duckdb"):  # sqlite3 app.db 'DELETE FROM users'
        values = frozenset({"-cmd", "-separator", "-nullvalue", "-newline", "-init"})
        statements += [w.text for w in positionals(call.args, values)[1:]]
    for reason in (r for sql in statements for r in sql_reasons(sql)):
        ctx.add(reason)

