"""Domain errors of psa-edge: one small hierarchy that library code raises.

The CLI maps every `PsaEdgeError` to a one-line message on stderr and exit code 2
(`EXIT_BAD_INPUT`); nothing else is caught there, so a real bug still shows its traceback.
"""

EXIT_BAD_INPUT = 2


class PsaEdgeError(Exception):
    """Base of every error psa-edge raises on bad input or unusable files."""


class ConfigError(PsaEdgeError):
    """Unknown preset or variant, or a gamma that contradicts the variant."""


class TaskError(PsaEdgeError):
    """Unknown task, or task parameters that cannot describe a data set."""


class CheckpointError(PsaEdgeError):
    """Missing, unreadable, corrupt or foreign checkpoint file."""


class OutputError(PsaEdgeError):
    """An output path that cannot be written."""


class ArtifactError(PsaEdgeError):
    """Missing or unloadable artifact, or a manifest that does not match it."""


class ExportError(PsaEdgeError):
    """An export that cannot be done as asked, or whose parity check failed."""


class SequenceError(PsaEdgeError):
    """A token id outside the vocabulary or a sequence longer than the artifact allows."""


class TokenizerError(PsaEdgeError):
    """A tokenizer that cannot be read or built as asked."""


class CorpusError(PsaEdgeError):
    """Text to train on that is missing, empty, binary, or not the corpus a model recorded."""
