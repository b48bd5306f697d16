"""Model providers: the `ChatModel` protocol and its implementations."""

from chatrun.models.base import ChatModel, ModelRequest, ModelResponse

__all__ = ["ChatModel", "ModelRequest", "ModelResponse", "make_model"]


def make_model(provider: str, **options):  # noqa: ANN003, ANN201
    """The model for a provider name: "openai" or "scripted"."""
    if provider == "openai":
        from chatrun.models.openai_model import OpenAIModel

        return OpenAIModel(**options)
    if provider == "scripted":
        from chatrun.models.scripted import ScriptedModel

        return ScriptedModel(**options)
    from chatrun.errors import ChatrunError

    raise ChatrunError(f"unknown model provider {provider!r}; use 'openai' or 'scripted'")
