"""The MCP server: the sandboxes, their commands and their checkpoint story as tools for any agent
that speaks the Model Context Protocol (Claude Code, Codex CLI, Gemini CLI, opencode, IDE agents).

``hermes-sandboxes mcp`` runs it (see docs/mcp.md). Modules: ``protocol`` (JSON-RPC sessions),
``tools`` and ``schema`` (tool definitions and argument checks), ``scope`` (which sandboxes, through
the recorder), ``sandboxes``, ``commands``, ``files``, ``story`` (the tools), ``output`` (bounded
output), ``server`` (assembly), ``stdio`` and ``http`` (transports).
"""
