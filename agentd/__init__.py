"""agentd: the llmgw node agent. Plain asyncio, no Django import."""

__version__ = "0.1.0"
