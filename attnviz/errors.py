"""Exceptions raised by attnviz. Every message says what to do next."""

from __future__ import annotations


class AttnvizError(Exception):
    """Base class: a problem the user can fix; the message says how."""


class ModelNotFound(AttnvizError):
    """The model id or path does not exist."""


class ModelNeedsNetwork(AttnvizError):
    """The model is not cached and the Hub cannot be reached (or offline mode is on)."""


class GatedModel(AttnvizError):
    """The model is gated and no (valid) token was given."""


class ModelHasNoAttention(AttnvizError):
    """The model has no softmax attention layers (e.g. Mamba, RWKV)."""


class UnsafeWeights(AttnvizError):
    """The model ships only pickle weights and loading them was not allowed."""


class InputTooLong(AttnvizError):
    """The text has more tokens than the allowed maximum."""


class TooManyPositions(InputTooLong):
    """The text has more tokens than the model has positions (a learned position table);
    ``limit`` is how many it reads, so a caller can offer the text's first ``limit`` tokens."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class EmptyInput(AttnvizError):
    """The text is empty or gives no tokens."""


class BadIndex(AttnvizError):
    """A layer or head index is out of range."""


class OutOfMemory(AttnvizError):
    """The model or the attention did not fit in memory."""


class NotAllowed(AttnvizError):
    """The request is not allowed in this server mode (e.g. local paths in demo mode)."""


class CannotWrite(AttnvizError):
    """A file or folder could not be written (disk full, read-only, no permission); the message
    names the folder and the space needed."""


class MixerNotShown(AttnvizError):
    """A block's token mixer that attnviz lists but cannot show (yet), with the reason."""


class MixerCheckFailed(AttnvizError):
    """A mixer's effective attention did not reproduce the kernel's own output: nothing is shown."""
