"""Model providers: the `ChatModel` protocol, its implementations, and the pool that finds them."""

from chatrun.models.base import ChatModel, ModelRequest, ModelResponse
from chatrun.models.pool import ModelPool, PooledModel, make_model

__all__ = ["ChatModel", "ModelPool", "ModelRequest", "ModelResponse", "PooledModel", "make_model"]
