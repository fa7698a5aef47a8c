"""hearth: a Python client of hearthd over its native protocol (msgpack frames on a Unix
socket, tokens through a shared-memory ring). Blocking: hearth.Client; asyncio:
hearth.AsyncClient. Only the standard library and python3-msgpack."""

from ._wire import HearthError, Token
from .aio import AsyncClient, AsyncGeneration
from .client import ChatDelta, Client, Embeddings, Generation, socket_path_default

__all__ = ["AsyncClient", "AsyncGeneration", "ChatDelta", "Client", "Embeddings", "Generation", "HearthError", "Token",
           "socket_path_default"]
__version__ = "0.1.0"
